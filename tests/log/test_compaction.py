"""Handles older than gc's compaction: nothing lands in the compacted past, and no reader
takes a compacted version for the head (docs/design.md §7, "The log's retained start")."""

from __future__ import annotations

import time

import pytest

import lakestream
import lakestream.log.codec
import lakestream.log.compaction
import lakestream.log.entries
import lakestream.log.view
import lakestream.stream
from lakestream.errors import LogCompactedError
from lakestream.log.compaction import COMPACTED_KEY
from lakestream.log.entries import Compacted
from lakestream.log.keys import log_key
from lakestream.log.opening import read_version_pointer
from lakestream.log.tail import read_entry
from lakestream.ops.verify import verify
from lakestream.producers import Producer
from tests.helpers import SCHEMA, ids, put_entry, rows

B, K = 4, 5
GRACE = 1.0


def _stream(backend) -> lakestream.Stream:
    return lakestream.create(backend.uri(), SCHEMA, global_batch_size=B, snapshot_interval=K,
                             storage_options=backend.options)


def _others_commit(s: lakestream.Stream, first: int, appends: int) -> int:
    """``appends`` one-step appends by another handle, ids from ``first``; the next id."""
    for k in range(appends):
        s.append(rows(first + 4 * k, 4))
    return first + 4 * appends


def _compact(s: lakestream.Stream) -> None:
    """Waits past the grace by the store's clock, then gc compacts the log."""
    time.sleep(GRACE + 1.1)  # S3 timestamps have a resolution of a second
    report = s.gc(grace_seconds=GRACE)
    assert report.log_entries > 0, report


def _all_ids(uri: str, options: dict[str, str] | None) -> list[int]:
    fresh = lakestream.open(uri, storage_options=options)
    return sorted(i for step in range(fresh.num_steps) for i in ids(fresh.read_step(step)))


@pytest.mark.parametrize("committed_before", [True, False])
def test_an_idle_producer_after_gc_commits_every_write_at_the_head(backend,
                                                                   committed_before) -> None:
    s = _stream(backend)
    p = Producer(s.uri, "idle", storage_options=backend.options)
    expected: list[int] = []
    if committed_before:  # then its next commit puts without reading the head first
        p.write(rows(10_000, 4), state={"n": 0})
        p.flush()
        expected += range(10_000, 10_004)
    nxt = _others_commit(s, 0, 30)
    expected += range(0, nxt)
    _compact(s)
    with p:
        for k in range(10):
            p.write(rows(20_000 + 4 * k, 4), state={"n": k + 1})
        p.flush()
        assert p.state == {"n": 10}
    expected += range(20_000, 20_040)
    assert _all_ids(s.uri, backend.options) == sorted(expected)
    fresh = lakestream.open(s.uri, storage_options=backend.options)
    assert fresh.producers["idle"][1:] == (9 + committed_before, {"n": 10})
    assert not verify(fresh.store).problems


def test_a_stale_handle_never_commits_below_the_compaction_point(backend) -> None:
    s = _stream(backend)
    stale = lakestream.open(s.uri, storage_options=backend.options)
    nxt = _others_commit(s, 0, 30)
    _compact(s)
    head = s.version
    # Its put-if-absent meets a tombstone, never a free version: it lands at the head.
    version = stale.append(rows(nxt, 4))
    assert version == head + 1
    assert isinstance(read_entry(s.store, 1), Compacted)
    fresh = lakestream.open(s.uri, storage_options=backend.options)
    assert (fresh.version, fresh.num_samples) == (head + 1, nxt + 4)
    assert ids(fresh.read_step(fresh.num_steps - 1)) == list(range(nxt, nxt + 4))
    # A marker from an old view lands at the head too, on the state it names.
    old = lakestream.open(s.uri, storage_options=backend.options)
    _others_commit(s, nxt + 4, 10)
    _compact(s)
    head = s.version
    assert old.mark_checkpoint("train", 3) == head + 1
    assert [m.step for m in lakestream.open(s.uri, storage_options=backend.options)
            .checkpoints("train")] == [3]


def test_an_old_reader_reaches_the_head_after_gc(backend) -> None:
    s = _stream(backend)
    reader = lakestream.open(s.uri, storage_options=backend.options)
    poller = lakestream.open(s.uri, storage_options=backend.options)
    _others_commit(s, 0, 30)
    _compact(s)
    assert reader.refresh() == s.version
    assert poller.poll() == s.version
    assert ids(reader.read_step(29)) == list(range(116, 120))


