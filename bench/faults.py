"""Producer throughput under injected S3 503 SlowDown replies beside the same producers
without faults, and how fast they recover once the faults stop.

Each run is one stream on a fresh SeaweedFS server on 127.0.0.1, written by 3 producer
processes flat out through three phases of equal length: no faults, then 503 SlowDown on a
share ``rate`` of every producer request (answered by the fault-injecting HTTP proxy of
``tests/faultproxy.py`` before the request reaches the server, whatever the client library),
then no faults again. Both fault-free phases of the same run are the baseline. The producers
write for ``WARMUP_S`` before the first phase: a producer commits nothing until its first
fragments are uploaded, and DAC starts cold; neither is what faults cost. Without the
warm-up the rate was still climbing through the fault phase (3,878 / 4,238 / 6,090
samples/s before / during / after 5% 503s in one run). The rates run interleaved, ``--repeats``
times (5%, 20%, 5%, 20%, ...), each on a fresh server, and the ratio reported is the median
with its min-max. Recovery: from the moment faults stop, how long until every producer has
committed again, and until the producers together are back to 0.8x the baseline over a 1 s
window; the target is 2x the store's retry backoff cap.

Run: .venv/bin/python -m bench.faults [--phase 10] [--repeats 3]
Writes bench/results/faults.json and faults.png.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import lakestream
from bench import payload
from bench.output import RESULTS, command, save
from bench.spawn import run_workers
from lakestream.producers import Producer
from lakestream.store.s3 import S3Options

GROUP, PRODUCERS, RATES = 16, 3, (0.05, 0.20)
RECOVERED_AT = 0.8  # share of the baseline rate that counts as recovered
WARMUP_S = 5.0


def _producer(uri: str, options: dict[str, str], k: int, start_at: float, phase: float,
              out: Any) -> None:
    tables = [payload.rollouts(GROUP, GROUP, seed=100 * k + s) for s in range(8)]
    p = Producer(uri, f"p-{k}", storage_options=options)
    series: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:  # when each commit landed, to 10 ms
        last = 0
        while not done.is_set():
            n = p.stats.fragments_committed
            if n != last:
                series.append((time.time(), n))
                last = n
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(max(0.0, start_at - WARMUP_S - time.time()))
    n = 0
    cpu0 = time.process_time()
    while time.time() < start_at + 3 * phase:
        p.write(tables[n % len(tables)])
        n += 1
    p.abort()  # what is not committed by the deadline does not count
    done.set()
    sampler.join()
    out.put({"producer": k, "series": series, "commits": p.stats.commits,
             "attempts": p.stats.attempts, "conflicts": p.stats.conflicts,
             "cpu_s": time.process_time() - cpu0})


class _PhasePolicy:
    """503 on a share ``rate`` of requests, only between ``lo`` and ``hi`` (wall time)."""

    def __init__(self, rate: float, lo: float, hi: float) -> None:
        import random

        self.rate, self.lo, self.hi = rate, lo, hi
        self._rng = random.Random(0)
        self._lock = threading.Lock()

    def __call__(self, _request: Any) -> str | None:
        if not self.lo <= time.time() < self.hi:
            return None
        with self._lock:
            return "503" if self._rng.random() < self.rate else None


def _rate(runs: list[dict[str, Any]], lo: float, hi: float) -> float:
    """Committed samples/s over [lo, hi) from the producers' commit series."""
    total = 0
    for r in runs:
        before = [n for t, n in r["series"] if t < lo]
        upto = [n for t, n in r["series"] if t < hi]
        total += (upto[-1] if upto else 0) - (before[-1] if before else 0)
    return total * GROUP / (hi - lo)


def run(rate: float, phase: float) -> dict[str, Any]:
    from tests.faultproxy import FaultProxy
    from tests.s3server import start_s3

    server = start_s3("bench")
    try:
        uri = f"s3://bench/faults-{rate}"
        lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=256, group_size=GROUP,
                          storage_options=server.options())
        start_at = time.time() + 4.0 + WARMUP_S
        policy = _PhasePolicy(rate, start_at + phase, start_at + 2 * phase)
        with FaultProxy(server.url, policy) as proxy:
            options = proxy.options(server.options())
            runs = run_workers(_producer, [(uri, options, k, start_at, phase)
                                           for k in range(PRODUCERS)],
                               WARMUP_S + 3 * phase + 300)
            injected = proxy.injected
    finally:
        server.stop()
    stop = start_at + 2 * phase
    clean = [_rate(runs, start_at, start_at + phase), _rate(runs, stop + phase / 2,
                                                            stop + phase)]
    baseline = sum(clean) / 2
    faulty = _rate(runs, start_at + phase, stop)
    # None: not within the last phase
    resumed = [min((t - stop for t, _ in r["series"] if stop <= t < stop + phase), default=None)
               for r in runs]
    back = next((t + 1.0 - stop for t in (stop + 0.1 * i for i in range(int(10 * phase) - 10))
                 if _rate(runs, t, t + 1.0) >= RECOVERED_AT * baseline), None)
    timeline = [(t - start_at, _rate(runs, t, t + 0.5))
                for t in (start_at + 0.5 * i for i in range(int(6 * phase)))]
    return {"rate": rate, "phase_s": phase, "baseline_samples_per_s": baseline,
            "clean_samples_per_s": clean, "faulty_samples_per_s": faulty,
            "ratio": faulty / baseline, "injected": injected,
            "resumed_s": resumed, "recovered_s": back, "timeline": timeline,
            "per_producer": [[_rate([r], start_at + i * phase, start_at + (i + 1) * phase)
                              for i in range(3)] for r in runs],
            "conflicts": sum(r["conflicts"] for r in runs),
            "attempts": sum(r["attempts"] for r in runs)}


