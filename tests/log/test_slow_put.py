"""A commit whose conditional put the store holds unanswered resolves it by reading the key:
another's entry there means it lost and commits at the next version, its own that it won,
nothing that it waits on; exactly once in every case (SeaweedFS, its answers held back by a
hook on the client's side, as a throttled store or proxy does)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import lakestream
from lakestream.log.keys import LOG_DIR
from lakestream.log.opening import load_state
from lakestream.store import open_store
from lakestream.stream import Stream
from tests.helpers import SCHEMA, HookedStore, ids, rows
from tests.s3server import BUCKET

HELD_S = 3.0


def _entry(key: str) -> bool:
    return key.startswith(LOG_DIR) and key.endswith(".json")


def _pair(options: dict[str, str], hook: Any) -> tuple[Stream, Stream]:
    """A plain handle on a fresh stream, and a second whose store passes through ``hook``."""
    uri = f"s3://{BUCKET}/slow-put-{uuid.uuid4().hex[:12]}"
    s = lakestream.create(uri, SCHEMA, global_batch_size=4, storage_options=options)
    store = HookedStore(open_store(uri, options), hook)
    return s, Stream(uri, store, load_state(store, uri))  # type: ignore[arg-type]


def _timed(fn: Any) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def test_a_lost_race_held_back_is_resolved_and_committed_next(s3_options) -> None:
    inner: list[Any] = []
    found: list[str] = []  # the reads of the key that resolved a put (a HEAD finding it)

    def hold_losers(op: str, key: str, phase: str) -> None:
        if op == "head" and _entry(key) and phase == "after":
            found.append(key)
        if op == "put" and _entry(key) and phase == "before":
            try:
                inner[0].head(key)
            except lakestream.NotFoundError:
                return
            time.sleep(HELD_S)  # the key is taken: the 412 comes late

    s, b = _pair(s3_options, hold_losers)
    inner.append(b.store.inner)  # type: ignore[attr-defined]
    s.append(rows(0, 4))  # b's view is a version behind: its put loses
    assert _timed(lambda: b.append(rows(4, 4))) < HELD_S / 2
    assert len(found) == 1
    s.refresh()
    assert s.num_samples == 8
    assert sorted(ids(s.read_step(0)) + ids(s.read_step(1))) == list(range(8))


def test_a_won_put_whose_answer_is_held_back_is_resolved_as_landed(s3_options) -> None:
    def hold_answers(op: str, key: str, phase: str) -> None:
        if op == "put" and _entry(key) and phase == "after":
            time.sleep(HELD_S)  # landed; the answer comes late

    s, b = _pair(s3_options, hold_answers)
    assert _timed(lambda: b.append(rows(0, 4))) < HELD_S / 2
    s.refresh()
    assert s.num_samples == 4 and ids(s.read_step(0)) == [0, 1, 2, 3]


def test_a_put_not_landed_yet_is_waited_for(s3_options) -> None:
    slow = threading.Event()

    def hold_before(op: str, key: str, phase: str) -> None:
        if op == "put" and _entry(key) and phase == "before" and not slow.is_set():
            slow.set()
            time.sleep(1.0)  # nothing at the key meanwhile: resolving finds it absent

    s, b = _pair(s3_options, hold_before)
    took = _timed(lambda: b.append(rows(0, 4)))
    assert slow.is_set() and took >= 1.0
    s.refresh()
    assert s.num_samples == 4 and ids(s.read_step(0)) == [0, 1, 2, 3]