def test_a_reader_meeting_a_tombstone_reopens_from_the_snapshot_it_names(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B, snapshot_interval=K)
    reader = lakestream.open(s.uri)
    _others_commit(s, 0, 12)
    time.sleep(GRACE + 0.1)
    s.gc(grace_seconds=GRACE)
    tomb = read_entry(s.store, 1)
    assert isinstance(tomb, Compacted) and tomb.snapshot == 10
    assert read_version_pointer(s.store, COMPACTED_KEY) == 5  # below the previous snapshot
    with pytest.raises(LogCompactedError, match="reopen from snapshot 10"):
        reader.state.copy().apply(1, tomb)
    assert reader.refresh() == 12


def test_a_handle_idle_past_the_reopen_time_reopens_before_it_reads(tmp_path,
                                                                   monkeypatch) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B, snapshot_interval=K)
    idle = lakestream.open(s.uri)
    _others_commit(s, 0, 12)
    time.sleep(GRACE + 0.1)
    s.gc(grace_seconds=GRACE)
    monkeypatch.setattr(lakestream.log.compaction, "TOMBSTONE_TTL_S", 0.0)
    s.gc(grace_seconds=GRACE)  # the tombstones are gone: versions 1..4 are free again
    assert not any(True for _ in s.store.list("_delta_log/") if _.key == log_key(1))
    monkeypatch.setattr(lakestream.log.view, "REOPEN_IDLE_S", 0.05)
    time.sleep(0.1)
    assert idle.append(rows(48, 4)) == 13  # reopened first: at the head, not at version 1
    assert lakestream.open(s.uri).num_samples == 52


def test_a_tombstone_of_our_own_unknown_commit_means_it_landed(tmp_path) -> None:
    from lakestream.log.outcomes import Landed
    from lakestream.log.transaction import Transaction

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B, snapshot_interval=K)
    stale = s.state.copy()
    txn = Transaction(s.store, stale, lambda st, cid: None)
    # As if an earlier attempt of this transaction had landed at version 1, and gc had
    # compacted it since: its tombstone names the commit id it replaced.
    put_entry(s.store, 1, lakestream.log.entries.Fence("p", 1, txn.commit_id))
    _others_commit(s, 0, 11)
    time.sleep(GRACE + 0.1)
    s.gc(grace_seconds=GRACE)
    txn.build = lambda st, cid: lakestream.log.entries.Fence("p", 9, cid)
    outcome = txn.commit()
    assert isinstance(outcome, Landed) and outcome.result.version == 1
    assert lakestream.open(s.uri).producers["p"][0] == 1  # no second fence was committed


def test_tombstones_keep_the_delta_view(tmp_path) -> None:
    from tests.helpers import delta_ids

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B, snapshot_interval=K)
    _others_commit(s, 0, 12)
    time.sleep(GRACE + 0.1)
    assert s.gc(grace_seconds=GRACE).log_entries > 0
    assert delta_ids(s.uri, None) == list(range(48))


class _SlowStore:
    """A store whose GETs take ``delay_s`` more, as an S3 round trip does."""

    def __init__(self, inner: object, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    @property
    def uri(self) -> str:
        return self.inner.uri  # type: ignore[attr-defined,no-any-return]

    def get(self, key: str, **kwargs: object) -> bytes:
        time.sleep(self.delay_s)
        return self.inner.get(key, **kwargs)  # type: ignore[attr-defined,no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_poll_catches_up_as_fast_as_refresh(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    stale = [lakestream.stream.Stream(s.uri, _SlowStore(s.store, 0.005), s.state)
             for _ in range(6)]
    for k in range(300):
        s.append(rows(4 * k, 4))
    took: dict[str, list[float]] = {"refresh": [], "poll": []}
    for i, handle in enumerate(stale):  # interleaved, each on a handle 300 versions behind
        how = "refresh" if i % 2 == 0 else "poll"
        t0 = time.monotonic()
        assert getattr(handle, how)() == 300
        took[how].append(time.monotonic() - t0)
    # The fastest of three each: one slow moment of a busy machine decides nothing.
    assert min(took["poll"]) < 1.5 * min(took["refresh"]) + 0.05, took


def test_gc_with_a_short_grace_keeps_what_a_live_producer_has_yet_to_commit(tmp_path) -> None:
    from lakestream.log.keys import fragment_key

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    p = Producer(s.uri, "slow")
    p.write(rows(0, 4))
    p.flush()
    epoch = p.epoch
    # Uploaded by the live instance, not committed yet (its commit is slow): in flight.
    pending = fragment_key("slow", epoch, 7)
    s.store.put(pending, b"an upload the committer is about to name")
    # A fenced epoch's upload and a seq already committed can never be committed.
    fenced = fragment_key("slow", epoch - 1, 5)
    s.store.put(fenced, b"a zombie's upload")
    duplicate = fragment_key("slow", epoch, 0)
    s.store.put(duplicate, b"a re-sent seq")
    time.sleep(1.1)
    report = s.gc(grace_seconds=1)
    left = {m.key for m in s.store.list("data/")}
    assert pending in left and fenced not in left and duplicate not in left, report
    p.close()
