"""A StreamDataset whose handle is older than gc's compaction reads every committed step."""

from __future__ import annotations

import time

import lakestream
from lakestream.loaders import StreamDataset
from tests.helpers import SCHEMA, rows

B, K = 4, 5


def test_an_old_dataset_reads_every_step_committed_before_and_after_gc(backend) -> None:
    s = lakestream.create(backend.uri(), SCHEMA, global_batch_size=B, snapshot_interval=K,
                          storage_options=backend.options)
    for k in range(10):
        s.append(rows(4 * k, 4))
    ds = StreamDataset(s.uri, group=None, timeout=30, max_steps=40, read_threads=1,
                       prefetch=1, storage_options=backend.options)
    batches = iter(ds)
    got = [next(batches)["step"] for _ in range(2)]  # its view is at version 10 now
    for k in range(10, 40):
        s.append(rows(4 * k, 4))
    time.sleep(2.1)
    assert s.gc(grace_seconds=1).log_entries > 20
    t0 = time.monotonic()
    for batch in batches:
        got.append(batch["step"])
        assert [int(i) for i in batch["id"]] == list(range(4 * got[-1], 4 * got[-1] + 4))
    assert got == list(range(40)) and time.monotonic() - t0 < 20
