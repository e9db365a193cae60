"""The commit as a transaction: typed outcomes, cleanup only after a definite failure,
preconditions checked on the state committed on, no lock held across I/O, and store
outages never read as corruption."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import lakestream
import lakestream.log.transaction as transaction
from lakestream.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    CorruptLogError,
    StepNotAvailableError,
    StoreError,
)
from lakestream.log.entries import Checkpoint, Fence
from lakestream.log.keys import DATA_DIR, LOG_DIR
from lakestream.log.manifest import snapshot_key
from lakestream.log.opening import load_state
from lakestream.log.outcomes import CommitOptions, Exhausted, Landed, Rejected
from lakestream.log.segments import INDEX_DIR
from lakestream.log.snapshot import decode_snapshot, snapshot_segments
from lakestream.log.transaction import Transaction
from lakestream.ops.verify import verify
from lakestream.store import LocalStore
from lakestream.stream import Stream
from tests.helpers import SCHEMA, HookedStore, ids, put_entry, rows


def _hooked(s: Stream, hook: Any) -> Stream:
    """A second handle on ``s``'s stream whose store requests pass through ``hook``."""
    store = HookedStore(LocalStore(s.uri), hook)
    return Stream(s.uri, store, load_state(store, s.uri))  # type: ignore[arg-type]


def _data_files(uri: str) -> list[str]:
    return [m.key for m in LocalStore(uri).list(DATA_DIR)]


def _assert_sound(uri: str) -> None:
    report = verify(LocalStore(uri))
    assert report.problems == [], report.problems


def _options(attempts: int) -> CommitOptions:
    return CommitOptions(max_attempts=attempts, backoff_base_s=0, backoff_cap_s=0)


def _is_entry(key: str) -> bool:
    return key.startswith(LOG_DIR) and key.endswith(".json")


# -- 1. append deletes its file only after a definite failure ------------------------------


def test_an_append_interrupted_after_its_entry_landed_keeps_its_file(tmp_path) -> None:
    # Regression: append deleted its fragment on any exception but CommitStateUnknownError,
    # so a KeyboardInterrupt once the entry had landed left the log naming a missing file.
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)

    def interrupt(op: str, key: str, phase: str) -> None:
        if op == "put" and _is_entry(key) and phase == "after":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _hooked(s, interrupt).append(rows(0, 4))
    s.refresh()
    assert s.num_samples == 4 and ids(s.read_step(0)) == [0, 1, 2, 3]
    _assert_sound(s.uri)


def test_a_failing_post_commit_step_never_fails_a_landed_append(tmp_path) -> None:
    # Regression: the snapshot written after landing raised anything but StoreError out of
    # the commit, and append then deleted the file the landed entry names.
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4, snapshot_interval=1)

    def broken(op: str, key: str, phase: str) -> None:
        if op == "put" and key.startswith(INDEX_DIR):
            raise RuntimeError("a bug in snapshot writing")

    version = _hooked(s, broken).append(rows(0, 4))
    s.refresh()
    assert s.version == version and ids(s.read_step(0)) == [0, 1, 2, 3]
    _assert_sound(s.uri)


def test_an_append_that_lost_every_race_deletes_its_file(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    rival = lakestream.open(s.uri)

    def race(op: str, key: str, phase: str) -> None:
        if op == "put" and _is_entry(key) and phase == "before":
            rival.commit(lambda _s, cid: Fence("rival", rival.state.version + 1, cid))

    with pytest.raises(CommitConflictError, match="nothing was committed"):
        _hooked(s, race).append(rows(0, 4), commit_options=_options(3))
    assert _data_files(s.uri) == []
    s.refresh()
    assert s.num_samples == 0
    _assert_sound(s.uri)


def test_an_append_whose_outcome_is_unknown_keeps_its_file(tmp_path) -> None:
    # The entry lands but every reply is lost and the version cannot be read back: the
    # caller is told the outcome is unknown, and the file the entry names stays.
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    armed = threading.Event()

    def lost(op: str, key: str, phase: str) -> None:
        if armed.is_set() and _is_entry(key) and (op, phase) in (("put", "after"),
                                                                   ("get", "before")):
            raise StoreError(f"{op} {key}: connection reset")

    handle = _hooked(s, lost)
    armed.set()
    with pytest.raises(CommitStateUnknownError, match="reopen"):
        handle.append(rows(0, 4), commit_options=_options(2))
    s.refresh()
    assert s.num_samples == 4 and ids(s.read_step(0)) == [0, 1, 2, 3]
    _assert_sound(s.uri)


POINTS = ["before_commit", "after_put", "after_commit"]


@pytest.mark.parametrize("point", POINTS)
def test_appends_interrupted_at_every_point_leave_a_sound_stream(tmp_path, monkeypatch,
                                                                  point: str) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4, snapshot_interval=2)
    s.append(rows(0, 4))

    def interrupt(name: str) -> None:
        if name == point:
            raise KeyboardInterrupt

    monkeypatch.setattr(transaction, "failpoint", interrupt)
    with pytest.raises(KeyboardInterrupt):
        s.append(rows(4, 4))
    monkeypatch.undo()
    s.append(rows(8, 4))
    fresh = lakestream.open(s.uri)
    committed = sum((ids(fresh.read_step(i)) for i in range(fresh.num_steps)), [])
    landed = point != "before_commit"
    assert committed == (list(range(12)) if landed else [*range(4), *range(8, 12)])
    _assert_sound(s.uri)


