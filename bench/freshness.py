"""Freshness benchmark: how soon a sample written by a producer is seen by a tailing trainer.

Usage: .venv/bin/python -m bench.freshness [--producers 1 4 8] [--stores local s3]
       [--rate 100] [--duration 6] [--reps 3] [--share none host store] [--hosts 1]
       [--put-ms 0]
Writes bench/results/freshness.json and bench/results/freshness.png.

N producer processes each write one GRPO group (16 samples, ~16 KB) every 1/rate seconds, on
a fixed schedule, and record when each ``write()`` was called. One reader process tails the
stream as a StreamDataset's reader waits for a step (``StepReader.wait_visible``: poll the
log through the process's shared head, sleep within the reader's bounds), step after step.
After every poll it records the time and what the view holds (each producer's committed
seq, the samples committed). From that:

- committed-visible: from a group's ``write()`` to the reader's first view holding its seq;
- step-readable: from a group's ``write()`` to the reader's first view holding the whole step
  its samples fall in (global batch 64: four groups);
- commits per producer (with ``--share host`` or ``store``, the entries each put for the
  host), and
  the reader's GETs of log entries per second, under load and at
  rest (two seconds of no writes before the producers start).

``--hosts h`` splits the producers among h hosts (each its own host folder, as on h
machines); ``--put-ms m`` makes each put of a log entry (the conditional put) return m ms
later in the producers, as a slower store's would, and every request of the pooled runs
(``--share store``: their puts, lists, gets and deletes) too.

Configurations run interleaved, repetition by repetition; each figure is the median
repetition with its min-max. The local store is a folder on tmpfs (``--local-dir``); S3 is
a SeaweedFS server on 127.0.0.1 started here.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import payload
from bench.output import RESULTS
from bench.reps import median
from bench.spawn import run_workers

GROUP, B = 16, 64
REST_S = 2.0
"""Seconds the reader tails an idle stream before the producers start (its GETs at rest)."""


def _group(k: int, n: int) -> Any:
    table = payload.rollouts(GROUP, GROUP, seed=n % 8, min_tokens=64, max_tokens=192)
    return table.set_column(0, "prompt_id", payload.pa.array([k * 1_000_000 + n] * GROUP,
                                                             payload.pa.int64()))


def _producer(uri: str, options: dict[str, str] | None, k: int, start_at: float,
              duration: float, rate: float, share: str | None, host_dir: str | None,
              put_ms: float, out: Any) -> None:
    from lakestream.producers import Producer, ProducerOptions
    from lakestream.store import Request, add_request_hook

    if host_dir is not None:
        os.environ["LAKESTREAM_HOST_DIR"] = host_dir

    def slow_put(r: Request) -> None:  # a log entry's put, and every request of the pool
        if r.op == "put" and r.key.startswith("_delta_log/") and r.key.endswith(".json") \
                or r.key.startswith("_lakestream/runs/"):
            time.sleep(put_ms / 1e3)

    if put_ms:
        add_request_hook(slow_put)

    groups = [_group(k, n) for n in range(8)]
    sent: list[float] = []
    landed: list[tuple[float, int]] = []  # (when, last seq) of each commit, as the writer saw
    with Producer(uri, f"p{k}", storage_options=options,
                  options=ProducerOptions(share_commits=share),  # type: ignore[arg-type]
                  on_commit=lambda seq: landed.append((time.time(), seq))) as p:
        resolved = _count_resolved()  # from here: opening's reads are not a commit's
        pooled = _count_pooled()
        time.sleep(max(0.0, start_at - time.time()))
        for n in range(int(duration * rate)):
            time.sleep(max(0.0, start_at + n / rate - time.time()))
            sent.append(time.time())
            p.write(groups[n % 8])
        p.flush()
    out.put({"k": k, "sent": sent, "landed": landed, "commits": p.stats.commits,
             "conflicts": p.stats.conflicts, "attempts": p.stats.attempts,
             "resolved": resolved[0], "pooled": pooled})


def _count_resolved() -> list[int]:
    """Counts this process's puts of log entries resolved early by reading their key (a
    HEAD that found it while the put went unanswered); ``[0]`` is the count."""
    from lakestream.store import Request, add_request_hook

    resolved = [0]

    def hook(r: Request) -> None:
        if r.op == "head" and r.key.startswith("_delta_log/") and r.error is None:
            resolved[0] += 1

    add_request_hook(hook)
    return resolved


def _count_pooled() -> dict[str, int]:
    """Counts this process's requests of the pooled runs (``--share store``), by kind."""
    from lakestream.store import Request, add_request_hook

    counts: dict[str, int] = {}

    def hook(r: Request) -> None:
        if r.key.startswith("_lakestream/runs/"):
            counts[r.op] = counts.get(r.op, 0) + 1

    add_request_hook(hook)
    return counts


