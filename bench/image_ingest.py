"""Image ingest: one producer writing raw 224x224x3 uint8 images into a tensor column, on tmpfs.

Usage: .venv/bin/python -m bench.image_ingest [--fragments 100] [--reps 3] [--producers 16]
Writes bench/results/image_ingest.json.

Each repetition writes ``--fragments`` fragments of 64 images (9.6 MB each, ten distinct
batches in turn) through a ``Producer`` and flushes; CPU is the process's (the write thread
and the producer's upload and commit threads), per GB of raw image bytes. Beside it, the
floor of the same bytes: one copy of the array and ``pq.write_table`` of it, alone.

``--producers N`` adds, per repetition, N producer processes writing ``--fragments`` each
into one stream at once: the GB/s of raw image bytes they ingest together, from the common
start to the last flush.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import lakestream
from bench.output import command, save
from lakestream.producers import Producer

SHAPE = (224, 224, 3)
SCHEMA = pa.schema([lakestream.tensor_field("image", SHAPE), ("label", pa.int64())])


def make_pool(seed: int = 0) -> list[np.ndarray]:
    """Ten distinct batches of 64 random images."""
    return [np.random.default_rng(seed * 10 + k).integers(0, 256, (64, *SHAPE), dtype=np.uint8)
            for k in range(10)]


def _root() -> str:
    return tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None)


def _write(p: Producer, pool: list[np.ndarray], n: int) -> None:
    """``n`` fragments of 64 images from ``pool`` in turn, flushed."""
    for i in range(n):
        p.write({"image": pool[i % len(pool)], "label": np.arange(64)})
    p.flush()


def one(n: int, pool: list[np.ndarray]) -> float:
    root = _root()
    try:
        uri = f"{root}/s"
        lakestream.create(uri, SCHEMA, global_batch_size=64)
        with Producer(uri, "p") as p:
            c0 = time.process_time()
            _write(p, pool, n)
            cpu = time.process_time() - c0
        return cpu / (n * pool[0].nbytes / 1e9)
    finally:
        shutil.rmtree(root)


def floor(pool: list[np.ndarray]) -> float:
    c0 = time.process_time()
    for a in pool:
        data = pa.py_buffer(np.array(a, copy=True).reshape(-1))
        offsets = pa.py_buffer(np.arange(0, 65 * a[0].nbytes, a[0].nbytes, dtype=np.int32))
        col = pa.Array.from_buffers(pa.binary(), 64, [None, offsets, data])
        pq.write_table(pa.table({"image": col}), pa.BufferOutputStream(), compression="none",
                       use_dictionary=False, write_statistics=False)
    return (time.process_time() - c0) / (len(pool) * pool[0].nbytes / 1e9)


def _writer(uri: str, k: int, n: int, start_at: float, out: Any) -> None:
    pool = make_pool(k)
    with Producer(uri, f"p{k}") as p:
        time.sleep(max(0.0, start_at - time.time()))
        t0, c0 = time.time(), time.process_time()
        _write(p, pool, n)
        out.put({"start": t0, "end": time.time(), "cpu_s": time.process_time() - c0})


def many(producers: int, n: int) -> dict[str, float]:
    """``producers`` processes writing ``n`` fragments each into one stream at once."""
    root = _root()
    try:
        uri = f"{root}/s"
        lakestream.create(uri, SCHEMA, global_batch_size=64)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        start_at = time.time() + 3.0 + 0.3 * producers  # each builds its pool first
        procs = [ctx.Process(target=_writer, args=(uri, k, n, start_at, out))
                 for k in range(producers)]
        for proc in procs:
            proc.start()
        done = [out.get(timeout=600) for _ in procs]
        for proc in procs:
            proc.join()
        wall = max(d["end"] for d in done) - min(d["start"] for d in done)
        raw_gb = producers * n * 64 * int(np.prod(SHAPE)) / 1e9
        rows = sum(f.rows for f in lakestream.open(uri).state.all_fragments())
        if rows != producers * n * 64:
            raise RuntimeError(f"{rows} rows committed, expected {producers * n * 64}")
        return {"gb_per_s": raw_gb / wall, "wall_s": wall,
                "cpu_s_per_gb": sum(d["cpu_s"] for d in done) / raw_gb}
    finally:
        shutil.rmtree(root)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fragments", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--producers", type=int, default=0,
                    help="also N producer processes at once (0: not run)")
    args = ap.parse_args()
    pool = make_pool()
    runs = []
    for _ in range(args.reps):
        r: dict[str, Any] = {"producer": one(args.fragments, pool), "floor": floor(pool)}
        if args.producers:
            r["together"] = many(args.producers, args.fragments)
        runs.append(r)
        print(f"producer {r['producer']:.2f} CPU-s/GB, copy + encode floor {r['floor']:.2f}"
              + (f"; {args.producers} producers together {r['together']['gb_per_s']:.2f} "
                 f"GB/s at {r['together']['cpu_s_per_gb']:.2f} CPU-s/GB"
                 if args.producers else ""), flush=True)
    med = sorted(r["producer"] for r in runs)[len(runs) // 2]
    print(f"median producer {med:.2f} CPU-s per GB of raw image bytes")
    result: dict[str, Any] = {"command": command("image_ingest"),
                              "cores": len(os.sched_getaffinity(0)),
                              "runs": runs, "median_producer_cpu_s_per_gb": med}
    if args.producers:
        rates = sorted(r["together"]["gb_per_s"] for r in runs)
        result["producers"] = args.producers
        result["together_gb_per_s"] = {"median": rates[len(rates) // 2], "min": rates[0],
                                       "max": rates[-1]}
        print(f"{args.producers} producers together: {rates[len(rates) // 2]:.2f} GB/s "
              f"({rates[0]:.2f}-{rates[-1]:.2f})")
    save("image_ingest.json", result)


if __name__ == "__main__":
    main()
