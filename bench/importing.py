"""``lakestream import`` of a Parquet dataset beside the Producer loop a user would write for
it (read the files by batch, ``write`` each), on the same data, in interleaved repetitions.

The dataset: RL rollouts (an id, 1-3k int32 tokens drawn Zipf-like, a reward, a prompt
string) in Parquet files of 10k rows. Both write into a fresh local stream (tmpfs where
/dev/shm exists) with the same ProducerOptions, and count from the first read to the last
commit. Reported per system: rows/s, MB/s of Arrow data, CPU-s per GB (the process's, so
the producer's upload and commit threads count), and the ratio import / loop.

Usage: .venv/bin/python -m bench.importing [--rows 100000] [--reps 3]
Writes bench/results/importing.json and importing.png.
"""

from __future__ import annotations

import argparse
import json
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
from bench.output import RESULTS
from bench.reps import median, plot_bars, spread, summarise
from lakestream.producers import Producer
from lakestream.producers.importing import WRITE_BYTES, import_dataset

FILE_ROWS = 10_000


def make_dataset(folder: Path, rows: int) -> int:
    """Writes the rollouts; returns their Arrow bytes."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    nbytes = 0
    for k, lo in enumerate(range(0, rows, FILE_ROWS)):
        n = min(FILE_ROWS, rows - lo)
        lengths = rng.integers(1000, 3000, n)
        tokens = np.minimum(rng.zipf(1.2, int(lengths.sum())), 50_000).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        table = pa.table({
            "id": pa.array(np.arange(lo, lo + n), pa.int64()),
            "tokens": pa.ListArray.from_arrays(offsets, tokens),
            "reward": pa.array(rng.random(n), pa.float32()),
            "prompt": [f"prompt {i}" for i in range(lo, lo + n)]})
        pq.write_table(table, folder / f"part-{k:04d}.parquet")
        nbytes += table.nbytes
    return nbytes


def run_import(uri: str, data: Path) -> None:
    import_dataset(uri, str(data))


def run_loop(uri: str, data: Path) -> None:
    """The loop a user writes: each file by batches of about a write's bytes."""
    with Producer(uri, "loop") as p:
        for path in sorted(data.glob("*.parquet")):
            file = pq.ParquetFile(path)
            rows = max(1, int(WRITE_BYTES * file.metadata.num_rows
                              / max(1, file.metadata.row_group(0).total_byte_size)))
            for batch in file.iter_batches(batch_size=rows):
                p.write(batch)


def measure(system: str, root: Path, data: Path, schema: pa.Schema, rows: int,
            nbytes: int) -> dict[str, Any]:
    uri = str(root / f"s-{system}")
    shutil.rmtree(uri, ignore_errors=True)
    lakestream.create(uri, schema, global_batch_size=1000)
    cpu0, t0 = time.process_time(), time.perf_counter()
    (run_import if system == "import" else run_loop)(uri, data)
    dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert lakestream.open(uri).num_samples == rows, "every row, once"
    return {"system": system, "rows_per_s": rows / dt, "mb_per_s": nbytes / dt / 1e6,
            "cpu_s_per_gb": cpu / (nbytes / 1e9), "seconds": dt}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "importing"))
    args = parser.parse_args()
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        root = Path(tmp)
        nbytes = make_dataset(root / "data", args.rows)
        schema = pq.read_schema(next((root / "data").glob("*.parquet"))).remove_metadata()
        runs = []
        for rep in range(args.reps):
            for system in ("loop", "import"):
                runs.append({**measure(system, root, root / "data", schema, args.rows,
                                       nbytes), "rep": rep})
                print(json.dumps(runs[-1]), flush=True)
    rows = summarise(runs, lambda r: r["system"], by="mb_per_s")
    ratios = [i["mb_per_s"] / loop["mb_per_s"] for loop, i in zip(
        (r for r in runs if r["system"] == "loop"), (r for r in runs if r["system"] == "import"),
        strict=True)]
    report = {"rows": args.rows, "arrow_bytes": nbytes, "reps": args.reps,
              "import_over_loop": spread(ratios), "systems": rows}
    Path(args.out + ".json").write_text(json.dumps(report, indent=2))
    plot_bars(rows, Path(args.out + ".png"),
              f"import vs a Producer loop, {args.rows:,} rollouts from Parquet "
              f"(import/loop {median(ratios):.2f}x)",
              ylabel="MB/s of Arrow data into a local stream (median of reps)")
    print(json.dumps({k: v for k, v in report.items() if k != "systems"}))


if __name__ == "__main__":
    main()
