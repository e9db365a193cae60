"""Training from S3 for more than one pass: a stream of raw images read twice in process at
the defaults with a null consumer, from tmpfs, from a SeaweedFS server on 127.0.0.1, and from
that server through a host disk cache (``DiskCache``, on the local disk), through the page
cache and around it (``direct=True``).

Usage: .venv/bin/python -m bench.s3cache [--reps 5] [--batches 48] [--only s3 ...]
    [--out s3cache.json]
Writes bench/results/s3cache.json (or ``--out``) and a PNG beside it.

The same stream (batches of 64 raw 224x224x3 ``uint8`` images in a tensor column, one
fragment a batch) is written once on tmpfs and copied key for key to the server. Each
configuration runs in a fresh process: pass 1, then pass 2 with a fresh dataset (and, for
the cache, the same folder, emptied before each repetition); per pass GB/s, the process's
CPU-s per GB, and the fragment GETs the store served (counted in the process). ``s3`` reads
fragments directly into the reader's buffers (``store/s3direct.py``), ``s3, client reads``
through the S3 client's own buffers (``lakestream_direct_reads=false``). The default
cache (``direct``) is also run on tmpfs (where it goes through the page cache): the cache's
own cost, apart from its disk's; and the disk's own rate of reading the cache's entries
around the page cache is measured after the last repetition. Repetition r
of every configuration runs before repetition r + 1 of any, each repetition starting one
configuration further along the list: the server shares the 2 cores, and a process that
follows a few seconds in which it served nothing (the tmpfs run) spent up to a third more
CPU per GB than one that followed another's reads (0.76-1.02 against 0.62-0.82 CPU-s per
GB over 9 runs of the same process), so no configuration always takes that turn. Each
figure is the median repetition with its min-max.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.output import RESULTS, ROOT, save
from bench.reps import median

BATCH_BYTES = 64 * 224 * 224 * 3

CHILD = r'''
import json, sys, time
from lakestream.loaders import DiskCache, StreamDataset
from lakestream.store.s3 import S3Store
uri, options, cache_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
batches = int(sys.argv[4])
gets = [0]
real = S3Store.get_buffer
def counted(self, key, size):
    gets[0] += 1
    return real(self, key, size)
S3Store.get_buffer = counted
cache = None if cache_dir == "-" else \
    DiskCache(cache_dir.removesuffix("+direct"), 1 << 40, direct=cache_dir.endswith("+direct"))
out = []
for p in range(2):
    ds = StreamDataset(uri, group=None, storage_options=options or None, max_steps=batches,
                       timeout=120, disk_cache=cache)
    g0, cpu0, t0 = gets[0], time.process_time(), time.perf_counter()
    n = sum(1 for _ in ds)
    dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    gb = n * float(sys.argv[5]) / 1e9
    out.append({"batches": n, "seconds": dt, "gb_per_s": gb / dt, "cpu_s_per_gb": cpu / gb,
                "fragment_gets": gets[0] - g0})
print(json.dumps(out))
'''


def _run(uri: str, options: dict[str, str] | None, cache: str | None, batches: int
         ) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, "-c", CHILD, uri, json.dumps(options or {}),
                          cache or "-", str(batches), str(BATCH_BYTES)],
                         capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    passes: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return passes


def _disk_read(folder: str, threads: int = 5) -> dict[str, float]:
    """GB/s at which the disk under ``folder`` serves its files, read around the page cache
    (``O_DIRECT``) as the direct cache reads them: each whole in one read into a block of
    the buffer pool (mapped before the clock starts, as in a second pass), ``threads`` at
    once (on 2 cores a read thread and 4 more while reads wait): what a pass through that
    cache can reach at most. Into plain 4 KiB pages, without the pool's huge pages, the same
    reads ran at half the rate."""
    import gc
    import os
    import time
    from concurrent.futures import ThreadPoolExecutor

    from lakestream.store.pool import buffer_pool, read_file

    files = [str(f) for f in Path(folder).rglob("*~*") if f.is_file()]
    padded = [-(-os.path.getsize(f) // 4096) * 4096 for f in files]
    for size in set(padded):
        blocks = [buffer_pool().array(size) for _ in range(threads)]
        for block in blocks:
            block[:] = 0
        del blocks
    gc.collect()

    def read(job: tuple[str, int]) -> int:
        path, size = job
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
        try:
            return len(read_file(fd, os.fstat(fd).st_size, size))
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(read, zip(files, padded, strict=True)))
    return {"files": len(files), "gb": total / 1e9,
            "gb_per_s": total / 1e9 / (time.perf_counter() - t0), "threads": threads}


def _copy(src: str, dst: str, options: dict[str, str]) -> None:
    from lakestream.store import open_store

    a, b = open_store(src), open_store(dst, options)
    for meta in a.list(""):
        b.put(meta.key, a.get(meta.key))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batches", type=int, default=48)
    ap.add_argument("--only", nargs="*", default=[],
                    help="configurations to run beside tmpfs (default: all)")
    ap.add_argument("--out", default="s3cache.json", help="file name under bench/results/")
    args = ap.parse_args()
    from bench import gpu
    from tests.s3server import BUCKET, start_s3

    root = tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
    disk = tempfile.mkdtemp(prefix="lakestream-bench-cache-")
    direct = tempfile.mkdtemp(prefix="lakestream-bench-cache-direct-")
    memory = f"{root}/cache"  # the default (direct) cache on tmpfs: through the page cache
    server = start_s3("bench")
    try:
        config = {"kind": "raw", "batch": 64, "batches": args.batches, "seq": 0,
                  "uri": f"{root}/stream", "stand_in": True}
        gpu.write_stream(config["uri"], config, gpu.make_pool(config))
        options = server.options()
        s3 = f"s3://{BUCKET}/s3cache"
        _copy(config["uri"], s3, options)
        client = options | {"lakestream_direct_reads": "false"}
        every = {"tmpfs": (config["uri"], None, None), "s3": (s3, options, None),
                   "s3, client reads": (s3, client, None),
                   "s3 + disk cache": (s3, options, disk),
                   "s3 + disk cache, direct": (s3, options, direct + "+direct"),
                   "s3 + cache on tmpfs": (s3, options, memory + "+direct")}
        configs = {k: v for k, v in every.items() if k == "tmpfs" or not args.only
                   or k in args.only}
        runs: dict[str, list[list[dict[str, Any]]]] = {k: [] for k in configs}
        names = list(configs)
        for rep in range(args.reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                uri, opts, cache = configs[name]
                if cache is not None:
                    shutil.rmtree(cache.removesuffix("+direct"), ignore_errors=True)
                runs[name].append(_run(uri, opts, cache, args.batches))
                print(rep, name, runs[name][-1], flush=True)
        # the direct cache's entries of its last repetition, written around the page cache
        disk_read = _disk_read(direct) if "s3 + disk cache, direct" in configs else None
        print("the disk read the cache's entries at", disk_read, flush=True)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(direct, ignore_errors=True)
    rows = []
    for name, reps in runs.items():
        for p in range(2):
            xs = [r[p] for r in reps]
            row = {"config": name, "pass": p + 1, "reps": xs}
            for k in ("gb_per_s", "cpu_s_per_gb", "fragment_gets"):
                vals = [x[k] for x in xs]
                row |= {k: median(vals), f"{k}_min": min(vals), f"{k}_max": max(vals)}
            rows.append(row)
    tmpfs = {r["pass"]: r for r in rows if r["config"] == "tmpfs"}
    for r in rows:  # per repetition, against tmpfs's same pass of the same repetition
        ratios = [x["gb_per_s"] / t["gb_per_s"] for x, t in
                  zip(r["reps"], tmpfs[r["pass"]]["reps"], strict=True)]
        cpu = [x["cpu_s_per_gb"] / t["cpu_s_per_gb"] for x, t in
               zip(r["reps"], tmpfs[r["pass"]]["reps"], strict=True)]
        r |= {"rate_vs_tmpfs": median(ratios), "rate_vs_tmpfs_min": min(ratios),
              "rate_vs_tmpfs_max": max(ratios), "cpu_vs_tmpfs": median(cpu),
              "cpu_vs_tmpfs_min": min(cpu), "cpu_vs_tmpfs_max": max(cpu)}
    result = {"batches": args.batches, "batch_bytes": BATCH_BYTES, "reps": args.reps,
              "rows": rows, "disk_read": disk_read}
    save(args.out, result)
    _plot(rows, RESULTS / Path(args.out).with_suffix(".png").name)
    for r in rows:
        print(f"{r['config']:>16} pass {r['pass']}: {r['gb_per_s']:.2f} GB/s "
              f"({r['gb_per_s_min']:.2f}-{r['gb_per_s_max']:.2f}) = {r['rate_vs_tmpfs']:.2f}x "
              f"tmpfs, {r['cpu_s_per_gb']:.2f} CPU-s/GB = {r['cpu_vs_tmpfs']:.2f}x tmpfs, "
              f"{r['fragment_gets']} fragment GETs")


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 4))
    labels = [f"{r['config']}\npass {r['pass']}" for r in rows]
    rates = [r["gb_per_s"] for r in rows]
    err = [[r["gb_per_s"] - r["gb_per_s_min"] for r in rows],
           [r["gb_per_s_max"] - r["gb_per_s"] for r in rows]]
    bars = ax.bar(range(len(rows)), rates, yerr=err, capsize=3)
    for bar, r in zip(bars, rows, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                f"{r['cpu_s_per_gb']:.2f} CPU-s/GB\n{r['fragment_gets']} GETs", ha="center",
                va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("GB/s delivered (median, min-max)")
    ax.set_title("Two passes from tmpfs, S3 (SeaweedFS) and S3 through a disk cache")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
