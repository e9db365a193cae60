"""Loader benchmark: one trainer rank reading the same RL samples four ways, in one run.

(a) Lakestream ``StreamDataset`` (prefetching reader threads), through ``StreamLoader``;
(b) ``colocated-samples``: a map-style Dataset over the same Parquet fragments, one sample
    per ``__getitem__`` (each file decoded once per worker), batched by the DataLoader: the
    common PyTorch pattern;
(c) ``colocated-batches``: one Parquet file per global batch, read whole and padded with
    vectorised numpy, one batch per ``__getitem__``;
(d) MosaicML Streaming over the same samples written with ``MDSWriter``;
each with ``num_workers`` 0 and 2, all producing the same padded tensors per global batch,
in interleaved repetitions (every configuration of repetition r before any of r + 1), with
torch's default sharing strategy. Each measurement is steady state, from the batch by which
every worker has started to the last: MB/s of Arrow sample bytes,
and CPU-s per GB over the trainer process and its worker processes (read from /proc between
the same two batches, so worker start-up is excluded). Lakestream also runs with
``collate="packed"``, and on a SeaweedFS S3 server; its read amplification (bytes fetched
from the store per byte stored of the samples delivered) is counted on both.

Usage: bench/setup-env && .venv-bench/bin/python -m bench.loader [--samples 65536] [--reps 3]
Writes bench/results/loader.json and bench/results/loader.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

import lakestream
from bench import payload
from bench.output import RESULTS, ROOT, command, save
from bench.reps import median, spread, summarise
from lakestream.loaders import StreamDataset, StreamLoader
from lakestream.store import Request, add_request_hook

# MosaicML Streaming imports its vision and multimodal modules eagerly, and they need a
# torchvision that cannot load beside the CPU build of torch here; this benchmark uses
# neither, so they are stubbed (before ``streaming`` is first imported, in the functions
# that use it).
for _name in ("streaming.vision", "streaming.multimodal"):
    sys.modules.setdefault(_name, types.ModuleType(_name))

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
                "tokens": split_lists(t.column("tokens")),
                "logprobs": split_lists(t.column("logprobs")),
            }
            self._cached = (f, cols)
        row = i - int(self.starts[f])
        return {k: v[row] for k, v in self._cached[1].items()}


def split_lists(col: Any) -> list[np.ndarray]:
    """Each row of a list column (``tokens``, ``logprobs``) as a numpy view of its values."""
    arr = col.combine_chunks()
    values = arr.values.to_numpy()
    offsets = arr.offsets.to_numpy()
    return [values[offsets[k]:offsets[k + 1]] for k in range(len(arr))]


class BatchFiles(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """The second colocated baseline: one Parquet file per global batch, read whole and
    padded with vectorised numpy."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        t = pq.read_table(self.paths[i])
        out: dict[str, torch.Tensor] = {}
        for name in ("tokens", "logprobs"):
            arr = t.column(name).combine_chunks()
            offsets = arr.offsets.to_numpy()
            values = arr.values.to_numpy()[offsets[0]:offsets[-1]]
            lengths = np.diff(offsets)
            width = int(lengths.max())
            padded = np.zeros((len(lengths), width), dtype=values.dtype)
            padded[np.arange(width)[None, :] < lengths[:, None]] = values
            out[name] = torch.from_numpy(padded)
            out[f"{name}_lengths"] = torch.from_numpy(lengths.astype(np.int64))
        for name in ("prompt_id", "reward", "policy_version"):
            out[name] = torch.from_numpy(t.column(name).to_numpy().copy())
        return out


def children() -> list[int]:
    """This process's child processes (DataLoader workers, a resource tracker)."""
    me = str(os.getpid())
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                found.append(int(pid))
    return found


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pids: list[int], last: dict[int, float]) -> dict[int, float]:
    """CPU seconds of each of ``pids`` (the last value seen for one that has exited)."""
    out = dict(last)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / _TICK
        except OSError:
            pass
    return out


MIN_SECONDS = 5.0
"""Each measurement reads the whole stream as many times as it takes to last this long."""


def _drain(make: Any, sample_bytes: float, skip: int = 1) -> dict[str, float]:
    """Steady state, from the ``skip``-th batch to the last of each pass, over passes until
    ``MIN_SECONDS``: samples and MB per second, and CPU-s per GB of this process and its
    workers. A DataLoader takes batches from its workers in turn, so once ``num_workers``
    batches came every worker has started: start-up is excluded."""
    samples = steps = passes = 0
    seconds = main_cpu = workers_cpu = first_batch = 0.0
    while seconds < MIN_SECONDS and passes < 20:
        t_start = time.perf_counter()
        it = iter(make())
        for _ in range(skip):
            next(it)
        t0, main0 = time.perf_counter(), time.process_time()
        first_batch += t0 - t_start
        pids = children()
        start = cpu_of(pids, {})
        now = start
        t1, main1 = t0, main0
        for batch in it:
            samples += int(batch["prompt_id"].shape[0])
            steps += 1
            t1, main1 = time.perf_counter(), time.process_time()
            if pids:
                now = cpu_of(pids, now)
        del it
        seconds += t1 - t0
        main_cpu += main1 - main0
        workers_cpu += sum(now[p] - start.get(p, now[p]) for p in now)
        passes += 1
    gb = samples * sample_bytes / 1e9
    return {"samples_per_s": samples / seconds, "mb_per_s": samples * sample_bytes / seconds / 1e6,
            "cpu_s_per_gb": (main_cpu + workers_cpu) / gb,
            "worker_cpu_share": workers_cpu / max(main_cpu + workers_cpu, 1e-9),
            "steps": steps, "passes": passes, "seconds": seconds,
            "first_batch_s": first_batch / passes}