def _reader(uri: str, options: dict[str, str] | None, start_at: float, until: float,
            expected: int, out: Any) -> None:
    import lakestream
    from lakestream.loaders.reader import StepReader
    from lakestream.reading import MixSteps
    from lakestream.store import Request, add_request_hook

    stream = lakestream.open(uri, storage_options=options)
    gets = {"n": 0, "empty": 0}

    def counted(r: Request) -> None:
        if r.op == "get" and r.key.startswith("_delta_log/"):
            gets["n"] += 1
            if isinstance(r.error, lakestream.NotFoundError):
                gets["empty"] += 1  # a poll that found no new version

    add_request_hook(counted)
    steps = MixSteps.single(stream)
    views: list[tuple[float, dict[str, int], int]] = []
    bounds = StepReader(steps, 0, 1, timeout=None)  # a dataset's reader: its poll bounds
    rest_gets = rest_empty = 0
    step = 0
    gets.update(n=0, empty=0)  # from here: opening is not polling
    rest_from = time.time()
    while time.time() < until and stream.num_samples < expected:
        if time.time() >= start_at and rest_gets == 0:
            rest_gets, rest_empty = max(1, gets["n"]), gets["empty"]
        if steps.ready(step):
            step += 1
            continue
        if steps.ended(step):
            break
        # As the reader waits for a step (StepReader.wait_visible), with the view recorded
        # after every poll.
        pause = steps.poll()
        s = stream.state
        views.append((time.time(), {p: ps.seq for p, ps in s.producers.items()},
                      s.next_offset))
        if not steps.ready(step):
            time.sleep(min(bounds.poll_max_s, max(bounds.poll_min_s, pause)))
    stream.refresh()
    offsets: dict[str, list[tuple[int, int]]] = {}
    for f in stream.state.all_fragments():  # data/<producer>/<epoch>-<seq>-<uuid>.parquet
        _, producer, name = f.path.split("/")
        offsets.setdefault(producer, []).append((int(name.split("-")[1]), f.offset))
    out.put({"views": views, "gets": gets["n"], "rest_gets": rest_gets,
             "rest_s": max(1e-9, start_at - rest_from),
             "empty": gets["empty"], "rest_empty": rest_empty, "offsets": offsets})


def _worker(kind: str, *args: Any) -> None:
    (_reader if kind == "r" else _producer)(*args)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1)))]


