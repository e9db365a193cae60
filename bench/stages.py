"""Where one producer's CPU goes, stage by stage: the CPU time of the thread running each
stage (conform, the sample size check, encode, CRC-32, the store put, the committer), as the
producer counts it (``ProducerStats.cpu_s``), beside the same encode and put measured alone
in the same run.

One producer, local store, 16-sample RL fragments (~267 KB), flat out for ``--seconds``,
for each codec and upload-thread count, ``--reps`` interleaved repetitions (medians).

Usage: .venv/bin/python -m bench.stages [--seconds 5] [--reps 3]
Writes bench/results/stages.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from typing import Any

import lakestream
from bench import payload
from bench.floor import floors
from bench.output import RESULTS, command, save
from bench.reps import median
from lakestream.producers import Producer, ProducerOptions
from lakestream.store.local import LocalStore

RENAMED = {"committer": "committer (all)", "write call": "write call (all)"}
"""The stages of ``ProducerStats.cpu_s`` under the names the results have always had."""


def _alone(tables: list[Any], compression: str, seconds: float) -> dict[str, float]:
    """Encode, then put the encoded bodies to a fresh local store, each alone."""
    with tempfile.TemporaryDirectory(dir=RESULTS.parent) as root:
        alone = floors(tables, 16, compression, LocalStore(root), "data/p/", seconds)
    return {"encode alone": alone["encode"], "store put alone": alone["put"]}


def run(compression: str, threads: int, seconds: float) -> dict[str, Any]:
    tables = [payload.rollouts(16, 16, seed=s) for s in range(16)]
    gb_each = sum(t.nbytes for t in tables) / len(tables) / 1e9
    with tempfile.TemporaryDirectory(dir=RESULTS.parent) as root:
        lakestream.create(f"{root}/s", payload.ROLLOUT_SCHEMA, global_batch_size=256,
                          group_size=16)
        p = Producer(f"{root}/s", "p", options=ProducerOptions(compression=compression,
                                                                 upload_threads=threads))
        cpu0, wall0, n = time.process_time(), time.time(), 0
        while time.time() - wall0 < seconds:
            p.write(tables[n % len(tables)])
            n += 1
        p.close()
        cpu, wall = time.process_time() - cpu0, time.time() - wall0
        commits = p.stats.commits
    gb = n * gb_each
    stages = {RENAMED.get(k, k): v / gb for k, v in p.stats.cpu_s.items()}
    return {"compression": compression, "upload_threads": threads, "mb_per_s": gb / wall * 1e3,
            "producer_cpu_s_per_gb": cpu / gb, "commits_per_gb": commits / gb,
            "stages_cpu_s_per_gb": stages | _alone(tables, compression, 1.5)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    configs = [(c, t) for c in ("zstd", "none") for t in (2, 4)]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for _rep in range(args.reps):
        for c, t in configs:
            r = run(c, t, args.seconds)
            runs.setdefault((c, t), []).append(r)
            print(f"{c:5} {t} threads {r['mb_per_s']:6.0f} MB/s "
                  f"{r['producer_cpu_s_per_gb']:5.2f} CPU-s/GB " + " ".join(
                      f"{k} {v:.2f}" for k, v in sorted(r["stages_cpu_s_per_gb"].items())),
                  flush=True)
    rows = []
    for (c, t), rs in runs.items():
        stages = {k: median([r["stages_cpu_s_per_gb"][k] for r in rs])
                  for k in rs[0]["stages_cpu_s_per_gb"]}
        rows.append({"compression": c, "upload_threads": t,
                     "mb_per_s": median([r["mb_per_s"] for r in rs]),
                     "producer_cpu_s_per_gb": median([r["producer_cpu_s_per_gb"] for r in rs]),
                     "commits_per_gb": median([r["commits_per_gb"] for r in rs]),
                     "stages_cpu_s_per_gb": stages})
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "platform": platform.platform()},
              "command": command("stages"), "reps": args.reps, "rows": rows}
    save("stages.json", result)


if __name__ == "__main__":
    main()
