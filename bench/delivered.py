"""What the trainer sees of freshness: from each sample's ``write()`` to its delivery in a
batch by a ``StreamDataset`` tailing the stream on the same host.

Usage: .venv/bin/python -m bench.delivered [--producers 4] [--rate 100] [--duration 6]
       [--reps 3] [--request-ms 5]
Writes bench/results/delivered.json (delivered-<ms>ms.json with ``--request-ms``).

``--request-ms m`` holds every request each process makes to the store (a put, a get, a
ranged get, a head, a listing, a delete) m ms before it is made: a store that far away,
on the same cores. With ``--s3`` the stream is on SeaweedFS on 127.0.0.1 instead (the
readers and producers then run as on any object store: ``is_remote``), reached through
the tests' fault proxy holding each request those m ms where m is given, directly if not.

N producer processes each write a group of 4 samples (64 tokens each) every 1/rate seconds
on a fixed schedule, from a start every process waits for once it is ready, each sample
carrying the time its ``write()`` was called. One process
iterates ``StreamDataset(uri, group=None)`` (global batch 16, the defaults) and notes when
each batch arrives; latency is arrival minus write time, per sample, also by the second of
the run a sample was written in. Also: commits per producer, fragments per step, and the
CPU seconds of the reader and of each producer from the start on. The
stream is on tmpfs; repetitions run one after another.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.latency import delay_requests
from bench.output import RESULTS
from bench.reps import median
from bench.spawn import run_workers

G, B, TOKENS = 4, 16, 64


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([("tokens", pa.list_(pa.int32())), ("producer", pa.int32()),
                      ("written", pa.float64())])


START_MARGIN_S = 1.0
"""The run starts this long after the last process is ready (opened, its one-time work
under way): the latency measured is a running system's, not the processes' start-up on
busy cores (which, started on a fixed clock 4 s ahead, left a reader seconds behind in one
repetition of three and on time in the next)."""


def _start_at(gate: str, name: str, processes: int) -> float:
    """Marks this process ready in the folder ``gate`` and waits for ``processes`` to be;
    returns the time the run starts at, the same in each (from the last mark's time)."""
    Path(gate, name).touch()
    deadline = time.time() + 300
    while len(marks := list(Path(gate).iterdir())) < processes:
        if time.time() > deadline:
            raise TimeoutError(f"{len(marks)} of {processes} processes ready")
        time.sleep(0.01)
    return max(m.stat().st_mtime for m in marks) + START_MARGIN_S


def _producer(uri: str, options: dict[str, str] | None, k: int, gate: str,
              processes: int, duration: float, rate: float, out: Any) -> None:
    import numpy as np

    from lakestream.producers import Producer

    tokens = [list(range(TOKENS))] * G
    with Producer(uri, f"p{k}", storage_options=options) as p:
        start_at = _start_at(gate, f"p{k}", processes)
        cpu = time.process_time()
        time.sleep(max(0.0, start_at - time.time()))
        for n in range(int(duration * rate)):
            time.sleep(max(0.0, start_at + n / rate - time.time()))
            p.write({"tokens": tokens, "producer": np.full(G, k, np.int32),
                     "written": np.full(G, time.time())})
        p.flush()
        out.put({"k": k, "commits": p.stats.commits, "conflicts": p.stats.conflicts,
                 "cpu_s": time.process_time() - cpu})


def _reader(uri: str, options: dict[str, str] | None, expected: int, gate: str,
            processes: int, timeout: float, out: Any) -> None:
    from lakestream.loaders import StreamDataset

    ds = StreamDataset(uri, group=None, timeout=timeout, max_steps=expected // B,
                       storage_options=options)
    start = _start_at(gate, "reader", processes)
    cpu = time.process_time()
    lat: list[float] = []
    by: dict[int, list[float]] = {}
    written: list[float] = []
    began, first = time.time(), None
    for batch in ds:
        now = time.time()
        first = first or now
        for w, k in zip(batch["written"].tolist(), batch["producer"].tolist(), strict=True):
            lat.append(now - w)
            written.append(w)
            by.setdefault(int(k), []).append(now - w)
    stream = ds.mix.streams[0]
    out.put({"reader": True, "cpu_s": time.process_time() - cpu, "lat": lat, "by": by,
             "written": written, "began": began,
             "start": start,
             "first": first,
             "fragments": sum(1 for _ in stream.state.all_fragments()),
             "versions": stream.version})


def _s3(request_ms: float) -> tuple[Any, Any]:
    """SeaweedFS on 127.0.0.1, and the fault proxy before it holding every request."""
    from tests.faultproxy import FaultProxy
    from tests.s3server import start_s3

    server = start_s3("bench")
    return server, FaultProxy(server.url, lambda r: "slow" if request_ms else None,
                              slow_s=request_ms / 1e3)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def run(producers: int, rate: float, duration: float, root: str, request_ms: float = 0.0,
        s3: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """One run; on ``s3`` (a server and the proxy in front of it) if given."""
    import lakestream

    options = None
    if s3 is None:
        uri = tempfile.mkdtemp(dir=root) + "/s"
    else:
        uri = f"s3://bench/delivered-{time.time_ns()}"
        options = s3[1].options(s3[0].options()) if request_ms else s3[0].options()
        request_ms = 0.0  # the proxy holds the requests, if any
    lakestream.create(uri, _schema(), global_batch_size=B, group_size=G,
                      storage_options=options)
    gate = tempfile.mkdtemp(dir=root)  # where each process marks itself ready
    expected = producers * int(duration * rate) * G
    args: list[tuple[Any, ...]] = [(uri, options, k, gate, producers + 1, duration, rate)
                                   for k in range(producers)]
    results = run_workers(_dispatch, [("p", request_ms, *a) for a in args]
                          + [("r", request_ms, uri, options, expected, gate, producers + 1,
                              duration + 360)], timeout=900)
    reader = next(r for r in results if r.get("reader"))
    start = reader["start"]
    commits = sorted(r["commits"] for r in results if "k" in r)
    per = {k: 1e3 * _pct(v, 0.99) for k, v in reader["by"].items()}
    seconds: dict[int, list[float]] = {}  # by the second of the run each was written in
    for w, x in zip(reader["written"], reader["lat"], strict=True):
        seconds.setdefault(int(w - start), []).append(x)
    return {"producers": producers, "rate": rate, "duration": duration,
            "samples": len(reader["lat"]), "p50_ms": 1e3 * _pct(reader["lat"], 0.5),
            "p99_ms": 1e3 * _pct(reader["lat"], 0.99), "p99_ms_by_producer": per,
            "p99_max_over_min": max(per.values()) / max(1e-9, min(per.values())),
            "reader_began_s": reader["began"] - start,
            "first_batch_s": (reader["first"] or start) - start,
            "p50_p99_ms_by_second": [(round(1e3 * _pct(v, 0.5)), round(1e3 * _pct(v, 0.99)))
                                     for _, v in sorted(seconds.items())],
            "commits": commits, "fragments": reader["fragments"],
            "reader_cpu_s": reader["cpu_s"],
            "producers_cpu_s": sorted(round(r["cpu_s"], 2) for r in results if "k" in r),
            "versions": reader["versions"],
            "fragments_per_step": reader["fragments"] / max(1, len(reader["lat"]) // B)}


def _dispatch(kind: str, request_ms: float, *args: Any) -> None:
    if request_ms:
        delay_requests(request_ms / 1e3)
    (_producer if kind == "p" else _reader)(*args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--request-ms", type=float, default=0.0,
                    help="hold every store request this long (default: 0)")
    ap.add_argument("--s3", action="store_true",
                    help="the stream on SeaweedFS, --request-ms held by a proxy")
    ap.add_argument("--out", help="default: bench/results/delivered[-s3][-<ms>ms].json")
    args = ap.parse_args()
    args.out = args.out or str(RESULTS / ("delivered" + ("-s3" if args.s3 else "") + (
        f"-{args.request_ms:g}ms" if args.request_ms else "") + ".json"))
    root = "/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir()
    reps = []
    s3 = _s3(args.request_ms) if args.s3 else None
    try:
        for rep in range(args.reps):
            r = run(args.producers, args.rate, args.duration, root, args.request_ms, s3)
            reps.append(r)
            print(rep, {k: v for k, v in r.items() if k != "p99_ms_by_producer"}, flush=True)
    finally:
        for part in reversed(s3 or ()):
            part.stop()
    p99 = [r["p99_ms"] for r in reps]
    summary = {"request_ms": args.request_ms, "s3": args.s3, "reps": reps,
               "p50_ms": median([r["p50_ms"] for r in reps]),
               "p99_ms": median(p99), "p99_ms_min": min(p99), "p99_ms_max": max(p99)}
    RESULTS.mkdir(exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(f"write -> delivered p50 {summary['p50_ms']:.0f} ms, p99 {summary['p99_ms']:.0f} ms "
          f"({summary['p99_ms_min']:.0f}-{summary['p99_ms_max']:.0f})")


if __name__ == "__main__":
    main()
