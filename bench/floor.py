"""What a producer's stages cost alone: CPU per GB of Arrow data of a piece of work, and the
floors a producer's CPU is held against (encoding its tables, putting the bodies)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lakestream.log.fragments import encode_fragment


def cpu_per_gb(work: Callable[[int], Any], tables: list[Any], seconds: float) -> float:
    """CPU seconds per GB of Arrow data that ``work(i)`` costs for table ``i`` (round robin),
    run for ``seconds`` of CPU."""
    cpu0, n = time.process_time(), 0
    while time.process_time() - cpu0 < seconds:
        work(n % len(tables))
        n += 1
    return (time.process_time() - cpu0) / (sum(tables[i % len(tables)].nbytes
                                               for i in range(n)) / 1e9)


def floors(tables: list[Any], group_size: int, compression: str, store: Any, prefix: str,
           seconds: float) -> dict[str, float]:
    """The encode floor (``encode_fragment`` of ``tables`` with the producer's options) and
    what putting the encoded bodies under ``prefix`` of ``store`` costs, each alone."""
    bodies = [encode_fragment(t, group_size, compression=compression) for t in tables]
    puts = iter(range(1 << 62))
    return {
        "encode": cpu_per_gb(lambda i: encode_fragment(tables[i], group_size,
                                                       compression=compression),
                             tables, seconds),
        "put": cpu_per_gb(lambda i: store.put(f"{prefix}{next(puts)}.parquet", bodies[i],
                                              mode="create"), tables, seconds),
    }