@pytest.mark.parametrize("point", POINTS)
def test_producer_commits_interrupted_at_every_point_lose_and_duplicate_nothing(
        tmp_path, monkeypatch, point: str) -> None:
    from lakestream.producers import Producer

    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4, snapshot_interval=2)
    hits = {"n": 0}

    def interrupt(name: str) -> None:
        if name == point:
            hits["n"] += 1
            if hits["n"] == 3:  # the fence is the first commit; interrupt a data commit
                raise KeyboardInterrupt

    monkeypatch.setattr(transaction, "failpoint", interrupt)
    p = Producer(uri, "p")
    written = 0
    with pytest.raises(KeyboardInterrupt):
        for i in range(20):
            p.write(rows(4 * i, 4), state={"next": i + 1})
            written = i + 1
            p.flush()
    p.abort()
    monkeypatch.undo()
    with Producer(uri, "p") as again:  # resume from the committed state, as a user would
        start = again.state["next"] if again.state else 0
        for i in range(start, 10):
            again.write(rows(4 * i, 4), state={"next": i + 1})
    assert written >= 1
    s = lakestream.open(uri)
    committed = sum((ids(s.read_step(i)) for i in range(s.num_steps)), [])
    assert committed == list(range(40))
    _assert_sound(uri)


# -- 2. store outages are not corruption -------------------------------------------------


def _stream_with_snapshots(tmp_path: Any) -> Stream:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4, snapshot_interval=2)
    for i in range(8):
        s.append(rows(4 * i, 4))
    return s


def test_an_outage_while_opening_is_an_outage_not_a_damaged_snapshot(tmp_path) -> None:
    # Regression: any exception while decoding a snapshot, a StoreError included, became
    # CorruptLogError: the open fell back to an older snapshot or a full replay, and
    # verify reported the stream damaged.
    s = _stream_with_snapshots(tmp_path)

    def outage(op: str, key: str, phase: str) -> None:
        if op == "get" and key.startswith(INDEX_DIR):
            raise StoreError(f"GET {key}: 503 SlowDown")

    store = HookedStore(LocalStore(s.uri), outage)
    state = load_state(store, s.uri)  # type: ignore[arg-type]  (opening fetches no segment)
    with pytest.raises(StoreError, match="SlowDown"):
        state.fragments_between(0, 4)  # the lookup that fetches one
    with pytest.raises(StoreError, match="SlowDown"):
        verify(store)  # type: ignore[arg-type]


def test_a_bug_while_opening_is_raised_not_read_as_damage(tmp_path) -> None:
    s = _stream_with_snapshots(tmp_path)

    def bug(op: str, key: str, phase: str) -> None:
        if op == "get" and key.startswith(INDEX_DIR):  # read inside snapshot decoding
            raise AttributeError("a bug")

    state = load_state(HookedStore(LocalStore(s.uri), bug), s.uri)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        state.fragments_between(0, 4)


