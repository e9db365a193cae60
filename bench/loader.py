"""Loader benchmark: one trainer rank reading the same RL samples three ways, in one run.

(a) Lakestream ``StreamDataset`` (prefetching reader threads), through a DataLoader;
(b) a colocated map-style Dataset reading and decoding the same Parquet files;
(c) MosaicML Streaming over the same samples written with ``MDSWriter``;
each with ``num_workers`` 0 and 2, all producing the same padded tensors per global batch;
then Lakestream's step read latency on the local store and on a SeaweedFS S3 server.

Usage: bench/setup-env && .venv-bench/bin/python bench/loader.py [--samples 16384]
Writes bench/results/loader.json and bench/results/loader.png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# MosaicML Streaming imports its vision and multimodal modules eagerly, and they need a
# torchvision that cannot load beside the CPU build of torch here; this benchmark uses
# neither, so they are stubbed.
for _name in ("streaming.vision", "streaming.multimodal"):
    sys.modules.setdefault(_name, types.ModuleType(_name))

import payload  # noqa: E402

import lakestream  # noqa: E402
from lakestream.loaders import StreamDataset, StreamLoader  # noqa: E402

RESULTS = Path(__file__).parent / "results"
B, G, FRAGMENT = 256, 16, 64
COLUMNS = ["prompt_id", "tokens", "logprobs", "reward", "policy_version"]


def _pad(arrays: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = np.array([len(a) for a in arrays])
    out = np.zeros((len(arrays), int(lengths.max())), dtype=arrays[0].dtype)
    for i, a in enumerate(arrays):
        out[i, : len(a)] = a
    return torch.from_numpy(out), torch.from_numpy(lengths)


def collate_samples(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The same padded batch StreamDataset yields, from per-sample dicts."""
    tokens, tokens_lengths = _pad([s["tokens"] for s in samples])
    logprobs, logprobs_lengths = _pad([s["logprobs"] for s in samples])
    return {
        "prompt_id": torch.tensor([int(s["prompt_id"]) for s in samples]),
        "tokens": tokens, "tokens_lengths": tokens_lengths,
        "logprobs": logprobs, "logprobs_lengths": logprobs_lengths,
        "reward": torch.tensor([float(s["reward"]) for s in samples]),
        "policy_version": torch.tensor([int(s["policy_version"]) for s in samples]),
    }


class ParquetSamples(torch.utils.data.Dataset[dict[str, Any]]):
    """The colocated baseline: a map-style Dataset over Parquet files, decoding a file once
    per worker and serving its rows (sequential access, as a non-shuffled epoch reads)."""

    def __init__(self, files: list[tuple[str, int]]) -> None:
        self.files = files
        self.starts = np.cumsum([0] + [n for _, n in files])
        self._cached: tuple[int, dict[str, Any]] | None = None

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> dict[str, Any]:
        f = int(np.searchsorted(self.starts, i, side="right") - 1)
        if self._cached is None or self._cached[0] != f:
            t = pq.read_table(self.files[f][0])
            cols = {
                "prompt_id": t.column("prompt_id").to_numpy(),
                "reward": t.column("reward").to_numpy(),
                "policy_version": t.column("policy_version").to_numpy(),
                "tokens": _split(t.column("tokens")),
                "logprobs": _split(t.column("logprobs")),
            }
            self._cached = (f, cols)
        row = i - int(self.starts[f])
        return {k: v[row] for k, v in self._cached[1].items()}


def _split(col: Any) -> list[np.ndarray]:
    arr = col.combine_chunks()
    values = arr.values.to_numpy()
    offsets = arr.offsets.to_numpy()
    return [values[offsets[k]:offsets[k + 1]] for k in range(len(arr))]


def _drain(loader: Any, sample_bytes: float) -> dict[str, float]:
    """Steady-state throughput: timed from the first batch (worker start-up excluded)."""
    t_start = time.perf_counter()
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    samples = steps = 0
    for batch in it:
        samples += int(batch["tokens"].shape[0])
        steps += 1
    dt = time.perf_counter() - t0
    return {"samples_per_s": samples / dt, "mb_per_s": samples * sample_bytes / dt / 1e6,
            "steps": steps + 1, "seconds": dt, "first_batch_s": t0 - t_start}


