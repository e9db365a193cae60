"""What the object store serves a training job, counted, and the model of it at 64 and 512
ranks.

Usage: .venv/bin/python -m bench.requests [--ranks 8] [--rest 4] [--load 10] [--rate 25]
Writes bench/results/requests.json.

SeaweedFS on 127.0.0.1. ``--ranks`` processes (one host) each read their slice of a stream
through a ``StreamDataset`` (rank 0 with the consumer group, so it publishes progress), at
rest for ``--rest`` seconds, then while two producers each write ``--rate`` one-group
fragments a second (8 samples of 64-192 tokens; steps of 64, so each rank's slice of a step
is one group) for ``--load`` seconds. Each rank counts the requests its process sends, by
kind (GET of a whole object, a range or a buffer; HEAD; LIST; PUT; DELETE) and prefix (the
log, fragments, the rest of ``_lakestream/``), GETs of the log split into those that found an
entry and those that found nothing.

The whole run is made twice, each on a fresh stream: with the log's head shared by the
host's processes (``lakestream.log.hosthead``, the default) and with each process alone
(``LAKESTREAM_HOST_DIR=off``).

``model`` (a pure function, tested in ``tests/test_request_model.py``) scales those
rates to H hosts of R ranks: per poller of the log (a host, or a process), one GET per
version committed plus the reads that find nothing (at rest, one each ``POLL_REST_S``
within the budget ``EMPTY_POLLS_PER_S``, 18 a second; under load, as counted: the host's,
or a process's), and the fragments' GETs one per fragment a rank's slice touches, a step;
per host, with a shared disk cache, one per fragment the host's ranks touch; rank 0's
progress PUT once a second. It says what the log's prefix is asked for a second with a
poller per process and per host, against S3's 5,500 GETs a second per prefix.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

from bench.output import command, save
from bench.spawn import run_workers
from lakestream.log.head import EMPTY_POLLS_PER_S, POLL_REST_S
from lakestream.log.hosthead import ENV as HOST_DIR

PREFIX_GETS_PER_S = 5500
"""S3's documented GET (and HEAD) rate per partitioned prefix."""
REST_EMPTY_READS_PER_S = min(1 / POLL_REST_S, EMPTY_POLLS_PER_S)
"""A process's polls of a stream at rest on a remote store: one each
``lakestream.log.head.POLL_REST_S``, within the budget of reads that find nothing
(``EMPTY_POLLS_PER_S``)."""
GROUP, STEP = 8, 64
MODES = ("per host", "per process")
"""The log's head shared by the processes of the host (the default), or by each alone
(``LAKESTREAM_HOST_DIR=off``)."""


def model(hosts: int, ranks_per_host: int, versions_per_s: float, steps_per_s: float,
          fragments_per_rank_step: float, fragments_per_host_step: float,
          empty_reads_per_s: float = REST_EMPTY_READS_PER_S) -> dict[str, float]:
    """Requests a second of a job of ``hosts`` x ``ranks_per_host`` ranks reading a stream
    that commits ``versions_per_s`` log versions and ``steps_per_s`` steps a second (0: at
    rest), each rank's slice touching ``fragments_per_rank_step`` fragments a step and each
    host's ranks together ``fragments_per_host_step``; each poller's reads that find nothing
    are ``empty_reads_per_s``."""
    ranks = hosts * ranks_per_host
    log_per_poller = versions_per_s + empty_reads_per_s
    return {
        "ranks": ranks,
        "log_gets_per_poller_s": log_per_poller,
        "log_gets_per_s_head_per_process": ranks * log_per_poller,
        "log_gets_per_s_head_per_host": hosts * log_per_poller,
        "fragment_gets_per_s_no_cache": ranks * steps_per_s * fragments_per_rank_step,
        "fragment_gets_per_s_host_cache": hosts * steps_per_s * fragments_per_host_step,
        "progress_puts_per_s": 1.0,
        "log_prefix_share_per_process": ranks * log_per_poller / PREFIX_GETS_PER_S,
        "log_prefix_share_per_host": hosts * log_per_poller / PREFIX_GETS_PER_S,
    }


def _kind_prefix(method: str, key: str) -> str:
    prefix = "log" if key.startswith("_delta_log/") else "data" if key.startswith("data/") \
        else "meta"
    return f"{method} {prefix}"


def _rank(uri: str, options: dict[str, str], rank: int, ranks: int, rest_until: float,
          load_until: float, out: Any) -> None:
    from collections import Counter

    import lakestream
    from lakestream.loaders import StreamDataset
    from lakestream.store import Request, add_request_hook

    counts: Counter[str] = Counter()

    def counted(request: Request) -> None:  # each request once, however the store makes it
        name = _kind_prefix(request.op, request.key)
        counts[name] += 1
        if isinstance(request.error, lakestream.NotFoundError):
            counts[name + " empty"] += 1

    add_request_hook(counted)
    ds = StreamDataset(uri, group="train" if rank == 0 else None, rank=rank, world_size=ranks,
                       storage_options=options, timeout=0.2, progress_interval_s=1.0)
    steps, phase, rest = 0, "rest", Counter[str]()
    counts.clear()  # from here: opening is not what a running job sends
    t_rest = time.time()
    while time.time() < load_until:
        if phase == "rest" and time.time() >= rest_until:
            rest, phase = Counter(counts), "load"
            counts.clear()
            t_load = time.time()
        try:
            for _ in ds:
                steps += phase == "load"
                if time.time() >= load_until or phase == "rest" and time.time() >= rest_until:
                    break
        except lakestream.StepNotAvailableError:
            pass  # the timeout: look at the clock, then wait on
    ds.close()
    out.put({"rank": rank, "rest": dict(rest), "rest_s": rest_until - t_rest,
             "load": dict(counts), "load_s": time.time() - t_load, "steps": steps})