def fairness(phase: float) -> dict[str, list[int]]:
    """Fragments each producer committed in one fault-free phase, straight to the server and
    through the proxy with no faults: what the proxy itself does to the producers."""
    from tests.faultproxy import FaultProxy
    from tests.s3server import start_s3

    server = start_s3("bench")
    shares: dict[str, list[int]] = {}
    try:
        for via in ("direct", "proxy"):
            proxy = FaultProxy(server.url) if via == "proxy" else None
            options = proxy.options(server.options()) if proxy else server.options()
            uri = f"s3://bench/fairness-{via}"
            lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=256,
                              group_size=GROUP, storage_options=options)
            start_at = time.time() + 4.0 + WARMUP_S
            runs = run_workers(_producer, [(uri, options, k, start_at, phase / 3)
                                           for k in range(PRODUCERS)], WARMUP_S + phase + 300)
            if proxy is not None:
                proxy.stop()
            shares[via] = sorted(round(_rate([r], start_at, start_at + phase) * phase / GROUP)
                                 for r in runs)
    finally:
        server.stop()
    return shares


def _slowest(run: dict[str, Any]) -> float | None:
    """When the last producer committed again after the faults stopped."""
    resumed = run["resumed_s"]
    return None if None in resumed else max(resumed)


def _seconds(s: float | None) -> str:
    return "not within the phase" if s is None else f"{s:.1f} s"


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median ratio of one rate's repetitions, with its min-max, and the worst recovery."""
    ratios = sorted(r["ratio"] for r in runs)
    slowest = [_slowest(r) for r in runs]
    back = [r["recovered_s"] for r in runs]
    known = [s for s in slowest if s is not None]
    return {"rate": runs[0]["rate"], "repeats": len(runs), "ratios": ratios,
            "ratio_median": statistics.median(ratios), "ratio_min": ratios[0],
            "ratio_max": ratios[-1],
            "every_producer_s_max": max(known) if len(known) == len(runs) else None,
            "recovered_s_max": None if None in back else max(back)}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = result["summary"]
    fig, axes = plt.subplots(1, len(summaries), figsize=(6 * len(summaries), 3.8),
                             sharey=True)
    for ax, sm in zip(axes, summaries, strict=True):
        runs = [r for r in result["runs"] if r["rate"] == sm["rate"]]
        for k, r in enumerate(runs):
            ax.plot([t for t, _ in r["timeline"]], [v for _, v in r["timeline"]], lw=0.8,
                    label=f"repetition {k + 1}: {r['ratio']:.2f}x")
        ax.axvspan(runs[0]["phase_s"], 2 * runs[0]["phase_s"], color="red", alpha=0.15,
                   label=f"{100 * sm['rate']:.0f}% 503s")
        ax.set_xlabel("s from the end of the warm-up")
        ax.set_title(f"{100 * sm['rate']:.0f}% 503s: median {sm['ratio_median']:.2f}x "
                     f"({sm['ratio_min']:.2f}-{sm['ratio_max']:.2f}) fault-free; after: "
                     f"every producer within {_seconds(sm['every_producer_s_max'])}",
                     fontsize=9)
        ax.legend(loc="lower left", fontsize=7)
    axes[0].set_ylabel("committed samples/s (0.5 s bins)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per rate")
    args = parser.parse_args()
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "s3": "SeaweedFS 4.48 on 127.0.0.1"},
        "command": command("faults"), "producers": PRODUCERS,
        "warmup_s": WARMUP_S, "backoff_cap_s": S3Options().backoff_cap_s, "runs": []}
    # The store retries a 503 up to its backoff cap; recovering within twice that is the goal.
    for rep in range(args.repeats):
        for rate in RATES:
            r = run(rate, args.phase)
            r["repetition"] = rep + 1
            result["runs"].append(r)
            print(f"{100 * rate:3.0f}% 503s: {r['faulty_samples_per_s']:7.0f} samples/s vs "
                  f"{r['baseline_samples_per_s']:7.0f} fault-free = {r['ratio']:.2f}x; "
                  f"{r['injected']} injected; once they stopped, throughput back to "
                  f"{RECOVERED_AT}x in {_seconds(r['recovered_s'])}, every producer "
                  f"committed again in {_seconds(_slowest(r))}", flush=True)
    result["summary"] = [summarise([r for r in result["runs"] if r["rate"] == rate])
                         for rate in RATES]
    for sm in result["summary"]:
        print(f"{100 * sm['rate']:3.0f}% 503s: median {sm['ratio_median']:.2f}x "
              f"({sm['ratio_min']:.2f}-{sm['ratio_max']:.2f}) of {sm['repeats']}", flush=True)
    result["fairness_fragments"] = fairness(args.phase)
    print("fragments per producer, fault-free, straight to the server vs through the proxy:",
          result["fairness_fragments"], flush=True)
    save("faults.json", result)
    plot(result, RESULTS / "faults.png")


if __name__ == "__main__":
    main()
