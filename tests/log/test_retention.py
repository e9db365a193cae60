"""Checkpoint-aligned retention and garbage collection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import lakestream
import lakestream.log.compaction
from lakestream.errors import StepNotAvailableError
from lakestream.log.entries import Fence
from lakestream.log.inventory import unreferenced
from lakestream.log.opening import read_hint
from lakestream.log.progress import publish_progress
from lakestream.log.tail import TAIL_WIDTH
from lakestream.ops.verify import verify
from tests.helpers import SCHEMA, delta_ids, ids, rows
from tests.log.test_open import CountingStore

ROOT = Path(__file__).resolve().parents[2]
B = 4


def _filled(uri: str, steps: int, options: dict[str, str] | None = None) -> lakestream.Stream:
    s = lakestream.create(uri, SCHEMA, global_batch_size=B, storage_options=options)
    for k in range(steps * 2):
        s.append(rows(2 * k, 2))  # two fragments per step
    return s


def test_markers_decide_what_is_reclaimed(backend) -> None:
    s = _filled(backend.uri(), 8, backend.options)
    s.mark_checkpoint("train", 4)
    s.mark_checkpoint("train", 6)
    s.mark_checkpoint("eval", 5)
    point = s.retention_point(keep_last=1)
    assert (point.step, point.below_offset) == (5, 20)  # train keeps @6, eval keeps @5
    before = {f.path for f in s.state.all_fragments()}
    assert s.retain(keep_last=1) is not None
    assert s.retain(keep_last=1) is None  # nothing more to reclaim
    for step in range(5, 8):
        assert ids(s.read_step(step)) == list(range(4 * step, 4 * step + 4))
    with pytest.raises(StepNotAvailableError,
                       match="step 1 .* reclaimed .* steps below 5 cannot be read"):
        s.read_step(1)
    reclaimed = before - {f.path for f in s.state.all_fragments()}
    assert len(reclaimed) == 10
    report = s.gc(grace_seconds=0)
    assert report.data_files == 10
    left = {m.key for m in s.store.list("data/")}
    assert not reclaimed & left and len(left) == 6
    assert delta_ids(s.uri, backend.options) == list(range(20, 32))
    reopened = lakestream.open(s.uri, storage_options=backend.options)
    assert ids(reopened.read_step(7)) == [28, 29, 30, 31]


def test_progress_holds_nothing_a_registration_holds_until_removed(tmp_path) -> None:
    """A group holds data only through what it committed: a progress object alone holds
    nothing; a registration holds from its step until the group is removed, and every
    handle (reopened, or replaying from a snapshot) agrees."""
    s = _filled(str(tmp_path / "s"), 4)
    s.mark_checkpoint("train", 3)
    publish_progress(s.store, "stray", step=0)  # an object, not a commitment
    assert s.retention_point(keep_last=1).step == 3
    v = s.register_group("eval", 2)
    assert v is not None and s.register_group("eval", 3) is None  # idempotent at or above
    assert s.group_holds(keep_last=1) == {"train": 3, "eval": 2}
    # A group holds from its earliest registration: another (a restart from scratch, or a
    # writer's registration first) cannot raise its hold, only lower it.
    assert s.register_group("eval", 1) is not None
    assert s.group_holds(keep_last=1) == {"train": 3, "eval": 1}
    assert s.retention_point(keep_last=1).step == 1
    other = lakestream.open(s.uri)
    assert other.groups == ["eval", "train"] and other.registered_step("eval") == 1
    s.remove_group("eval")
    with pytest.raises(ValueError, match="no consumer group 'eval'"):
        s.remove_group("eval")
    other.refresh()
    for handle in (s, other, lakestream.open(s.uri)):
        assert handle.groups == ["train"] and handle.retention_point(keep_last=1).step == 3
    assert s.retain(keep_last=1) is not None
    with pytest.raises(StepNotAvailableError):
        s.read_step(0)


def test_registrations_and_removals_survive_snapshots(tmp_path) -> None:
    """A handle that opens from a snapshot knows the registrations and removals before it."""
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B, snapshot_interval=2)
    s.append(rows(0, 4))
    s.register_group("eval", 1)
    s.mark_checkpoint("gone", 1)
    s.remove_group("gone")
    for k in range(4):
        s.append(rows(4 + 4 * k, 4))
    assert read_hint(s.store) == 8  # opened from the snapshot at version 8
    opened = lakestream.open(s.uri)
    assert opened.groups == ["eval"]
    assert opened.registered_step("eval") == 1 and opened.checkpoints("gone") == []
    assert verify(s.store).problems == []  # the snapshots agree with the replay


def test_group_entries_carry_a_format_older_readers_refuse_by_name() -> None:
    """A lakestream from before ``register``/``remove_group`` reads format 1 only: it stops
    at such an entry with "upgrade lakestream", where an unknown operation would read as
    corruption. (Every entry is chained now, a format no older lakestream reads.)"""
    import json

    from lakestream.log.codec import decode_entry, encode_entry
    from lakestream.log.entries import CHAINED_ENTRY_FORMAT, Register, RemoveGroup

    for entry in (Register("eval", 3), RemoveGroup("eval")):
        data = encode_entry(entry)
        assert json.loads(data.split(b"\n")[0])["commitInfo"]["lakestream"]["format"] == \
            CHAINED_ENTRY_FORMAT == 5
        assert decode_entry(7, data) == entry


def test_registering_past_the_end_is_refused_and_retain_stays_inside(tmp_path) -> None:
    """A reclaim past the end of the stream would be corrupt: a group cannot register
    beyond the visible steps, and the retention point never passes the end."""
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    s.append(rows(0, B))
    with pytest.raises(ValueError, match="step 5 of group 'eval' is past the 1 steps visible"):
        s.register_group("eval", 5)
    from lakestream.log.entries import Register

    # As a writer without that check (or a stream that was shorter) could have left it:
    s.commit(lambda state, commit_id: Register("eval", 5, commit_id))
    assert s.retention_point(keep_last=1).below_offset <= s.num_samples
    s.retain(keep_last=1)
    assert lakestream.open(s.uri).num_samples == B


def test_no_marker_means_no_reclaim(tmp_path) -> None:
    s = _filled(str(tmp_path / "s"), 3)
    assert s.retain(keep_last=1) is None and s.version == 6


def test_a_new_marker_below_the_retention_point_is_refused(tmp_path) -> None:
    s = _filled(str(tmp_path / "s"), 4)
    s.mark_checkpoint("train", 3)
    s.retain(keep_last=1)
    with pytest.raises(StepNotAvailableError, match="below the retention point"):
        s.mark_checkpoint("eval", 1)


def test_gc_waits_for_the_grace_period(tmp_path) -> None:
    s = _filled(str(tmp_path / "s"), 4)
    s.store.put("data/w/1-0-orphan.parquet", b"never committed")
    s.mark_checkpoint("train", 2)
    s.retain(keep_last=1)
    report = s.gc(grace_seconds=3600)
    assert report.data_files == 0 and report.kept_in_grace == 5
    assert s.gc(grace_seconds=0).data_files == 5
    assert list(unreferenced(s.store, s.state)) == []


def test_gc_killed_midway_then_rerun_finishes(tmp_path) -> None:
    s = _filled(str(tmp_path / "s"), 10)
    s.mark_checkpoint("train", 9)
    s.retain(keep_last=1)
    script = ("import sys, lakestream; "
              "lakestream.open(sys.argv[1]).gc(grace_seconds=0, delta_checkpoint=False)")
    env = {**os.environ, "LAKESTREAM_FAILPOINT": "during_gc@5"}
    killed = subprocess.run([sys.executable, "-c", script, s.uri], env=env, cwd=ROOT,
                            capture_output=True, timeout=120)
    assert killed.returncode == -9
    mid = lakestream.open(s.uri)
    assert ids(mid.read_step(9)) == [36, 37, 38, 39]
    assert len(list(unreferenced(mid.store, mid.state))) == 14  # 4 of 18 deleted
    mid.gc(grace_seconds=0, delta_checkpoint=False)
    assert list(unreferenced(mid.store, mid.state)) == []
    assert ids(lakestream.open(s.uri).read_step(9)) == [36, 37, 38, 39]


def _counted_open(uri: str, monkeypatch: pytest.MonkeyPatch) -> tuple[lakestream.Stream, dict]:
    """``lakestream.open(uri)``, with the store requests the open made."""
    import lakestream.stream

    stores: list[CountingStore] = []
    real = lakestream.stream.open_store

    def counting(*args: object, **kwargs: object) -> CountingStore:
        stores.append(CountingStore(real(*args, **kwargs)))  # type: ignore[arg-type]
        return stores[-1]

    with monkeypatch.context() as m:
        m.setattr(lakestream.stream, "open_store", counting)
        opened = lakestream.open(uri)
    (store,) = stores
    assert opened.store is store and store.calls["get"] > 0  # counted, on the real path
    return opened, dict(store.calls)


def test_a_long_log_compacts_to_what_is_retained(tmp_path, monkeypatch) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=B)
    for e in range(1, 3_000):
        s.commit(lambda _s, cid, e=e: Fence("p", e, cid))
    for k in range(20):
        s.append(rows(2 * k, 2))
    s.mark_checkpoint("train", 8)
    s.mark_checkpoint("train", 9)
    s.retain(keep_last=1)
    assert s.version >= 3_000
    opened, before = _counted_open(uri, monkeypatch)
    assert opened.version == s.version
    report = s.gc(grace_seconds=0)
    assert report.log_entries > 2_500 and report.data_files == 18
    opened, after = _counted_open(uri, monkeypatch)
    # gc leaves opening as cheap: the same requests, but for the reads past the head that
    # a parallel round of the tail read has started when it finds the head (timing decides)
    assert opened.version == s.version and after["head"] == before["head"]
    assert abs(after["get"] - before["get"]) < TAIL_WIDTH, (before, after)
    # Compacted entries are tombstones until their TTL: then the next gc deletes them.
    assert sum(1 for _ in s.store.list("_delta_log/")) > 2_500
    monkeypatch.setattr(lakestream.log.compaction, "TOMBSTONE_TTL_S", 0.0)
    assert s.gc(grace_seconds=0).tombstones == report.log_entries
    objects = sum(1 for _ in s.store.list(""))
    assert objects < 400, objects  # O(retained): the tail of the log, 2 snapshots, 2 files
    assert ids(lakestream.open(uri).read_step(9)) == [36, 37, 38, 39]
    assert delta_ids(uri, None) == list(range(36, 40))


def test_snapshots_after_a_reclaim_drop_it_and_gc_sweeps_old_segments(tmp_path) -> None:
    from lakestream.log.opening import load_state
    from lakestream.log.segments import INDEX_DIR, segment_key
    from lakestream.log.snapshot import snapshot_segments

    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=B, snapshot_interval=2)
    for k in range(16):
        s.append(rows(2 * k, 2))  # versions 1..16: step k holds fragments of versions 2k+1, 2k+2
    s.mark_checkpoint("train", 6)
    s.retain(keep_last=1)  # version 18 reclaims the 12 fragments below step 6
    s.append(rows(32, 2))
    s.append(rows(34, 2))
    assert s.version == 20
    # Each snapshot wrote a segment of what was committed since the one before; the reclaim
    # emptied those of versions (0, 12], which snapshot 18 dropped, and left the rest alone.
    segments = snapshot_segments(s.store, 20)
    assert segments == [segment_key(12, 14, 0, 0), segment_key(14, 16, 0, 0),
                        segment_key(18, 20, 0, 0)]
    reopened = load_state(s.store, uri)
    assert [f.path for f in reopened.all_fragments()] == [f.path for f in s.state.all_fragments()]
    assert len(reopened.all_fragments()) == 16 - 12 + 2
    report = s.gc(grace_seconds=0)
    kept = set(segments) | set(snapshot_segments(s.store, 18))
    assert report.index_segments > 0 and {m.key for m in s.store.list(INDEX_DIR)} == kept
    assert ids(lakestream.open(uri).read_step(8)) == list(range(32, 36))


class RetentionMachine(RuleBasedStateMachine):
    """Produce, mark, retain, gc, crash and reopen in any order: every step at or above the
    retention point a model computes stays readable and exact."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.root = tempfile.mkdtemp()
        self.stream = lakestream.create(f"{self.root}/s", SCHEMA, global_batch_size=B,
                                        snapshot_interval=3)
        self.produced = 0
        self.markers: dict[str, list[int]] = {}
        self.point = 0  # the model's retention point, in steps

    @rule(n=st.integers(1, 3))
    def produce(self, n: int) -> None:
        for _ in range(n):
            self.stream.append(rows(self.produced, 2))
            self.produced += 2

    @rule(group=st.sampled_from(["train", "eval"]), data=st.data())
    def mark(self, group: str, data: st.DataObject) -> None:
        steps = self.produced // B
        if steps < self.point:
            return
        step = data.draw(st.integers(self.point, steps))
        self.stream.mark_checkpoint(group, step)
        self.markers.setdefault(group, []).append(step)

    @rule(keep=st.integers(1, 3))
    def retain(self, keep: int) -> None:
        self.stream.retain(keep_last=keep)
        kept = [s for ms in self.markers.values() for s in ms[-keep:]]
        if kept:
            self.point = max(self.point, min(kept))

    @rule()
    def gc(self) -> None:
        self.stream.gc(grace_seconds=0, delta_checkpoint=False)

    @rule()
    def crash_with_an_orphan(self) -> None:
        self.stream.store.put(f"data/w/9-{self.produced}-orphan.parquet", b"partial upload")
        self.stream = lakestream.open(self.stream.uri)

    @rule()
    def reopen(self) -> None:
        self.stream = lakestream.open(self.stream.uri)

    @invariant()
    def retained_steps_are_exact(self) -> None:
        s = self.stream
        assert s.num_samples == self.produced
        for step in range(self.point, s.num_steps):
            assert ids(s.read_step(step)) == list(range(B * step, B * step + B))

    @precondition(lambda self: self.point > 0)
    @invariant()
    def nothing_below_is_half_kept(self) -> None:
        assert self.stream.state.reclaimed_below <= self.point * B


TestRetentionMachine = RetentionMachine.TestCase
TestRetentionMachine.settings = settings(max_examples=25, stateful_step_count=20, deadline=None)


def test_gc_shows_progress_on_a_terminal_only(tmp_path, monkeypatch, capsys) -> None:
    s = _filled(str(tmp_path / "s"), 4)
    s.mark_checkpoint("train", 3)
    s.retain(keep_last=1)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    report = s.gc(grace_seconds=0, delta_checkpoint=False)
    assert report.data_files == 6 and "gc data" in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    s.mark_checkpoint("train", 4)
    s.retain(keep_last=1)
    assert s.gc(grace_seconds=0, delta_checkpoint=False).data_files == 2
    assert capsys.readouterr().err == ""