def _producer(uri: str, options: dict[str, str], k: int, rest_until: float, load_until: float,
              rate: float, out: Any) -> None:
    from bench import payload
    from lakestream.producers import Producer

    groups = [payload.rollouts(GROUP, GROUP, seed=n, min_tokens=64, max_tokens=192)
              for n in range(8)]
    n = 0
    with Producer(uri, f"p{k}", storage_options=options) as p:
        time.sleep(max(0.0, rest_until - time.time()))
        while time.time() < load_until - 0.5:
            time.sleep(max(0.0, rest_until + n / rate - time.time()))
            p.write(groups[n % 8])
            n += 1
        p.flush()
    out.put({"producer": k, "writes": n})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rest", type=float, default=4.0)
    ap.add_argument("--load", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=25.0, help="writes a second per producer")
    args = ap.parse_args()
    from tests.s3server import start_s3

    server = start_s3()
    try:
        runs = {mode: _measure(server.options(), args, mode) for mode in MODES}
    finally:
        server.stop()
    out: dict[str, Any] = {"args": vars(args), "command": command("requests"),
                           "time": time.ctime()}
    for mode, (ranks, measured) in runs.items():
        # The ranks are one host: a poller's reads that found nothing are the host's (one
        # poller) or a process's (one each).
        per_poller = args.ranks if mode == "per host" else 1
        empty = per_poller * measured.get("load: get log empty /rank/s", 0.0)
        out[mode] = {"ranks": ranks, "measured": measured, "model_load": {
            f"{h}x{per}": model(h, per, measured["versions_per_s"], measured["steps_per_s"],
                                measured["fragments_per_rank_step"],
                                measured["fragments_per_host_step"], empty)
            for h, per in ((8, 8), (64, 8))}}
    out["model_rest"] = {f"{h}x{per}": model(h, per, 0.0, 0.0, 0.0, 0.0, REST_EMPTY_READS_PER_S)
                         for h, per in ((8, 8), (64, 8))}
    save("requests.json", out)
    print(json.dumps({m: {"measured": out[m]["measured"], "model_load": out[m]["model_load"]}
                      for m in MODES} | {"model_rest": out["model_rest"]}, indent=1))


def _measure(options: dict[str, str], args: argparse.Namespace, mode: str
             ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One run of the ranks and producers on a fresh stream, the log's head shared by the
    host's processes (``mode`` "per host", the default) or by each process alone."""
    import lakestream
    from bench import payload
    from tests.s3server import BUCKET

    os.environ[HOST_DIR] = tempfile.mkdtemp() if mode == "per host" else "off"
    try:
        uri = f"s3://{BUCKET}/requests-{time.time_ns()}"
        lakestream.create(uri, payload.rollouts(GROUP, GROUP, seed=0).schema,
                          global_batch_size=STEP, group_size=GROUP, storage_options=options)
        start = time.time() + 12.0  # spawned ranks import torch and open first
        rest_until, load_until = start + args.rest, start + args.rest + args.load
        results = _run(uri, options, args, rest_until, load_until)
        stream = lakestream.open(uri, storage_options=options)
    finally:
        del os.environ[HOST_DIR]
    ranks = [r for r in results if "rank" in r]
    measured = _rates(ranks, stream.version / args.load, stream.num_steps / args.load,
                      len(stream.state.all_fragments()), stream.num_steps)
    return ranks, measured


def _run(uri: str, options: dict[str, str], args: argparse.Namespace, rest_until: float,
         load_until: float) -> list[dict[str, Any]]:
    return run_workers(_worker, [("r", uri, options, r, args.ranks, rest_until, load_until)
                                 for r in range(args.ranks)]
                       + [("p", uri, options, k, rest_until, load_until, args.rate)
                          for k in range(2)], timeout=load_until - time.time() + 120)


def _worker(kind: str, *args: Any) -> None:
    (_rank if kind == "r" else _producer)(*args)


def _rates(ranks: list[dict[str, Any]], versions_per_s: float, steps_per_s: float,
           fragments: int, steps: int) -> dict[str, float]:
    """Per rank and second, what the ranks sent at rest and under load (their mean), and
    the fragments a rank's slice and the host's ranks touch a step."""
    def mean(phase: str, name: str) -> float:
        return sum(r[phase].get(name, 0) / r[f"{phase}_s"] for r in ranks) / len(ranks)

    names = sorted({n for r in ranks for phase in ("rest", "load") for n in r[phase]})
    out: dict[str, float] = {"versions_per_s": versions_per_s, "steps_per_s": steps_per_s}
    for phase in ("rest", "load"):
        for n in names:
            out[f"{phase}: {n} /rank/s"] = mean(phase, n)
    data = sum(r["load"].get(f"{m} data", 0) for r in ranks
               for m in ("get", "get_buffer", "get_range"))
    read_steps = sum(r["steps"] for r in ranks) / len(ranks)
    out["fragments_per_rank_step"] = data / max(1, len(ranks) * read_steps)
    out["fragments_per_host_step"] = fragments / max(1, steps)
    return out


if __name__ == "__main__":
    main()
