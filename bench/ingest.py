"""Ingest benchmark: DAC (adaptive) vs per-fragment commits, 1-8 producer processes, local
store and a real S3 server (SeaweedFS on 127.0.0.1), in one run, with interleaved
repetitions; a commit-bound run (tiny fragments, 1-16 producers, 20 s each) against the
server's measured conditional-PUT ceiling; then throughput while the log grows to 20,000+
versions.

Usage: .venv/bin/python -m bench.ingest [--duration 6] [--commit-bound-duration 20] [--reps 3]
       [--quick] [--no-growth]
Writes bench/results/ingest.json and bench/results/ingest.png.

Contended regime (what RL rollout writers do): each producer writes small fragments (one
GRPO group of 16 samples, ~16 KB each) as fast as it can and commits them as soon as they
are written. Producers start WARMUP_S before the window: in that time each fills its
in-flight budget (1,024 fragments), after which a write returns only as commits free room,
the steady state the window measures. Throughput counts the samples committed within the
window; producer CPU is each process's CPU in the window over the GB committed in it (what
is encoded but not committed by its end counts as CPU without bytes).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import lakestream
from bench import payload
from bench.output import RESULTS, command, save
from bench.reps import spread, summarise
from lakestream.producers import Producer, ProducerOptions
from tests.s3server import start_s3

GROUP = 16
WARMUP_S = 2.0
COUNTERS = ("fragments_uploaded", "commits", "attempts", "conflicts", "fragments_committed")


def _producer(uri: str, options: dict[str, str] | None, pid: str, policy: str, start_at: float,
              duration: float, rows: int, tiny: bool, out: Any) -> None:
    frags = [payload.rollouts(rows, GROUP, seed=k, min_tokens=16 if tiny else 1024,
                              max_tokens=48 if tiny else 3072) for k in range(8)]
    p = Producer(uri, pid, storage_options=options,
                 options=ProducerOptions(commit_policy=policy))  # type: ignore[arg-type]
    time.sleep(max(0.0, start_at - WARMUP_S - time.time()))
    cpu_begin = time.process_time()
    s = p.stats
    written = [0]
    marks: dict[str, dict[str, Any]] = {}

    def mark(name: str) -> None:
        marks[name] = {"cpu_s": time.process_time(), "written": written[0],
                       "latencies": s.latencies(), **{k: getattr(s, k) for k in COUNTERS}}

    # The window's start, the start of its second half (DAC settled) and its end, taken on
    # time by timers even while a write blocks for room in the in-flight budget.
    timers = [threading.Timer(max(0.0, at - time.time()), mark, args=(name,))
              for name, at in (("start", start_at), ("half", start_at + duration / 2),
                               ("end", start_at + duration))]
    for t in timers:
        t.start()
    while time.time() < start_at + duration:
        p.write(frags[written[0] % len(frags)])
        written[0] += 1
    for t in timers:
        t.join()
    # The window's throughput is what the stream held at its end; flushing the rest after it
    # gives the cost of every fragment written, all of it committed.
    p.flush()
    cpu_all, fragments_all = time.process_time() - cpu_begin, s.fragments_committed
    p.close()
    at_start, at_half, counts = marks["start"], marks["half"], marks["end"]
    latencies = counts["latencies"]
    in_window = counts["commits"] - at_start["commits"]
    lat = sorted(latencies[-in_window:]) if in_window else [0.0]
    out.put({"producer": pid, "written": counts["written"] - at_start["written"],
             "uploaded": counts["fragments_uploaded"] - at_start["fragments_uploaded"],
             "commits": in_window,
             "attempts": counts["attempts"] - at_start["attempts"],
             "conflicts": counts["conflicts"] - at_start["conflicts"],
             "attempts_second_half": counts["attempts"] - at_half["attempts"],
             "conflicts_second_half": counts["conflicts"] - at_half["conflicts"],
             "fragments": counts["fragments_committed"] - at_start["fragments_committed"],
             "cpu_s": counts["cpu_s"] - at_start["cpu_s"], "commit_p50_s": lat[len(lat) // 2],
             "cpu_s_all": cpu_all, "fragments_all": fragments_all})


def run(uri: str, options: dict[str, str] | None, producers: int, policy: str,
        duration: float, rows: int = GROUP, tiny: bool = False) -> dict[str, Any]:
    """Committed samples/s over a fixed window, ``producers`` processes writing flat out."""
    s = lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=256, group_size=GROUP,
                          storage_options=options)
    sample_bytes = payload.rollouts(256, GROUP, seed=99, min_tokens=16 if tiny else 1024,
                                    max_tokens=48 if tiny else 3072).nbytes / 256
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    # Every process imported and open by the warm-up's start.
    start_at = time.time() + 3.0 + 0.3 * producers + WARMUP_S
    procs = [ctx.Process(target=_producer, args=(uri, options, f"p-{k}", policy, start_at,
                                                  duration, rows, tiny, out))
             for k in range(producers)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    s.refresh()
    samples0 = s.num_samples
    time.sleep(max(0.0, start_at + duration - time.time()))
    s.refresh()
    samples = s.num_samples - samples0
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    commits = sum(r["commits"] for r in results)
    attempts = sum(r["attempts"] for r in results)
    conflicts = sum(r["conflicts"] for r in results)
    mb = samples * sample_bytes / 1e6
    return {
        "producers": producers, "policy": policy, "samples": samples, "window_s": duration,
        "samples_per_s": samples / duration, "mb_per_s": mb / duration,
        "commits": commits, "attempts": attempts, "conflicts": conflicts,
        "conflict_ratio": conflicts / attempts if attempts else 0.0,
        "conflict_ratio_second_half": sum(r["conflicts_second_half"] for r in results) / max(
            1, sum(r["attempts_second_half"] for r in results)),
        "commits_per_producer": sorted(r["commits"] for r in results),
        "fragments_per_commit": sum(r["fragments"] for r in results) / max(1, commits),
        # Encoded and put by the window's end but not committed in it: CPU spent without
        # committed bytes (the producers' in-flight budget filling up).
        "fragments_written": sum(r["written"] for r in results),
        "fragments_uploaded": sum(r["uploaded"] for r in results),
        "fragments_committed": sum(r["fragments"] for r in results),
        "commit_p50_ms": 1000 * sorted(r["commit_p50_s"] for r in results)[len(results) // 2],
        # CPU in the window over bytes committed in it: fragments encoded and put but still
        # waiting for a commit at the window's end count as CPU without bytes, and more so
        # where uploads lag (S3 at 8 producers: 1,500 of 3,400 written).
        "producer_cpu_s_per_gb": sum(r["cpu_s"] for r in results) / max(1e-9, mb / 1000),
        # From the warm-up's start until everything written is committed, over all of it.
        "producer_cpu_s_per_gb_all": sum(r["cpu_s_all"] for r in results) / max(
            1e-9, sum(r["fragments_all"] for r in results) * rows * sample_bytes / 1e9),
    }


def growth(root: str, target_versions: int, producers: int) -> dict[str, Any]:
    """Tiny fragments from ``producers`` processes until the log passes ``target_versions``;
    samples the head every 0.25 s."""
    uri = f"{root}/growth"
    lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=256, group_size=GROUP)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0 + 0.3 * producers + WARMUP_S
    procs = [ctx.Process(target=_producer, args=(uri, None, f"g-{k}", "adaptive", start_at,
                                                  3600.0, GROUP, True, out))
             for k in range(producers)]
    for p in procs:
        p.start()
    s = lakestream.open(uri)
    pids = [p.pid for p in procs if p.pid is not None]
    series = []
    while True:
        time.sleep(0.25)
        s.refresh()
        series.append((time.time(), s.version, s.num_samples, *_cpu_s(pids), _steal_s()))
        if s.version >= target_versions:
            break
    for p in procs:
        p.terminate()
        p.join()
    series = [x for x in series if x[0] >= start_at]
    t0 = series[0][0]
    points = [{"t": t - t0, "version": v, "samples": n, "producer_user_s": u,
               "producer_system_s": k, "steal_s": st} for t, v, n, u, k, st in series]

    def tenth(d: int) -> tuple[float, float, float, float, float]:
        """While the version went through tenth ``d`` of the run: samples/s, the producers'
        CPU-ms per 1,000 samples, in user space and in the kernel, the share of the
        machine's time its host took, and versions/s."""
        v0, vmax = series[0][1], series[-1][1]
        window = [x for x in series
                  if v0 + d / 10 * (vmax - v0) <= x[1] <= v0 + (d + 1) / 10 * (vmax - v0)]
        (ta, va, na, ua, ka, sa), (tb, vb, nb, ub, kb, sb) = window[0], window[-1]
        if tb <= ta or nb <= na:
            return 0.0, 0.0, 0.0, 0.0, 0.0
        return ((nb - na) / (tb - ta), 1e6 * (ub - ua) / (nb - na), 1e6 * (kb - ka) / (nb - na),
                (sb - sa) / ((tb - ta) * (os.cpu_count() or 1)), (vb - va) / (tb - ta))

    tenths = [tenth(d) for d in range(10)]
    deciles = [t[0] for t in tenths]
    first, last = deciles[0], deciles[-1]
    return {"producers": producers, "versions": series[-1][1], "points": points,
            "decile_samples_per_s": deciles,
            "decile_user_cpu_ms_per_1k_samples": [t[1] for t in tenths],
            "decile_system_cpu_ms_per_1k_samples": [t[2] for t in tenths],
            "decile_steal_share": [t[3] for t in tenths],
            "decile_versions_per_s": [t[4] for t in tenths],
            "first_10pct_samples_per_s": first, "last_10pct_samples_per_s": last,
            "ratio_last_to_first": last / first if first else 0.0}


