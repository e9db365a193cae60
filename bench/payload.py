"""The payload every benchmark shares: RL rollouts, and packed pretraining sequences.

Rollouts: GRPO groups of ``group_size`` responses to one prompt, 1,024-3,072 ``int32`` tokens
each (about 16 KB per sample with the ``float32`` behaviour log-probs of the same length),
a reward, the policy version that generated them and the prompt id. Pretraining: fixed
4,096-token packed sequences. Tokens are uniform over the vocabulary by default (the
worst case for compression); ``tokens="zipf"`` draws them by a Zipf law (frequency of the
k-th most common token proportional to 1/k^1.1, with the most common tokens the lowest ids,
as in byte-pair vocabularies), which is how tokenised text is distributed. Log-probs are
random either way (they barely compress).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

ROLLOUT_SCHEMA = pa.schema([
    ("prompt_id", pa.int64()),
    ("tokens", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),
    ("reward", pa.float32()),
    ("policy_version", pa.int64()),
])
PRETRAIN_SCHEMA = pa.schema([("doc_id", pa.int64()), ("tokens", pa.list_(pa.int32()))])
VOCAB = 50_000


def _lists(values: np.ndarray, lengths: np.ndarray, t: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=t))


ZIPF_EXPONENT = 1.1
_ZIPF_CDF = np.cumsum(1.0 / np.arange(1, VOCAB + 1) ** ZIPF_EXPONENT)
_ZIPF_CDF /= _ZIPF_CDF[-1]
TOKENS = ("random", "zipf")


def token_ids(rng: np.random.Generator, n: int, kind: str = "random") -> np.ndarray:
    """``n`` token ids: uniform (``random``) or Zipf-distributed (``zipf``)."""
    if kind == "random":
        return rng.integers(0, VOCAB, size=n, dtype=np.int32)
    if kind == "zipf":
        return np.searchsorted(_ZIPF_CDF, rng.random(n)).astype(np.int32)
    raise ValueError(f"tokens must be one of {TOKENS}, got {kind!r}")


def rollouts(n: int, group_size: int = 16, *, seed: int = 0, first_prompt: int = 0,
             min_tokens: int = 1024, max_tokens: int = 3072, policy_version: int = 0,
             tokens: str = "random") -> pa.Table:
    """``n`` rollout samples (``n % group_size == 0``), deterministic in ``seed``."""
    if n % group_size:
        raise ValueError(f"n={n} is not a multiple of group_size={group_size}")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_tokens, max_tokens + 1, size=n)
    total = int(lengths.sum())
    ids = token_ids(rng, total, tokens)
    logprobs = -rng.exponential(1.0, size=total).astype(np.float32)
    return pa.table({
        "prompt_id": pa.array(first_prompt + np.arange(n) // group_size, pa.int64()),
        "tokens": _lists(ids, lengths, pa.int32()),
        "logprobs": _lists(logprobs, lengths, pa.float32()),
        "reward": pa.array(rng.random(n, dtype=np.float32)),
        "policy_version": pa.array(np.full(n, policy_version), pa.int64()),
    }, schema=ROLLOUT_SCHEMA)


def pretrain(n: int, *, seed: int = 0, seq_len: int = 4096, first_doc: int = 0,
             tokens: str = "random") -> pa.Table:
    """``n`` packed sequences of ``seq_len`` tokens."""
    rng = np.random.default_rng(seed)
    ids = token_ids(rng, n * seq_len, tokens)
    return pa.table({
        "doc_id": pa.array(first_doc + np.arange(n), pa.int64()),
        "tokens": _lists(ids, np.full(n, seq_len), pa.int32()),
    }, schema=PRETRAIN_SCHEMA)
