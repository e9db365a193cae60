"""A rollout worker: GRPO groups of synthetic responses, stamped with the policy version.
It generates until its prompts run out or the job says training is over."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pyarrow as pa

from lakestream.producers import Producer, ProducerOptions

G = 4
VOCAB = 512
SCHEMA = pa.schema([
    ("prompt_id", pa.int64()),
    ("response", pa.int32()),
    ("tokens", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("logprobs", pa.list_(pa.float32())),
    ("reward", pa.float32()),
    ("policy_version", pa.int64()),
])


def generate(prompt: int, policy_version: int, seconds_per_token: float) -> pa.Table:
    """G responses to ``prompt``; generating them takes time that grows with their length."""
    rng = np.random.default_rng(prompt)
    lengths = rng.integers(8, 96, size=G)
    time.sleep(float(lengths.max()) * seconds_per_token)
    tokens = [rng.integers(0, VOCAB, n).astype(np.int32) for n in lengths]
    prompt_len = 4
    return pa.table({
        "prompt_id": pa.array([prompt] * G, pa.int64()),
        "response": pa.array(np.arange(G), pa.int32()),
        "tokens": pa.array(tokens, pa.list_(pa.int32())),
        "loss_mask": pa.array([(np.arange(n) >= prompt_len).astype(np.int8) for n in lengths],
                              pa.list_(pa.int8())),
        "logprobs": pa.array([-rng.exponential(6.0, n).astype(np.float32) for n in lengths],
                             pa.list_(pa.float32())),
        # Pass or fail, as a verifier would score it: one group in eight has no signal.
        "reward": pa.array([float(t.sum() % 2 == 0) for t in tokens], pa.float32()),
        "policy_version": pa.array([policy_version] * G, pa.int64()),
    }, schema=SCHEMA)


def varied_rewards(group: pa.Table) -> bool:
    """DAPO's dynamic sampling: a group whose rewards are all equal has no advantage to
    learn from, so the trainer skips it (``StreamDataset(accept=...)``)."""
    rewards = group.column("reward").to_pylist()
    return min(rewards) != max(rewards)


def main() -> None:
    uri, index, workers, prompts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        int(sys.argv[4])
    max_lag, stats_path, done = int(sys.argv[5]), sys.argv[6], sys.argv[7]
    # RL writers want freshness: cap the DAC wait between commits well below a step's time.
    options = ProducerOptions(max_interval_s=0.1)
    with Producer(uri, f"rollout-{index}", max_lag_steps=max_lag, options=options) as p:
        cursor = p.state["cursor"] if p.state else 0  # resume from the committed cursor
        t0 = time.time()
        written = 0
        while cursor < prompts and not os.path.exists(done):
            if not p.wait_for_lag(timeout=0.5):  # admit a generation within the bound
                continue
            table = generate(cursor * workers + index, p.policy_version, 2e-4)
            p.write(table, state={"cursor": cursor + 1})
            written += table.nbytes
            cursor += 1
        p.flush()
        s = p.stats
        with open(stats_path, "a") as f:
            f.write(json.dumps({"producer": index, "rows": s.rows, "bytes": written,
                                "seconds": time.time() - t0, "commits": s.commits,
                                "conflicts": s.conflicts, "attempts": s.attempts,
                                "fragments": s.fragments_committed,
                                "lag_wait_s": s.lag_wait_s}) + "\n")


if __name__ == "__main__":
    main()
