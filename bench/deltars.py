"""Lakestream producers beside plain ``deltalake.write_deltalake(mode="append")``: the same
lakehouse log without DAC, in its best configuration (delta-rs writes a checkpoint every
100 versions by default, so appends stay flat as the log grows).

Measured: throughput for 1, 2 and 4 writer processes with small RL fragments (one GRPO group
of 16 samples, ~260 KB) and large ones (512 samples, ~8 MB); and throughput as 4 writers
grow the log to 5,000 versions. Both systems write Parquet with zstd; each Lakestream
producer commits with DAC, each delta-rs writer commits each batch on its own.

Run: .venv/bin/python -m bench.deltars   (bench/results/deltars.json and deltars.png)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import payload
from bench.output import RESULTS, command, save
from bench.reps import spread, summarise
from bench.spawn import run_workers

GROUP = 16
SIZES = {"small": 16, "large": 512}


def _writer(system: str, uri: str, k: int, rows: int, start_at: float, duration: float,
            stop_version: int, out: Any) -> None:
    tables = [payload.rollouts(rows, GROUP, seed=100 * k + s) for s in range(4)]
    nbytes = [t.nbytes for t in tables]
    n = done_bytes = failed = 0
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = time.process_time()
    if system == "deltalake":
        import deltalake

        while time.time() < start_at + duration:
            try:
                deltalake.write_deltalake(uri, tables[n % 4], mode="append")
            except deltalake.exceptions.CommitFailedError:
                failed += 1  # delta-rs gave up after its own retries: try again, as users do
                continue
            done_bytes += nbytes[n % 4]
            n += 1
            if stop_version and n % 20 == 0 and deltalake.DeltaTable(uri).version() >= \
                    stop_version:
                break
        samples = n * rows
    else:
        from lakestream.producers import Producer

        p = Producer(uri, f"w{k}")
        while time.time() < start_at + duration:
            p.write(tables[n % 4])
            n += 1
            if stop_version and n % 20 == 0 and p.stream.version >= stop_version:
                break
        p.abort()  # count what was committed by the deadline
        samples = p.stats.fragments_committed * rows
        done_bytes = sum(nbytes[i % 4] for i in range(p.stats.fragments_committed))
    out.put({"samples": samples, "bytes": done_bytes, "cpu_s": time.process_time() - cpu0,
             "elapsed": time.time() - start_at, "failed_commits": failed})
    out.close()
    out.join_thread()  # the result is in the pipe before the hard exit below
    os._exit(0)  # deltalake 1.x can abort in its exit handlers


def _create(system: str, uri: str) -> None:
    if system == "deltalake":
        import deltalake

        deltalake.write_deltalake(uri, payload.rollouts(GROUP, GROUP).slice(0, 0))
    else:
        import lakestream

        lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=256,
                          group_size=GROUP)


def run(system: str, writers: int, rows: int, duration: float, root: str,
        rep: int = 0) -> dict[str, Any]:
    uri = f"{root}/{system}-{writers}-{rows}-{rep}"
    _create(system, uri)
    start_at = time.time() + 3.0 + 0.4 * writers
    res = run_workers(_writer, [(system, uri, k, rows, start_at, duration, 0)
                                for k in range(writers)], duration + 120)
    nb = sum(r["bytes"] for r in res)
    shutil.rmtree(uri, ignore_errors=True)  # repetitions would fill the disk
    return {"system": system, "writers": writers, "rows": rows,
            "samples_per_s": sum(r["samples"] for r in res) / duration,
            "mb_per_s": nb / duration / 1e6,
            "cpu_s_per_gb": sum(r["cpu_s"] for r in res) / max(nb / 1e9, 1e-9)}


def _head(system: str, uri: str) -> tuple[int, int]:
    """(log version, samples committed)."""
    if system == "deltalake":
        import deltalake

        v = int(deltalake.DeltaTable(uri).version())
        return v, v * GROUP  # version 0 creates the table; each append adds one group
    import lakestream

    s = lakestream.open(uri)
    return s.version, s.num_samples


def growth(system: str, root: str, target: int, writers: int = 4) -> dict[str, Any]:
    """4 writers of small fragments until the log passes ``target`` versions; samples the
    version and the committed rows every second."""
    uri = f"{root}/{system}-growth"
    _create(system, uri)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 4.0
    procs = [ctx.Process(target=_writer, args=(system, uri, k, GROUP, start_at, 900.0, target,
                                               out)) for k in range(writers)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    points = []
    while any(p.is_alive() for p in procs):
        time.sleep(1.0)
        points.append((time.time() - start_at, *_head(system, uri)))
    failed = sum(out.get(timeout=60)["failed_commits"] for _ in procs)
    # Samples/s while the log went through each tenth of the target length.
    tenths = []
    for d in range(10):
        window = [p for p in points if d * target / 10 <= p[1] <= (d + 1) * target / 10]
        if len(window) >= 2 and window[-1][0] > window[0][0]:
            tenths.append((window[-1][2] - window[0][2]) / (window[-1][0] - window[0][0]))
        else:
            tenths.append(0.0)
    return {"system": system, "points": points, "samples_per_s_by_tenth": tenths,
            "failed_commits": failed,
            "seconds_to_target": points[-1][0] if points else 0.0}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for ax, size in zip(axes[:2], SIZES, strict=True):
        for system in ("lakestream", "deltalake"):
            rows = [r for r in result["throughput"] if r["system"] == system
                    and r["rows"] == SIZES[size]]
            ax.plot([r["writers"] for r in rows], [r["mb_per_s"] for r in rows], "o-",
                    label=system)
        ax.set_title(f"{size} fragments ({SIZES[size]} samples): MB/s")
        ax.set_xlabel("writer processes")
        ax.legend()
    for g in result["growth"]:
        pts = g["points"]
        rates = [(b[1], (b[2] - a[2]) / (b[0] - a[0]))
                 for a, b in zip(pts, pts[1:], strict=False)
                 if b[0] > a[0]]
        axes[2].plot([v for v, _ in rates], [r for _, r in rates], label=g["system"])
    axes[2].set_title("log growth, 4 writers of small fragments: samples/s")
    axes[2].set_xlabel("log version")
    axes[2].set_yscale("log")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--growth-versions", type=int, default=5_000)
    parser.add_argument("--reps", type=int, default=3,
                        help="interleaved repetitions of every throughput run")
    args = parser.parse_args()
    import deltalake

    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "versions": {"deltalake": deltalake.__version__},
        "command": command("deltars"), "throughput": [],
        "growth": []}
    result["reps"] = args.reps
    runs = []
    with tempfile.TemporaryDirectory() as root:
        for rep in range(args.reps):  # every configuration once, then again: drift hits all
            for size, rows in SIZES.items():
                for writers in (1, 2, 4):
                    for system in ("lakestream", "deltalake"):
                        r = run(system, writers, rows, args.duration, root, rep) | {"rep": rep}
                        runs.append(r)
                        print(f"rep {rep} {size:5} {writers} writers {system:10} "
                              f"{r['samples_per_s']:8.0f} samples/s {r['mb_per_s']:7.1f} MB/s",
                              flush=True)
        result["throughput"] = summarise(runs, lambda r: (r["system"], r["writers"], r["rows"]))
        for system in ("lakestream", "deltalake"):
            g = growth(system, root, args.growth_versions)
            result["growth"].append(g)
            print(f"growth {system:10} to {args.growth_versions} versions in "
                  f"{g['seconds_to_target']:.0f} s; samples/s by tenth of the log "
                  f"{[round(x) for x in g['samples_per_s_by_tenth']]}; "
                  f"{g['failed_commits']} commits failed after the writer's retries",
                  flush=True)
    small = {(r["system"], r["rep"]): r["mb_per_s"] for r in runs
             if r["rows"] == SIZES["small"] and r["writers"] == 4}
    by = {g["system"]: g["samples_per_s_by_tenth"] for g in result["growth"]}
    result["ratios"] = {
        "small_4_writers_lakestream_over_deltalake": spread(
            [small["lakestream", k] / small["deltalake", k] for k in range(args.reps)]),
        "growth_lakestream_over_deltalake_by_tenth": [
            a / b if b else 0.0 for a, b in zip(by["lakestream"], by["deltalake"], strict=True)]}
    print(json.dumps(result["ratios"]))
    save("deltars.json", result)
    plot(result, RESULTS / "deltars.png")


if __name__ == "__main__":
    main()
