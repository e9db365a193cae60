"""Many readers tailing one stream while a producer writes: GETs per second on the log
prefix, and produce -> visible latency, for 1 and 64 readers, on the local store and on a
SeaweedFS S3 server on 127.0.0.1; readers sharing the process's poll of the head (what
loaders do) beside readers that each poll alone (what they did before), interleaved.

Each reader is a thread with its own stream handle and step reader, as ranks' readers or
DataLoader workers of one process are; one producer process appends a step every
``--interval`` seconds and records when each landed. A reader waits for each step as a
loader does (``StepReader.wait_visible``) and notes when it became visible; latency is that
minus the step's commit. Readers do not decode the steps: 64 decoding threads would measure
2 cores' decoding, not the tailing. Readers of one process share one
poll of the log head (``lakestream/log/head.py``); readers in separate processes each poll, so
there the GETs grow with the processes (not measured here).

Usage: .venv/bin/python -m bench.tailing [--readers 1 64] [--steps 100] [--interval 0.05]
Writes bench/results/tailing.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import tempfile
import threading
import time
from collections import Counter
from typing import Any

import lakestream
from bench import payload
from bench.output import command, save
from bench.reps import median
from lakestream.loaders.reader import StepReader
from lakestream.store import Request, add_request_hook

B = 16
_gets: Counter[str] = Counter()


def _count(request: Request) -> None:
    if request.op == "get" and request.key.startswith("_delta_log/"):
        _gets["log"] += 1  # a Counter update: atomic enough under the GIL for a tally


def _producer(uri: str, options: dict[str, str] | None, steps: int, interval: float,
              start_at: float, out: Any) -> None:
    s = lakestream.open(uri, storage_options=options)
    table = payload.rollouts(B, B, seed=1, min_tokens=16, max_tokens=32)
    time.sleep(max(0.0, start_at - time.time()))
    committed = []
    for k in range(steps):
        time.sleep(max(0.0, start_at + k * interval - time.time()))
        s.append(table)
        committed.append(time.time())
    out.put(committed)


def _wait_alone(stream: lakestream.Stream, step: int) -> None:
    """How every reader waited before the shared head: its own GETs, the same backoff."""
    delay = 0.005
    while stream.num_steps <= step:
        stream.refresh()
        if stream.num_steps > step:
            return
        time.sleep(delay)
        delay = min(0.5, delay * 2)


def run(uri: str, options: dict[str, str] | None, readers: int, steps: int,
        interval: float, shared: bool) -> dict[str, Any]:
    lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=B, group_size=B,
                      storage_options=options)
    seen: list[list[float]] = [[] for _ in range(readers)]

    def read(k: int) -> None:
        stream = lakestream.open(uri, storage_options=options)
        reader = StepReader(stream, 0, 1, prefetch=0, timeout=60)
        for step in range(steps):
            # The tailing alone: 64 decoding threads would swamp 2 cores.
            if shared:
                reader.wait_visible(step)
            else:
                _wait_alone(stream, step)
            seen[k].append(time.time())

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0
    proc = ctx.Process(target=_producer, args=(uri, options, steps, interval, start_at, out))
    proc.start()
    threads = [threading.Thread(target=read, args=(k,)) for k in range(readers)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, start_at - time.time()))
    gets0, t0 = _gets["log"], time.time()
    committed = out.get(timeout=steps * interval + 120)
    for t in threads:
        t.join(120)
    elapsed = time.time() - t0
    gets = _gets["log"] - gets0
    proc.join()
    latencies = sorted(v - c for r in seen for v, c in zip(r, committed, strict=True))
    return {"readers": readers, "shared": shared, "steps": steps, "log_gets": gets,
            "log_gets_per_s": gets / elapsed,
            "visible_p50_ms": 1000 * latencies[len(latencies) // 2],
            "visible_p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--readers", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from tests.s3server import start_s3

    add_request_hook(_count)
    server = start_s3("bench")
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory() as root:
            for rep in range(args.reps):
                for store in ("local", "s3"):
                    for n in args.readers:
                        for shared in (True, False):
                            name = f"{store}-{n}-{shared}-{rep}"
                            uri = f"{root}/{name}" if store == "local" else f"s3://bench/{name}"
                            opts = None if store == "local" else server.options()
                            r = run(uri, opts, n, args.steps, args.interval, shared) | {
                                "store": store, "rep": rep}
                            rows.append(r)
                            print(f"rep {rep} {store:5} {n:3} readers "
                                  f"{'shared' if shared else 'alone':6} "
                                  f"{r['log_gets_per_s']:7.1f} log GETs/s, visible p50 "
                                  f"{r['visible_p50_ms']:6.1f} ms p99 "
                                  f"{r['visible_p99_ms']:6.1f} ms", flush=True)
    finally:
        server.stop()
    summary = []
    for store, n, shared in ((st, n, sh) for st in ("local", "s3") for n in args.readers
                             for sh in (True, False)):
        mine = [r for r in rows if r["store"] == store and r["readers"] == n
                and r["shared"] == shared]
        if mine:
            summary.append({"store": store, "readers": n, "shared": shared,
                            "log_gets_per_s": median([r["log_gets_per_s"] for r in mine]),
                            "visible_p50_ms": median([r["visible_p50_ms"] for r in mine]),
                            "visible_p99_ms": median([r["visible_p99_ms"] for r in mine])})
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "platform": platform.platform()},
              "command": command("tailing"), "reps": args.reps,
              "interval_s": args.interval, "runs": rows, "summary": summary}
    print(json.dumps(summary, indent=1))
    save("tailing.json", result)


if __name__ == "__main__":
    main()
