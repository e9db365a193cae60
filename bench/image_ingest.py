"""Image ingest: one producer writing raw 224x224x3 uint8 images into a tensor column, on tmpfs.

Usage: .venv/bin/python bench/image_ingest.py [--fragments 100] [--reps 3]
Writes bench/results/image_ingest.json.

Each repetition writes ``--fragments`` fragments of 64 images (9.6 MB each, ten distinct
batches in turn) through a ``Producer`` and flushes; CPU is the process's (the write thread
and the producer's upload and commit threads), per GB of raw image bytes. Beside it, the
floor of the same bytes: one copy of the array and ``pq.write_table`` of it, alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import lakestream
from lakestream.producers import Producer

RESULTS = Path(__file__).parent / "results"
SHAPE = (224, 224, 3)


def one(n: int, pool: list[np.ndarray]) -> float:
    root = tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
    try:
        uri = f"{root}/s"
        schema = pa.schema([lakestream.tensor_field("image", SHAPE), ("label", pa.int64())])
        lakestream.create(uri, schema, global_batch_size=64)
        with Producer(uri, "p") as p:
            c0 = time.process_time()
            for i in range(n):
                p.write({"image": pool[i % len(pool)], "label": np.arange(64)})
            p.flush()
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fragments", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    pool = [np.random.default_rng(k).integers(0, 256, (64, *SHAPE), dtype=np.uint8)
            for k in range(10)]
    runs = [{"producer": one(args.fragments, pool), "floor": floor(pool)}
            for _ in range(args.reps)]
    for r in runs:
        print(f"producer {r['producer']:.2f} CPU-s/GB, copy + encode floor {r['floor']:.2f}")
    med = sorted(r["producer"] for r in runs)[len(runs) // 2]
    print(f"median producer {med:.2f} CPU-s per GB of raw image bytes")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "image_ingest.json").write_text(json.dumps(
        {"command": f"bench/image_ingest.py --fragments {args.fragments} --reps {args.reps}",
         "runs": runs, "median_producer_cpu_s_per_gb": med}, indent=1))


if __name__ == "__main__":
    main()
