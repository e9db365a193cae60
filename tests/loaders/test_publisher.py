"""Rank 0's progress publisher has an owner: it stops with iteration, and says when it fails."""

from __future__ import annotations

import logging
import threading
import time

import lakestream
from lakestream.errors import StoreError
from lakestream.loaders import StreamDataset
from lakestream.loaders.publisher import ProgressPublisher
from lakestream.log.progress import read_progress
from tests.helpers import SCHEMA, rows


def _publishers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lakestream-progress"]


def test_the_publisher_stops_when_iteration_ends_and_leaves_the_last_step(tmp_path) -> None:
    # Regression: rank 0's publisher was a `while True` daemon that never stopped.
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    for i in range(3):
        s.append(rows(4 * i, 4))
    before = len(_publishers())
    ds = StreamDataset(uri, rank=0, world_size=1, max_steps=3, progress_interval_s=30)
    assert [int(b["step"]) for b in ds] == [0, 1, 2]
    assert len(_publishers()) == before, "the publisher outlived the iteration"
    progress = read_progress(s.store, "train")
    assert progress is not None and progress.step == 3  # the last step, despite the 30 s
    assert [int(b["step"]) for b in StreamDataset(uri, rank=0, world_size=1, start_step=1,
                                                  max_steps=3, progress_interval_s=30)] == [1, 2]
    assert len(_publishers()) == before


def test_a_failing_publish_is_logged_counted_and_retried(caplog) -> None:
    # Regression: publish errors were swallowed without a word.
    calls: list[int] = []
    failing = threading.Event()
    failing.set()

    def publish(step: int, _pv: int | None) -> None:
        calls.append(step)
        if failing.is_set():
            raise StoreError("PUT progress: 503 SlowDown")

    publisher = ProgressPublisher(publish, interval_s=0.01)
    with caplog.at_level(logging.WARNING, logger="lakestream"):
        publisher.update(7, None)
        deadline = time.monotonic() + 30
        while publisher.errors < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        failing.clear()
        publisher.stop()
    assert publisher.errors >= 3 and calls[-1] == 7 and not publisher.running
    messages = [r.getMessage() for r in caplog.records]
    assert sum("failed" in m for m in messages) == 1, messages  # once, not once per retry
    assert any("works again" in m for m in messages), messages


def test_stop_publishes_what_is_unpublished() -> None:
    seen: list[tuple[int, int | None]] = []
    publisher = ProgressPublisher(lambda s, pv: seen.append((s, pv)), interval_s=3600)
    publisher.update(1, None)
    publisher.update(5, 2)
    publisher.stop()
    assert seen[-1] == (5, 2) and not publisher.running
    publisher.stop()  # idempotent


def test_no_publisher_when_progress_is_off(tmp_path) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    s.append(rows(0, 4))
    list(StreamDataset(uri, rank=0, world_size=1, max_steps=1, progress_interval_s=0))
    assert read_progress(s.store, "train") is None