def measure(config: dict[str, Any], system: str, workers: int) -> dict[str, Any]:
    """One measurement of ``system`` at ``workers`` on the data ``config`` names (run in a
    process of its own, so that no measurement inherits another's memory or threads)."""
    from streaming import StreamingDataset

    kw: dict[str, Any] = {"num_workers": workers}
    if workers:
        kw["multiprocessing_context"] = "spawn"
    uri, options = config["uri"], config.get("options")
    steps = lakestream.open(uri, storage_options=options).num_steps

    def ours(collate: str = "padded") -> Any:
        return StreamLoader(StreamDataset(uri, group=None, rank=0, world_size=1,
                                          max_steps=steps, collate=collate,
                                          storage_options=options, progress_interval_s=0),
                            **kw)

    makers = {
        "lakestream": ours,
        "lakestream-s3": ours,
        "lakestream-packed": lambda: ours("packed"),
        "colocated-samples": lambda: torch.utils.data.DataLoader(
            ParquetSamples([tuple(f) for f in config["files"]]), batch_size=B,
            collate_fn=collate_samples, **kw),
        "colocated-batches": lambda: torch.utils.data.DataLoader(
            BatchFiles(config["batches"]), batch_size=None, **kw),
        "mosaic-streaming": lambda: torch.utils.data.DataLoader(
            StreamingDataset(local=config["mds"], batch_size=B, shuffle=False),
            batch_size=B, collate_fn=collate_samples, **kw),
    }
    return _drain(makers[system], config["sample_bytes"], skip=max(1, workers))


