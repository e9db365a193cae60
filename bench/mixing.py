"""Mixing benchmark: two sources mixed 70/30 and shuffled by window, read by one rank, four
ways in one run, on the same samples:

(a) Lakestream, one stream in log order (the same loader without mixing or shuffling);
(b) Lakestream, ``StreamDataset([Source(a, 224), Source(b, 96)], shuffle_window=16)``;
(c) MosaicML Streaming, two streams with proportions 0.7/0.3 (stratified batches, so every
    batch holds 224 + 96 as in (b)) and its default shuffle;
(d) a colocated map-style Dataset over the same Parquet files, with a sampler that takes 224
    + 96 samples per batch from per-source windows of 16 batches, each window permuted, and
    every decoded file kept in memory.

All at ``num_workers=0`` (so that the process's CPU time is the loader's), all producing the
same padded tensors, over 320 steps (~1.7 GB of samples per pass: 20 windows, so that a
window's first step and a loader's start-up are not what is measured). Three interleaved
repetitions; each ratio is the median of the per-repetition ratios with its min-max, and
CPU-s per GB read stands beside MB/s.

Usage: bench/setup-env && .venv-bench/bin/python -m bench.mixing [--reps 3]
Writes bench/results/mixing.json and bench/results/mixing.png.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

import lakestream
from bench import loader, payload  # (loader's stubs let MosaicML Streaming import here)
from bench.output import RESULTS, command, save
from bench.reps import drain, plot_bars, spread, summarise
from lakestream.loaders import Source, StreamDataset

G, FRAGMENT = 16, 64
TAKE_A, TAKE_B = 224, 96  # 70/30 of a step of 320, whole groups of 16
STEPS, WINDOW = 320, 16  # 20 windows; each Lakestream pass lasts 3 s or more


def _build(root: str) -> tuple[lakestream.Stream, lakestream.Stream, lakestream.Stream]:
    """Sources a and b, and one stream ``plain`` holding the same samples (a's, then b's)."""
    a = lakestream.create(f"{root}/a", payload.ROLLOUT_SCHEMA, global_batch_size=TAKE_A,
                          group_size=G)
    b = lakestream.create(f"{root}/b", payload.ROLLOUT_SCHEMA, global_batch_size=TAKE_B,
                          group_size=G)
    plain = lakestream.create(f"{root}/plain", payload.ROLLOUT_SCHEMA,
                              global_batch_size=TAKE_A + TAKE_B, group_size=G)
    seed = 0
    for stream, take in ((a, TAKE_A), (b, TAKE_B)):
        for _ in range(STEPS * take // FRAGMENT):
            t = payload.rollouts(FRAGMENT, G, seed=seed, first_prompt=seed * FRAGMENT // G)
            stream.append(t)
            plain.append(t)
            seed += 1
        stream.seal()
    plain.seal()
    return a, b, plain


def _mds(root: str, name: str, stream: lakestream.Stream) -> str:
    from streaming import MDSWriter

    out = f"{root}/mds-{name}"
    columns = {"prompt_id": "int64", "tokens": "ndarray:int32", "logprobs": "ndarray:float32",
               "reward": "float32", "policy_version": "int64"}
    with MDSWriter(out=out, columns=columns, size_limit=1 << 26) as w:
        t = stream.read_offsets([(0, stream.num_samples)])
        toks, lps = (loader.split_lists(t.column(c)) for c in ("tokens", "logprobs"))
        ids, rewards, versions = (t.column(c).to_numpy() for c in
                                  ("prompt_id", "reward", "policy_version"))
        for k in range(t.num_rows):
            w.write({"prompt_id": int(ids[k]), "tokens": toks[k], "logprobs": lps[k],
                     "reward": float(rewards[k]), "policy_version": int(versions[k])})
    return out


class MixedParquet(torch.utils.data.Dataset[dict[str, Any]]):
    """The colocated baseline: samples of several sources' Parquet files by global index
    (source a's first, then b's), every decoded file kept."""

    def __init__(self, files: list[tuple[str, int]]) -> None:
        self.files = files
        self.starts = np.cumsum([0] + [n for _, n in files])
        self._decoded: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> dict[str, Any]:
        f = int(np.searchsorted(self.starts, i, side="right") - 1)
        cols = self._decoded.get(f)
        if cols is None:
            t = pq.read_table(self.files[f][0])
            cols = {"prompt_id": t.column("prompt_id").to_numpy(),
                    "reward": t.column("reward").to_numpy(),
                    "policy_version": t.column("policy_version").to_numpy(),
                    "tokens": loader.split_lists(t.column("tokens")),
                    "logprobs": loader.split_lists(t.column("logprobs"))}
            self._decoded[f] = cols
        row = i - int(self.starts[f])
        return {k: v[row] for k, v in cols.items()}


def window_batches(sizes: list[int], takes: list[int], seed: int) -> list[list[int]]:
    """Batches of ``takes[j]`` indices from each source j (global indices, sources in order),
    each source's windows of ``WINDOW`` batches permuted by groups of G."""
    batches: list[list[int]] = [[] for _ in range(STEPS)]
    base = 0
    rng = np.random.default_rng(seed)
    for size, take in zip(sizes, takes, strict=True):
        for w0 in range(0, STEPS, WINDOW):
            steps = min(WINDOW, STEPS - w0)
            groups = rng.permutation(steps * take // G)
            order = (groups[:, None] * G + np.arange(G)).ravel() + base + w0 * take
            for k in range(steps):
                batches[w0 + k].extend(order[k * take:(k + 1) * take].tolist())
        base += size
    return batches


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from streaming import Stream as MosaicStream
    from streaming import StreamingDataset

    result: dict[str, Any] = {"command": command("mixing"),
                              "takes": [TAKE_A, TAKE_B], "steps": STEPS,
                              "shuffle_window": WINDOW, "num_workers": 0, "runs": []}
    with tempfile.TemporaryDirectory() as root:
        a, b, plain = _build(root)
        sample_bytes = payload.rollouts(256, G, seed=99).nbytes / 256
        files = [(f"{s.uri}/{f.path}", f.rows) for s in (a, b)
                 for f in s.state.all_fragments()]
        mds_a, mds_b = _mds(root, "a", a), _mds(root, "b", b)
        batch = TAKE_A + TAKE_B

        def mosaic(rep: int) -> Any:
            ds = StreamingDataset(
                streams=[MosaicStream(local=mds_a, proportion=0.7),
                         MosaicStream(local=mds_b, proportion=0.3)],
                batch_size=batch, shuffle=True, shuffle_seed=rep, epoch_size=STEPS * batch,
                batching_method="stratified")
            return torch.utils.data.DataLoader(ds, batch_size=batch,
                                               collate_fn=loader.collate_samples)

        runs = {
            "lakestream-plain": lambda rep: StreamDataset(
                plain.uri, group=None, rank=0, world_size=1, progress_interval_s=0),
            "lakestream-mix": lambda rep: StreamDataset(
                [Source(a.uri, TAKE_A), Source(b.uri, TAKE_B)], group=None, rank=0,
                world_size=1, shuffle_window=WINDOW, seed=rep, progress_interval_s=0),
            "mosaic-streaming": mosaic,
            "colocated-mix": lambda rep: torch.utils.data.DataLoader(
                MixedParquet(files), collate_fn=loader.collate_samples,
                batch_sampler=window_batches([a.num_samples, b.num_samples],
                                             [TAKE_A, TAKE_B], rep)),
        }
        for rep in range(args.reps):
            for name, make in runs.items():
                r = drain(make(rep), sample_bytes)
                r.update(system=name, rep=rep)
                result["runs"].append(r)
                print(f"rep {rep} {name:17} {r['mb_per_s']:7.1f} MB/s "
                      f"{r['cpu_s_per_gb']:5.2f} CPU-s/GB", flush=True)
    rows = summarise(result["runs"], lambda r: r["system"])
    result["systems"] = [{k: v for k, v in row.items() if k != "reps"} for row in rows]

    def ratio(x: str, y: str) -> dict[str, float]:
        by = {(r["system"], r["rep"]): r["samples_per_s"] for r in result["runs"]}
        return spread([by[(x, k)] / by[(y, k)] for k in range(args.reps)])

    result["ratios"] = {"mix_vs_plain": ratio("lakestream-mix", "lakestream-plain"),
                        "mix_vs_mosaic": ratio("lakestream-mix", "mosaic-streaming"),
                        "mix_vs_colocated": ratio("lakestream-mix", "colocated-mix")}
    print("ratios (median, min-max):", json.dumps(result["ratios"]))
    save("mixing.json", result)
    plot(result, RESULTS / "mixing.png")


def plot(result: dict[str, Any], path: Path) -> None:
    plot_bars(result["systems"], path, "70/30 mix, shuffle window 16 steps, num_workers=0")


if __name__ == "__main__":
    main()