def _cpu_s(pids: list[int]) -> tuple[float, float]:
    """User and system CPU seconds of these live processes (Linux /proc; 0 where
    unreadable)."""
    user = system = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user, system = user + int(fields[11]), system + int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


def _steal_s() -> float:
    """CPU seconds the hypervisor has taken from this machine since boot (Linux /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            cpu = f.readline().split()
        return int(cpu[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, store in zip(axes[:2], ("local", "s3"), strict=True):
        for policy, style in (("adaptive", "o-"), ("per-fragment", "s--")):
            rows = [r for r in result["scaling"] if r["store"] == store and r["policy"] == policy]
            ax.plot([r["producers"] for r in rows], [r["samples_per_s"] for r in rows], style,
                    label=policy)
        ax.set_title(f"{store}: committed samples/s (16-sample fragments)")
        ax.set_xlabel("producer processes")
        ax.set_xscale("log", base=2)
        ax.legend()
        ax.grid(alpha=0.3)
    for policy, style in (("adaptive", "o-"), ("per-fragment", "s--")):
        rows = [r for r in result["commit_bound"] if r["policy"] == policy]
        axes[2].plot([r["producers"] for r in rows],
                     [r["commits"] / r["window_s"] for r in rows], style,
                     label=f"{policy} commits/s")
    for threads, ceiling in result["put_ceiling_per_s"].items():
        axes[2].axhline(ceiling, ls=":", lw=0.8, color="grey")
        axes[2].annotate(f"PUT ceiling, {threads} threads", (1, ceiling), fontsize=7)
    axes[2].set_title("commit-bound (tiny fragments), S3: whole-stream commits/s")
    axes[2].set_xlabel("producer processes")
    axes[2].set_xscale("log", base=2)
    axes[2].legend()
    axes[2].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def put_ceiling(options: dict[str, str], threads: int, duration: float) -> float:
    """Conditional PUTs/s of small unique keys the server sustains from ``threads`` threads
    of one process: the ceiling a commit-bound stream can approach."""
    import threading

    from lakestream.store import open_store

    store = open_store(f"s3://bench/ceiling-{time.time_ns()}", options)
    counts = [0] * threads
    stop = time.monotonic() + duration

    def work(k: int) -> None:
        while time.monotonic() < stop:
            store.put(f"k/{k}-{counts[k]}", b"x" * 600, mode="create")
            counts[k] += 1

    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(counts) / duration


def scaling(root: str, server: Any, stores: list[str], producers: list[int], reps: int,
            duration: float, tiny: bool, label: str) -> list[dict[str, Any]]:
    """Every (store, producers, policy) ``reps`` times, interleaved: repetition r of every
    configuration runs before repetition r + 1 of any, so drift hits all alike."""
    runs: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for rep in range(reps):
        for store in stores:
            for n in producers:
                for policy in ("adaptive", "per-fragment"):
                    name = f"{label}-{store}-{n}-{policy}-{rep}"
                    uri = f"{root}/{name}" if store == "local" else f"s3://bench/{name}"
                    opts = None if store == "local" else server.options()
                    r = run(uri, opts, n, policy, duration, tiny=tiny)
                    if store == "local":
                        shutil.rmtree(uri, ignore_errors=True)  # ~1 GB a run, not needed again
                    r["store"] = store
                    runs.setdefault((store, n, policy), []).append(r)
                    print(f"{label} rep {rep} {store:5} {n:2} producers {policy:12} "
                          f"{r['samples_per_s']:8.0f} samples/s {r['mb_per_s']:7.1f} MB/s "
                          f"commits {r['commits']:5} ({r['commits'] / duration:6.1f}/s) "
                          f"conflicts {100 * r['conflict_ratio']:4.1f}% "
                          f"{r['fragments_per_commit']:.1f} frags/commit "
                          f"{r['producer_cpu_s_per_gb']:.1f} CPU-s/GB "
                          f"({r['producer_cpu_s_per_gb_all']:.1f} whole run); fragments written "
                          f"{r['fragments_written']} uploaded {r['fragments_uploaded']} "
                          f"committed {r['fragments_committed']}", flush=True)
    return summarise([r for rs in runs.values() for r in rs],
                     lambda r: (r["store"], r["producers"], r["policy"]))


def ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """adaptive / per-fragment samples/s per (store, producers): the median of the
    per-repetition ratios, and their min and max."""
    out = {}
    for a in (r for r in rows if r["policy"] == "adaptive"):
        f = next(r for r in rows if r["policy"] == "per-fragment" and r["store"] == a["store"]
                 and r["producers"] == a["producers"])
        each = [x["samples_per_s"] / y["samples_per_s"]
                for x, y in zip(a["reps"], f["reps"], strict=True) if y["samples_per_s"]]
        out[f"{a['store']}-{a['producers']}"] = spread(each)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--producers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--commit-bound-duration", type=float, default=20.0,
                        help="the producers start together: the seconds before DAC has "
                             "spaced them out count in it")
    parser.add_argument("--commit-bound-producers", type=int, nargs="+",
                        default=[1, 2, 4, 8, 16])
    parser.add_argument("--growth-versions", type=int, default=20_000)
    parser.add_argument("--no-growth", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 s, 1 and 8")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.producers, args.growth_versions, args.reps = 2.0, [1, 8], 2_000, 1
        args.commit_bound_duration = 2.0
        args.commit_bound_producers = [1, 8]
    # Everything written is committed and kept, ~30 GB in all: past the suite's 25 GB.
    server = start_s3("bench", volumes=400)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(),
               "platform": platform.platform(), "s3": "SeaweedFS 4.48 on 127.0.0.1"}
    result: dict[str, Any] = {"machine": machine, "command": command("ingest"),
                              "reps": args.reps}
    try:
        with tempfile.TemporaryDirectory() as root:
            result["scaling"] = scaling(root, server, ["local", "s3"], args.producers,
                                        args.reps, args.duration, False, "scaling")
            result["put_ceiling_per_s"] = {
                str(t): put_ceiling(server.options(), t, 4.0) for t in (1, 8, 16)}
            print("conditional PUT ceiling/s:", result["put_ceiling_per_s"], flush=True)
            result["commit_bound"] = scaling(root, server, ["s3"], args.commit_bound_producers,
                                             args.reps, args.commit_bound_duration, True,
                                             "commit-bound")
            if not args.no_growth:
                result["growth"] = growth(root, args.growth_versions, 4)
    finally:
        server.stop()
    result["adaptive_over_per_fragment"] = ratios(result["scaling"])
    result["commit_bound_adaptive_over_per_fragment"] = ratios(result["commit_bound"])
    print("adaptive / per-fragment:", json.dumps(result["adaptive_over_per_fragment"]))
    print("commit-bound:", json.dumps(result["commit_bound_adaptive_over_per_fragment"]))
    g = result.get("growth")
    if g:
        print(f"growth to {g['versions']} versions: first 10% "
              f"{g['first_10pct_samples_per_s']:.0f} samples/s, last 10% "
              f"{g['last_10pct_samples_per_s']:.0f} (ratio {g['ratio_last_to_first']:.2f})")
    save("ingest.json", result)
    plot(result, RESULTS / "ingest.png")


if __name__ == "__main__":
    main()