def _measured(config_path: str, system: str, workers: int, rep: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.loader", "--measure", config_path,
                          system, str(workers)], capture_output=True, text=True, timeout=900,
                         cwd=ROOT)
    if out.returncode:
        raise RuntimeError(f"{system} workers={workers} failed: {out.stderr[-3000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r.update(system=system, num_workers=workers, rep=rep)
    print(f"rep {rep} {system:18} workers={workers}  {r['mb_per_s']:7.1f} MB/s "
          f"{r['cpu_s_per_gb']:5.1f} CPU-s/GB ({r['seconds']:.1f} s, {r['passes']} passes)",
          flush=True)
    return r


def build(root: str, samples: int, options: dict[str, str] | None = None,
          uri: str | None = None) -> lakestream.Stream:
    uri = uri or f"{root}/stream"
    s = lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=B, group_size=G,
                          storage_options=options)
    for k in range(samples // FRAGMENT):
        s.append(payload.rollouts(FRAGMENT, G, seed=k, first_prompt=k * FRAGMENT // G))
    return s


def batch_files(root: str, stream: lakestream.Stream) -> list[str]:
    """The stream's steps as one zstd Parquet file each (the colocated-batches input)."""
    os.makedirs(f"{root}/batches")
    paths = []
    for step in range(stream.num_steps):
        paths.append(f"{root}/batches/{step:06d}.parquet")
        pq.write_table(stream.read_step(step), paths[-1], compression="zstd",
                       compression_level=1)
    return paths


def mosaic(root: str, stream: lakestream.Stream) -> str:
    from streaming import MDSWriter

    out = f"{root}/mds"
    columns = {"prompt_id": "int64", "tokens": "ndarray:int32", "logprobs": "ndarray:float32",
               "reward": "float32", "policy_version": "int64"}
    with MDSWriter(out=out, columns=columns, size_limit=1 << 26) as w:
        for step in range(stream.num_steps):
            t = stream.read_step(step)
            toks, lps = split_lists(t.column("tokens")), split_lists(t.column("logprobs"))
            for k in range(t.num_rows):
                w.write({"prompt_id": int(t.column("prompt_id")[k].as_py()), "tokens": toks[k],
                         "logprobs": lps[k], "reward": float(t.column("reward")[k].as_py()),
                         "policy_version": int(t.column("policy_version")[k].as_py())})
    return out


def amplification(stream: lakestream.Stream) -> dict[str, float]:
    """One pass over every step at ``num_workers=0``: bytes fetched of the fragments (GETs
    whole, by range or into a buffer, as the store's request hook sees them) per byte stored
    of the fragments delivered, and per byte of the Arrow tables delivered."""
    ds = StreamDataset(stream.uri, group=None, rank=0, world_size=1, max_steps=stream.num_steps,
                       storage_options=stream.storage_options, progress_interval_s=0,
                       collate=lambda table: table)
    fetched = [0]
    lock = threading.Lock()

    def count(request: Request) -> None:
        if request.key.startswith("data/") and request.nbytes is not None \
                and request.op != "put":
            with lock:
                fetched[0] += request.nbytes

    remove = add_request_hook(count)
    try:
        arrow = sum(table.nbytes for table in ds)
    finally:
        remove()
    stored = sum(f.size for f in stream.state.all_fragments())
    return {"fetched_bytes": fetched[0], "stored_bytes": stored,
            "per_stored_byte": fetched[0] / stored, "per_arrow_byte": fetched[0] / arrow}


SYSTEMS = ("lakestream", "lakestream-packed", "colocated-samples", "colocated-batches",
           "mosaic-streaming")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=65536)
    parser.add_argument("--s3-samples", type=int, default=16384)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--measure", nargs=3, metavar=("CONFIG", "SYSTEM", "WORKERS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        path, system, workers = args.measure
        config = json.loads(Path(path).read_text())
        print(json.dumps(measure(config, system, int(workers))), flush=True)
        return
    result: dict[str, Any] = {"command": command("loader"),
                              "samples": args.samples, "global_batch_size": B, "runs": []}
    with tempfile.TemporaryDirectory() as root:
        s = build(root, args.samples)
        config = {"uri": s.uri, "sample_bytes": payload.rollouts(256, G, seed=99).nbytes / 256,
                  "files": [(f"{s.uri}/{f.path}", f.rows) for f in s.state.all_fragments()],
                  "batches": batch_files(root, s), "mds": mosaic(root, s)}
        local = f"{root}/local.json"
        Path(local).write_text(json.dumps(config))
        for rep in range(args.reps):
            for workers in (0, 2):
                for system in SYSTEMS:
                    result["runs"].append(_measured(local, system, workers, rep))
        result["latency"] = {"local": _latency(s)}
        result["amplification"] = {"local": amplification(s)}
        from tests.s3server import start_s3

        server = start_s3("bench-loader")
        try:
            remote = build(root, args.s3_samples, server.options(),
                           uri="s3://bench-loader/stream")
            result["latency"]["s3"] = _latency(remote)
            result["amplification"]["s3"] = amplification(remote)
            s3 = f"{root}/s3.json"
            Path(s3).write_text(json.dumps({**config, "uri": remote.uri,
                                            "options": server.options()}))
            for rep in range(args.reps):
                for workers in (0, 2):
                    result["runs"].append(_measured(s3, "lakestream-s3", workers, rep))
        finally:
            server.stop()
    result["systems"] = summarise(result["runs"], lambda r: (r["system"], r["num_workers"]),
                                  by="mb_per_s")
    result["ratios"] = ratios(result["runs"])
    print("lakestream ratios:", json.dumps(result["ratios"], indent=1))
    print("read amplification:", json.dumps(result["amplification"]))
    print("step read latency (ms):", json.dumps(result["latency"]))
    save("loader.json", result)
    plot(result, RESULTS / "loader.png")


def ratios(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Lakestream's MB/s over each peer's, per repetition, summarised: at equal
    ``num_workers``, and each at its best setting (the better median of 0 and 2)."""
    def mb(system: str, workers: int) -> list[float]:
        return [r["mb_per_s"] for r in sorted(runs, key=lambda r: r["rep"])
                if r["system"] == system and r["num_workers"] == workers]

    def best(system: str) -> int:
        return max((0, 2), key=lambda w: median(mb(system, w)))

    out = {}
    for peer in ("colocated-samples", "colocated-batches", "mosaic-streaming"):
        for w in (0, 2):
            out[f"vs {peer} at workers={w}"] = spread(
                [a / b for a, b in zip(mb("lakestream", w), mb(peer, w), strict=True)])
        ours, theirs = best("lakestream"), best(peer)
        out[f"vs {peer}, each at its best (workers {ours} vs {theirs})"] = spread(
            [a / b for a, b in zip(mb("lakestream", ours), mb(peer, theirs), strict=True)])
    return out


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

    systems = [r["system"] for r in result["systems"] if r["num_workers"] == 0]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4))
    width = 0.38
    for k, w in enumerate((0, 2)):
        rows = [next(r for r in result["systems"] if r["system"] == name
                     and r["num_workers"] == w) for name in systems]
        x = np.arange(len(systems)) + (k - 0.5) * width
        mid = [r["mb_per_s"] for r in rows]
        ax.bar(x, mid, width, label=f"num_workers={w}",
               yerr=[[m - r["mb_per_s_min"] for m, r in zip(mid, rows, strict=True)],
                     [r["mb_per_s_max"] - m for m, r in zip(mid, rows, strict=True)]])
        bx.bar(x, [r["cpu_s_per_gb"] for r in rows], width, label=f"num_workers={w}")
    for a, label in ((ax, "MB/s into padded tensors (median, min-max)"),
                     (bx, "CPU-s per GB (trainer + workers)")):
        a.set_xticks(np.arange(len(systems)), systems, rotation=20, fontsize=8)
        a.set_ylabel(label)
        a.legend()
        a.grid(axis="y", alpha=0.3)
    ax.set_title("Reading the same RL samples, one rank, 2-core machine")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