def test_damaged_snapshot_bytes_are_still_corruption(tmp_path) -> None:
    s = _stream_with_snapshots(tmp_path)
    store = LocalStore(s.uri)
    segment = snapshot_segments(store, 8)[0]
    body = bytearray(store.get(segment))
    body[len(body) // 2] ^= 0xFF
    store.put(segment, bytes(body))
    restored = decode_snapshot(8, store.get(snapshot_key(8)), store.get)
    with pytest.raises(CorruptLogError, match="damaged"):
        restored.all_fragments()
    # A reader that needs the segment falls back on the log, and still reads.
    assert ids(lakestream.open(s.uri).read_step(0)) == [0, 1, 2, 3]


# -- 3. no lock across I/O ---------------------------------------------------------------


def test_a_slow_commit_does_not_block_refresh_or_reads_on_the_same_handle(tmp_path) -> None:
    # Regression: the handle's lock was held through the whole commit (puts, backoff,
    # catching up, snapshot), so refresh and read_step on it waited up to the deadline.
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 4))
    entered, release = threading.Event(), threading.Event()

    def stall(op: str, key: str, phase: str) -> None:
        if op == "put" and _is_entry(key) and phase == "before":
            entered.set()
            release.wait(60)

    handle = _hooked(s, stall)
    committing = threading.Thread(target=handle.append, args=(rows(4, 4),))
    committing.start()
    try:
        assert entered.wait(30)
        seen: list[Any] = []
        reader = threading.Thread(target=lambda: seen.extend(
            [handle.refresh(), ids(handle.read_step(0)), handle.producers]))
        reader.start()
        reader.join(30)
        assert not reader.is_alive(), "refresh/read_step waited behind a commit in flight"
        assert seen[:2] == [1, [0, 1, 2, 3]]
    finally:
        release.set()
        committing.join(30)
    assert handle.refresh() == 2 and handle.num_samples == 8


# -- 4. the marker's retention check is inside the commit ----------------------------------


def test_a_corrupt_entry_behind_the_head_leaves_the_handle_as_it_was(tmp_path) -> None:
    # Regression: replay added an entry's first fragments before checking the later ones'
    # offsets, so a commit that caught up into a corrupt entry published a half-applied
    # state naming a fragment that was never committed.
    from lakestream.log.entries import Append, FragmentRef

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    stale = lakestream.open(s.uri)
    s.commit(lambda _s, cid: Fence("other", 1, cid))
    bad = Append(None, 0, (FragmentRef("data/_append/0-0-a.parquet", 4, 10, 0, 0),
                           FragmentRef("data/_append/0-0-b.parquet", 4, 10, 99, 0)), None,
                 "bad")
    put_entry(s.store, 2, bad)
    with pytest.raises(CorruptLogError, match="log version 2"):
        stale.commit(lambda _s, cid: Checkpoint("train", 0, None, cid))
    assert stale.state.all_fragments() == [] and stale.num_samples == 0
    with pytest.raises(CorruptLogError):
        stale.append(rows(0, 4))
    assert _data_files(s.uri) == []  # a definite failure: its upload was deleted


def test_a_marker_never_lands_below_data_a_concurrent_retain_reclaimed(tmp_path) -> None:
    # Regression: mark_checkpoint checked the retention point on its handle's view before
    # committing; a retain that landed in between left a marker below reclaimed data.
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    for i in range(4):
        s.append(rows(4 * i, 4))
    stale = lakestream.open(uri)  # sees 4 steps and nothing reclaimed
    s.mark_checkpoint("train", 3)
    assert s.retain(keep_last=1) is not None  # reclaims below step 3
    with pytest.raises(StepNotAvailableError, match="reclaimed"):
        stale.mark_checkpoint("train", 1)
    fresh = lakestream.open(uri)
    assert [m.step for m in fresh.checkpoints("train")] == [3]


def test_a_rejected_precondition_is_a_definite_outcome(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)

    def refuse(_state: Any, _cid: str) -> Any:
        raise StepNotAvailableError("no")

    outcome = Transaction(s.store, s.state, refuse).commit()
    assert isinstance(outcome, Rejected) and outcome.definite_failure
    landed = Transaction(s.store, s.state, lambda _s, cid: Checkpoint("g", 0, None, cid)).commit()
    assert isinstance(landed, Landed) and landed.result.version == 1
    assert not landed.definite_failure
    assert s.version == 0, "a transaction never touches the state it was built on"


def test_an_exhausted_commit_is_definite(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    stale = s.state
    s.commit(lambda _s, cid: Fence("a", 1, cid))
    outcome = Transaction(s.store, stale, lambda _s, cid: Fence("b", 1, cid),
                          CommitOptions(max_attempts=1)).commit()
    assert isinstance(outcome, Exhausted) and outcome.definite_failure
    assert outcome.state.version == 1  # it folded in the winner


# -- group names ------------------------------------------------------------------------


@pytest.mark.parametrize("group", ["../x", "a/b", "", "r\n", 3])
def test_marker_groups_follow_the_loaders_rule(tmp_path, group: Any) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 4))
    with pytest.raises(ValueError, match="consumer group"):
        s.mark_checkpoint(group, 0)
    assert s.refresh() == 1