def run(store: str, producers: int, rate: float, duration: float, tmp: str,
        s3: dict[str, str] | None, share: str | None = None, hosts: int = 1,
        put_ms: float = 0.0) -> dict[str, Any]:
    import lakestream

    uri = f"s3://lakestream-test/fresh-{time.time_ns()}" if store == "s3" else \
        f"{tmp}/fresh-{time.time_ns()}"
    options = s3 if store == "s3" else None
    lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=B, group_size=GROUP,
                      storage_options=options)
    now = time.time()
    # Producers open (fence) first, then wait; on 2 cores each process takes ~0.3 s to
    # start, and a reader started after the writes began would count its own start.
    start_at = now + 3.0 + 0.3 * producers + REST_S
    until = start_at + duration + 30.0  # a reader far behind still sees everything
    expected = producers * int(duration * rate) * GROUP
    results = run_workers(
        _worker,
        [("r", uri, options, start_at, until, expected)] + [
            ("p", uri, options, k, start_at, duration, rate, share,
             f"{tmp}/host-{k % hosts}" if hosts > 1 else None, put_ms)
            for k in range(producers)],
        timeout=duration + 120)
    reader = next(r for r in results if "views" in r)
    sent = {f"p{r['k']}": r["sent"] for r in results if "sent" in r}
    landed = {f"p{r['k']}": r["landed"] for r in results if "sent" in r}
    commits = {f"p{r['k']}": r["commits"] for r in results if "sent" in r}
    conflicts = sum(r["conflicts"] for r in results if "sent" in r)
    pool_ops: dict[str, int] = {}
    for r in results:
        for op, n in r.get("pooled", {}).items():
            pool_ops[op] = pool_ops.get(op, 0) + n
    attempts = sum(r["attempts"] for r in results if "sent" in r)
    views = reader["views"]
    committed = [v[2] for v in views]  # never decreases
    visible: dict[str, list[float]] = {}
    readable: dict[str, list[float]] = {}
    committed_at: dict[str, list[float]] = {}  # write() -> the writer's commit landed
    for p, times in sent.items():
        seq_offset = dict(reader["offsets"].get(p, []))
        vis, red = [], []
        i = 0
        for seq, t in enumerate(times):
            while i < len(views) and views[i][1].get(p, -1) < seq:
                i += 1
            if i < len(views):
                vis.append(views[i][0] - t)
            offset = seq_offset.get(seq)
            if offset is not None:
                k = bisect.bisect_left(committed, (offset // B + 1) * B)
                if k < len(views):
                    red.append(views[k][0] - t)
        visible[p], readable[p] = vis, red
        marks, com, m = landed[p], [], 0
        for seq, t in enumerate(times):
            while m < len(marks) and marks[m][1] < seq:
                m += 1
            if m < len(marks):
                com.append(marks[m][0] - t)
        committed_at[p] = com
    loaded_s = max(1e-9, views[-1][0] - start_at) if views else 1.0
    rows = {p: {"p50_ms": 1e3 * _pct(v, 0.5), "p99_ms": 1e3 * _pct(v, 0.99),
                "max_ms": 1e3 * max(v), "n": len(v), "commits": commits[p],
                "readable_p50_ms": 1e3 * _pct(readable[p], 0.5) if readable[p] else None,
                "readable_p99_ms": 1e3 * _pct(readable[p], 0.99) if readable[p] else None}
            for p, v in visible.items() if v}
    allv = [x for v in visible.values() for x in v]
    p99s = [r["p99_ms"] for r in rows.values()]
    cs = list(commits.values())
    return {
        "store": store, "producers": producers, "rate": rate, "duration": duration,
        "share": share or "none", "hosts": hosts, "put_ms": put_ms,
        "p50_ms": 1e3 * _pct(allv, 0.5), "p99_ms": 1e3 * _pct(allv, 0.99),
        "max_ms": 1e3 * max(allv),
        "readable_p99_ms": 1e3 * _pct([x for v in readable.values() for x in v], 0.99),
        "landed_p50_ms": 1e3 * _pct([x for v in committed_at.values() for x in v], 0.5),
        "landed_p99_ms": 1e3 * _pct([x for v in committed_at.values() for x in v], 0.99),
        "worst_over_best_p99": max(p99s) / max(1e-9, min(p99s)),
        "commits_max_over_min": max(cs) / max(1, min(cs)),
        "conflict_rate": conflicts / max(1, attempts),
        "resolved_puts": sum(r.get("resolved", 0) for r in results if "sent" in r),
        "pool_requests_per_s": {op: n / duration for op, n in sorted(pool_ops.items())},
        "gets_per_s_at_rest": reader["rest_gets"] / reader["rest_s"],
        "gets_per_s_loaded": (reader["gets"] - reader["rest_gets"]) / loaded_s,
        "empty_gets_per_s_at_rest": reader["rest_empty"] / reader["rest_s"],
        "empty_gets_per_s_loaded": (reader["empty"] - reader["rest_empty"]) / loaded_s,
        "per_producer": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--producers", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--stores", nargs="+", default=["local", "s3"])
    ap.add_argument("--rate", type=float, default=100.0, help="writes per second per producer")
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--local-dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None,
                    help="where local streams go (default tmpfs: the disk's file creation, "
                         "~1 ms a file here, is not what is measured)")
    ap.add_argument("--share", nargs="+", default=["none"], choices=["none", "host", "store"],
                    help="commit sharing: none (each producer commits alone), host (the "
                         "producers, all of one host here, share commits); interleaved")
    ap.add_argument("--hosts", type=int, default=1,
                    help="hosts the producers are split among (a host folder each)")
    ap.add_argument("--put-ms", type=float, default=0.0,
                    help="ms added to each put of a log entry, in the producers")
    ap.add_argument("--out", default=str(RESULTS / "freshness.json"))
    args = ap.parse_args()
    server = None
    s3 = None
    if "s3" in args.stores:
        from tests.s3server import start_s3

        server = start_s3()
        s3 = server.options()
    runs = []
    configs = [(store, n, share) for store in args.stores for n in args.producers
               for share in args.share]
    try:
        with tempfile.TemporaryDirectory(dir=args.local_dir) as tmp:
            for rep in range(args.reps):
                for store, n, share in configs:
                    r = run(store, n, args.rate, args.duration, tmp, s3,
                            None if share == "none" else share, args.hosts, args.put_ms)
                    r["rep"] = rep
                    runs.append(r)
                    print(f"rep {rep} {store:5} {n} producers, share {share}: "
                          f"p50 {r['p50_ms']:6.1f} "
                          f"p99 {r['p99_ms']:6.1f} max {r['max_ms']:6.1f} ms; "
                          f"step-readable p99 {r['readable_p99_ms']:6.1f} ms; worst/best "
                          f"p99 {r['worst_over_best_p99']:.2f}; landed p50/p99 "
                          f"{r['landed_p50_ms']:.1f}/{r['landed_p99_ms']:.1f} ms; "
                          f"commits max/min "
                          f"{r['commits_max_over_min']:.2f}; conflicts "
                          f"{100 * r['conflict_rate']:.0f}%; GETs/s rest "
                          f"{r['gets_per_s_at_rest']:.0f} loaded "
                          f"{r['gets_per_s_loaded']:.0f} (empty: rest "
                          f"{r['empty_gets_per_s_at_rest']:.0f} loaded "
                          f"{r['empty_gets_per_s_loaded']:.0f})"
                          + (f"; pool requests/s {r['pool_requests_per_s']}"
                             if r["pool_requests_per_s"] else ""), flush=True)
    finally:
        if server is not None:
            server.stop()
    summary = []
    for store, n, share in configs:
        mine = [r for r in runs if (r["store"], r["producers"], r["share"]) ==
                (store, n, share)]
        row: dict[str, Any] = {"store": store, "producers": n, "share": share}
        for key in ("p50_ms", "p99_ms", "max_ms", "readable_p99_ms", "landed_p50_ms",
                    "landed_p99_ms", "worst_over_best_p99",
                    "commits_max_over_min", "conflict_rate", "gets_per_s_at_rest",
                    "gets_per_s_loaded", "empty_gets_per_s_at_rest",
                    "empty_gets_per_s_loaded"):
            xs = [r[key] for r in mine]
            row[key] = {"median": median(xs), "min": min(xs), "max": max(xs)}
        for op in sorted({op for r in mine for op in r.get("pool_requests_per_s", {})}):
            xs = [r["pool_requests_per_s"].get(op, 0.0) for r in mine]
            row[f"pool_{op}_per_s"] = {"median": median(xs), "min": min(xs), "max": max(xs)}
        summary.append(row)
    result = {"machine": f"{platform.node()}: {platform.platform()}, "
                         f"{len(os.sched_getaffinity(0))} cores",
              "args": vars(args), "summary": summary, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    plot(summary, Path(args.out).with_suffix(".png"))
    for row in summary:
        print(json.dumps({k: (v["median"] if isinstance(v, dict) else v)
                          for k, v in row.items()}))


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for store, share in dict.fromkeys((r["store"], r.get("share", "none")) for r in summary):
        rows = [r for r in summary if (r["store"], r.get("share", "none")) == (store, share)]
        xs = [r["producers"] for r in rows]
        for key, style in (("p50_ms", "o--"), ("p99_ms", "o-")):
            ys = [r[key]["median"] for r in rows]
            err = [[r[key]["median"] - r[key]["min"] for r in rows],
                   [r[key]["max"] - r[key]["median"] for r in rows]]
            name = store if share == "none" else f"{store} shared"
            ax.errorbar(xs, ys, yerr=err, fmt=style, capsize=3, label=f"{name} {key[:3]}")
    ax.set_xlabel("producers (100 writes/s each)")
    ax.set_ylabel("write() -> committed and visible, ms")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("freshness: medians of interleaved repetitions, min-max bars")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
