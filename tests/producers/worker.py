"""A producer process for crash tests: resumes from its committed cursor, writes the rest.

Usage: python -m tests.producers.worker URI PRODUCER_ID FRAGMENTS ROWS OPTIONS_JSON [POLICY
[SHARE [MAX_INTERVAL_S]]]
``WORKER_WRITE_EVERY_S`` in the environment paces the writes (default: as fast as it can).
Fragment i of producer k holds ids k*1_000_000 + i*ROWS ... + ROWS-1; the state committed with
it is {"next": i + 1}. Exits 0 when every fragment is committed.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pyarrow as pa

from lakestream.producers import Producer, ProducerOptions
from tests.helpers import rows


def fragment(producer_index: int, i: int, n: int) -> pa.Table:
    return rows(producer_index * 1_000_000 + i * n, n)


def main() -> None:
    uri, producer_id, total, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    options = json.loads(sys.argv[5]) or None
    policy = sys.argv[6] if len(sys.argv) > 6 else "adaptive"
    share = sys.argv[7] if len(sys.argv) > 7 and sys.argv[7] != "-" else None
    max_interval_s = float(sys.argv[8]) if len(sys.argv) > 8 else 5.0
    index = int(producer_id.rsplit("-", 1)[1])
    with Producer(uri, producer_id, storage_options=options,
                  options=ProducerOptions(commit_policy=policy,  # type: ignore[arg-type]
                                          share_commits=share,  # type: ignore[arg-type]
                                          max_interval_s=max_interval_s)) as p:
        start = p.state["next"] if p.state else 0
        pace = float(os.environ.get("WORKER_WRITE_EVERY_S", 0))
        for i in range(start, total):
            p.write(fragment(index, i, n), state={"next": i + 1})
            time.sleep(pace)
        p.flush()
        stats = p.stats
        print(json.dumps({"commits": stats.commits, "conflicts": stats.conflicts,
                          "attempts": stats.attempts,
                          "fragments": stats.fragments_committed}), flush=True)


if __name__ == "__main__":
    main()