def build(root: str, samples: int, options: dict[str, str] | None = None,
          uri: str | None = None) -> lakestream.Stream:
    uri = uri or f"{root}/stream"
    s = lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=B, group_size=G,
                          storage_options=options)
    for k in range(samples // FRAGMENT):
        s.append(payload.rollouts(FRAGMENT, G, seed=k, first_prompt=k * FRAGMENT // G))
    return s


def mosaic(root: str, stream: lakestream.Stream) -> str:
    from streaming import MDSWriter

    out = f"{root}/mds"
    columns = {"prompt_id": "int64", "tokens": "ndarray:int32", "logprobs": "ndarray:float32",
               "reward": "float32", "policy_version": "int64"}
    with MDSWriter(out=out, columns=columns, size_limit=1 << 26) as w:
        for step in range(stream.num_steps):
            t = stream.read_step(step)
            toks, lps = _split(t.column("tokens")), _split(t.column("logprobs"))
            for k in range(t.num_rows):
                w.write({"prompt_id": int(t.column("prompt_id")[k].as_py()), "tokens": toks[k],
                         "logprobs": lps[k], "reward": float(t.column("reward")[k].as_py()),
                         "policy_version": int(t.column("policy_version")[k].as_py())})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=16384)
    args = parser.parse_args()
    from streaming import StreamingDataset

    # Tensors cross from workers through files rather than one descriptor each: on 2 cores
    # the default caps every loader with workers near 80 MB/s. Same setting for all three.
    torch.multiprocessing.set_sharing_strategy("file_system")

    result: dict[str, Any] = {"command": " ".join(["bench/loader.py", *sys.argv[1:]]),
                              "samples": args.samples, "global_batch_size": B, "runs": []}
    with tempfile.TemporaryDirectory() as root:
        s = build(root, args.samples)
        sample_bytes = payload.rollouts(256, G, seed=99).nbytes / 256
        files = [(f"{s.uri}/{f.path}", f.rows) for f in s.state.all_fragments()]
        mds = mosaic(root, s)
        for workers in (0, 2):
            kw: dict[str, Any] = {"num_workers": workers}
            if workers:
                kw.update(multiprocessing_context="spawn", persistent_workers=False)
            runs = {
                "lakestream": lambda kw=kw: StreamLoader(
                    StreamDataset(s.uri, group=None, rank=0, world_size=1, max_steps=s.num_steps,
                                  progress_interval_s=0), **kw),
                "colocated-parquet": lambda kw=kw: torch.utils.data.DataLoader(
                    ParquetSamples(files), batch_size=B, collate_fn=collate_samples, **kw),
                "mosaic-streaming": lambda kw=kw: torch.utils.data.DataLoader(
                    StreamingDataset(local=mds, batch_size=B, shuffle=False),
                    batch_size=B, collate_fn=collate_samples, **kw),
            }
            for name, make in runs.items():
                r = _drain(make(), sample_bytes)
                r.update(system=name, num_workers=workers)
                result["runs"].append(r)
                print(f"{name:18} workers={workers}  {r['samples_per_s']:8.0f} samples/s "
                      f"{r['mb_per_s']:7.1f} MB/s", flush=True)
        result["latency"] = {"local": _latency(s)}
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.s3server import start_s3

        server = start_s3("bench-loader")
        try:
            remote = build(root, min(args.samples, 2048), server.options(),
                           uri="s3://bench-loader/stream")
            result["latency"]["s3"] = _latency(remote)
        finally:
            server.stop()
    ratios = {}
    for w in (0, 2):
        get = {r["system"]: r["samples_per_s"] for r in result["runs"] if r["num_workers"] == w}
        ratios[f"workers={w}"] = {"vs_colocated": get["lakestream"] / get["colocated-parquet"],
                                  "vs_mosaic": get["lakestream"] / get["mosaic-streaming"]}
    result["ratios"] = ratios
    print("lakestream ratios:", json.dumps(ratios))
    print("step read latency (ms):", json.dumps(result["latency"]))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "loader.json").write_text(json.dumps(result, indent=1))
    plot(result, RESULTS / "loader.png")


def _latency(stream: lakestream.Stream) -> dict[str, float]:
    """Rank 0 of 2 reading every step: ms from asking for a visible step to its slice."""
    ds = StreamDataset(stream.uri, group=None, rank=0, world_size=2, max_steps=stream.num_steps,
                       storage_options=stream.storage_options, prefetch=0,
                       progress_interval_s=0)
    for _ in ds:
        pass
    assert ds.last_reader is not None
    lat = sorted(ds.last_reader.read_latencies_s)
    return {"p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))],
            "steps": len(lat)}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = ["lakestream", "colocated-parquet", "mosaic-streaming"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.38
    for k, w in enumerate((0, 2)):
        vals = [next(r["mb_per_s"] for r in result["runs"]
                     if r["system"] == name and r["num_workers"] == w) for name in systems]
        ax.bar(np.arange(3) + (k - 0.5) * width, vals, width, label=f"num_workers={w}")
    ax.set_xticks(np.arange(3), systems)
    ax.set_ylabel("MB/s decoded into padded tensors (one rank)")
    ax.set_title("Reading the same RL samples, 2-core machine")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
