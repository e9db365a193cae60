"""Metadata at scale: what opening, holding, reading and producing cost on streams with 1k,
10k, 100k and 1M live fragments (local store), then the 20,000-version growth run.

Usage: .venv/bin/python -m bench.scale [--fragments 1000 10000 100000 1000000] [--rounds 21]
       [--no-growth] [--out scale.json]
Writes bench/results/scale.json and bench/results/scale.png (or ``--out`` and its plot).

Each stream has the same 100 versions (snapshot interval 10), each carrying a hundredth of its
fragments: the streams differ only in how many fragments are live. A fragment is one step of
16 rows; only the first and the last step's files exist (nothing else is read). Each figure
comes from fresh spawned processes (nothing cached from building the stream):

- open: ``lakestream.open``, median of 21 rounds that take every size in turn (sub-ms
  figures drift more between minutes than between sizes); with the requests and bytes.
- memory: resident memory a process gains by opening a handle, and by opening a Producer.
- read_step: the first and the last step on a fresh handle each time (so the index segment
  holding it is fetched), median of the same 21 rounds; after the process's first Arrow
  conversion, which imports pandas where it is installed (0.2 s here, once a process).
- producer: committed samples/s of one Producer writing 16-row fragments for 4 s.
- growth: 4 producers of small fragments until the log holds 20,000 versions; for each tenth
  of the versions, committed samples/s, the producers' CPU-ms per 1,000 samples in user space
  and in the kernel (a cost that grew with the log shows there even while the machine's speed
  varies), the share of the machine's time its host took (steal), and versions/s (how many
  commits carry the samples).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

import lakestream
from bench.output import RESULTS, command, save
from bench.spawn import run_workers

B = 16
VERSIONS = 100
"""Appends a stream is built in, at least: more where a commit would exceed the 10,000
fragments an entry may add."""
SCHEMA = pa.schema([("id", pa.int64()), ("tokens", pa.list_(pa.int32()))])


def _table(first: int) -> pa.Table:
    return pa.table({"id": list(range(first, first + B)),
                     "tokens": [[k] * 64 for k in range(first, first + B)]}, schema=SCHEMA)


def build(uri: str, fragments: int) -> None:
    """A stream of ``fragments`` one-step fragments in ``VERSIONS`` appends (or as many more
    as keep each to 10,000 fragments); the files of the first and last exist."""
    import zlib

    from lakestream.log.entries import Append, FragmentRef
    from lakestream.log.fragments import encode_fragment

    s = lakestream.create(uri, SCHEMA, global_batch_size=B, snapshot_interval=10)
    versions = max(VERSIONS, -(-fragments // 10_000))
    per = fragments // versions
    body_first = encode_fragment(_table(0), 1)
    body_last = encode_fragment(_table((fragments - 1) * B), 1)
    for v in range(versions):
        def entry(state: Any, cid: str, v: int = v) -> Append:
            refs = []
            for k in range(v * per, (v + 1) * per):
                body = body_first if k == 0 else body_last if k == fragments - 1 else None
                size, crc = (len(body), zlib.crc32(body)) if body else (1000, 7)
                refs.append(FragmentRef(f"data/_append/0-0-{k:09d}.parquet", B, size,
                                        state.next_offset + (k - v * per) * B, 0, crc))
            return Append(None, 0, tuple(refs), None, cid)

        s.commit(entry)
    s.store.put("data/_append/0-0-000000000.parquet", body_first)
    s.store.put(f"data/_append/0-0-{fragments - 1:09d}.parquet", body_last)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Metered:
    def __init__(self, inner: Any) -> None:
        self.inner, self.requests, self.bytes = inner, collections.Counter(), 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in ("get", "head", "list"):
            return attr

        def call(*a: Any, **k: Any) -> Any:
            self.requests[name] += 1
            out = attr(*a, **k)
            if name == "get":
                self.bytes += len(out)
            return out
        return call


def _probe(uri: str, what: str, out: Any) -> None:
    """One measurement in a fresh process."""
    import gc

    from lakestream.log.opening import load_state
    from lakestream.store import open_store

    gc.collect()
    before = _rss()
    if what == "open":
        store = _Metered(open_store(uri))
        t0 = time.perf_counter()
        load_state(store, uri)
        out.put({"s": time.perf_counter() - t0, "requests": dict(store.requests),
                 "bytes": store.bytes})
    elif what == "memory":
        s = lakestream.open(uri)
        gc.collect()
        out.put({"bytes": _rss() - before, "version": s.version})
    elif what == "producer_memory":
        from lakestream.producers import Producer

        p = Producer(uri, "probe")
        gc.collect()
        grown = _rss() - before
        p.close()
        out.put({"bytes": grown})
    elif what in ("first", "last"):
        s = lakestream.open(uri)
        step = 0 if what == "first" else s.num_steps - 1
        pa.array([0])  # pyarrow's first conversion imports pandas where installed (0.2 s)
        t0 = time.perf_counter()
        s.read_step(step)
        out.put({"s": time.perf_counter() - t0})
    elif what == "producer":
        from lakestream.producers import Producer

        table = _table(0)
        p = Producer(uri, "bench-producer")
        start = p.stream.num_samples
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 4.0:
            p.write(table)
        p.flush()
        elapsed = time.perf_counter() - t0
        s = lakestream.open(uri)
        out.put({"samples_per_s": (s.num_samples - start) / elapsed,
                 "commits": p.stats.commits})
        p.close()


def _runs(uri: str, what: str, n: int) -> list[dict[str, Any]]:
    return [run_workers(_probe, [(uri, what)], timeout=600)[0] for _ in range(n)]


def measure(root: str, sizes: list[int], rounds: int) -> list[dict[str, Any]]:
    """Builds a stream per size, then times opening and reading them in ``rounds``
    interleaved rounds (every size once per round), so that the machine's drift spreads
    over all sizes alike; memory and producing are measured per size after."""
    rows = []
    for fragments in sizes:
        t0 = time.perf_counter()
        build(f"{root}/s{fragments}", fragments)
        rows.append({"fragments": fragments, "build_s": time.perf_counter() - t0})
    timed: dict[tuple[int, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for _ in range(rounds):
        for fragments in sizes:
            for what in ("open", "first", "last"):
                timed[fragments, what] += _runs(f"{root}/s{fragments}", what, 1)
    for row in rows:
        fragments = row["fragments"]
        uri = f"{root}/s{fragments}"
        opens = timed[fragments, "open"]
        row.update({
            "open_s": statistics.median(r["s"] for r in opens),
            "open_requests": opens[0]["requests"], "open_bytes": opens[0]["bytes"],
            "handle_bytes": statistics.median(r["bytes"] for r in _runs(uri, "memory", 3)),
            "producer_bytes": statistics.median(
                r["bytes"] for r in _runs(uri, "producer_memory", 3)),
            "read_first_s": statistics.median(r["s"] for r in timed[fragments, "first"]),
            "read_last_s": statistics.median(r["s"] for r in timed[fragments, "last"]),
            "producer_samples_per_s": _runs(uri, "producer", 1)[0]["samples_per_s"],
        })
        print(f"{fragments:>9} fragments: open {1000 * row['open_s']:.2f} ms "
              f"{row['open_requests']} {row['open_bytes']} B; handle "
              f"{row['handle_bytes'] / 1e6:.1f} MB, producer "
              f"{row['producer_bytes'] / 1e6:.1f} MB; read_step first "
              f"{1000 * row['read_first_s']:.1f} ms last {1000 * row['read_last_s']:.1f} ms; "
              f"producer {row['producer_samples_per_s']:.0f} samples/s "
              f"(built in {row['build_s']:.0f} s)", flush=True)
    return rows


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["streams"]
    xs = [r["fragments"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    axes[0].plot(xs, [1000 * r["open_s"] for r in rows], "o-", label="open")
    axes[0].plot(xs, [1000 * r["read_first_s"] for r in rows], "s--", label="read_step first")
    axes[0].plot(xs, [1000 * r["read_last_s"] for r in rows], "^--", label="read_step last")
    axes[0].set_ylabel("ms")
    axes[1].plot(xs, [r["handle_bytes"] / 1e6 for r in rows], "o-", label="open handle")
    axes[1].plot(xs, [r["producer_bytes"] / 1e6 for r in rows], "s--", label="Producer")
    axes[1].set_ylabel("resident MB gained")
    axes[2].plot(xs, [r["producer_samples_per_s"] for r in rows], "o-", label="producer")
    axes[2].set_ylabel("committed samples/s")
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.set_xscale("log")
        ax.set_xlabel("live fragments")
        ax.legend()
        ax.grid(alpha=0.3)
    g = result.get("growth")
    if g:
        fig.suptitle("growth to {} versions, samples/s by tenth: {}".format(
            g["versions"], ", ".join(f"{x:.0f}" for x in g["decile_samples_per_s"])),
            fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fragments", type=int, nargs="+",
                        default=[1_000, 10_000, 100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=21,
                        help="interleaved rounds of the open and read_step timings")
    parser.add_argument("--growth-versions", type=int, default=20_000)
    parser.add_argument("--no-growth", action="store_true")
    parser.add_argument("--out", default="scale.json",
                        help="the results' file name in bench/results/ (its plot beside it)")
    args = parser.parse_args()
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "command": command("scale"), "streams": []}
    with tempfile.TemporaryDirectory() as root:
        result["streams"] = measure(root, args.fragments, args.rounds)
        if not args.no_growth:
            from bench import ingest

            g = ingest.growth(root, args.growth_versions, 4)
            result["growth"] = {k: v for k, v in g.items() if k != "points"}
            first = g["decile_samples_per_s"][0]
            result["growth"]["decile_over_first"] = [
                x / first for x in g["decile_samples_per_s"]]
            print("growth: samples/s by tenth", [round(x) for x in g["decile_samples_per_s"]],
                  "producer CPU-ms per 1k samples, user",
                  [round(x, 1) for x in g["decile_user_cpu_ms_per_1k_samples"]],
                  "system", [round(x, 1) for x in g["decile_system_cpu_ms_per_1k_samples"]],
                  "steal %", [round(100 * x, 1) for x in g["decile_steal_share"]],
                  "versions/s", [round(x) for x in g["decile_versions_per_s"]], flush=True)
    small, large = result["streams"][0], result["streams"][-1]
    result["large_over_small"] = {
        k: large[k] / small[k] for k in ("open_s", "handle_bytes", "producer_bytes",
                                         "read_first_s", "read_last_s")}
    print("largest / smallest:", json.dumps(result["large_over_small"]))
    save(args.out, result)
    plot(result, RESULTS / Path(args.out).with_suffix(".png").name)


if __name__ == "__main__":
    main()
