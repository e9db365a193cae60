"""Time and count the store requests of opening a local stream as its log grows.

Usage: .venv/bin/python -m bench.open_cost [--versions 200 2000 20000]
Writes bench/results/open_cost.json.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
from typing import Any

import pyarrow as pa

import lakestream
from bench.output import save
from lakestream.log.entries import Fence
from lakestream.log.opening import load_state
from lakestream.store import open_store


class Counting:
    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, collections.Counter()
        self.uri = inner.uri

    def __getattr__(self, name: str) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            self.calls[name] += 1
            return getattr(self.inner, name)(*a, **k)
        return call


def measure(root: str, versions: int) -> dict[str, Any]:
    uri = f"{root}/v{versions}"
    s = lakestream.create(uri, pa.schema([("x", pa.int64())]), global_batch_size=1)
    for e in range(1, versions):
        s.commit(lambda _s, cid, e=e: Fence("p", e, cid))
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        lakestream.open(uri)
        times.append(time.perf_counter() - t0)
    counting = Counting(open_store(uri))
    load_state(counting, uri)
    return {"versions": versions, "open_ms_median": 1000 * statistics.median(times),
            "requests": dict(counting.calls)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--versions", type=int, nargs="+", default=[200, 2_000, 20_000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        rows = [measure(root, v) for v in args.versions]
    for r in rows:
        print(f"{r['versions']:>7} versions: open {r['open_ms_median']:.2f} ms, "
              f"requests {r['requests']}")
    save("open_cost.json", rows, indent=2)


if __name__ == "__main__":
    main()
