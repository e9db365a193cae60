"""The columnar fragment index: opening fetches no segment, a lookup fetches the segments it
touches, a producer fetches none, and a handle's memory does not grow with what others
commit (docs/design.md §4)."""

from __future__ import annotations

import collections
from typing import Any

import pytest

import lakestream
from lakestream.errors import CorruptLogError
from lakestream.log.entries import Append, FragmentRef, Reclaim
from lakestream.log.index import CACHED_SEGMENTS, FragmentIndex
from lakestream.log.manifest import snapshot_key
from lakestream.log.opening import load_state
from lakestream.log.segments import INDEX_DIR, SEGMENT_FRAGMENTS
from lakestream.log.snapshot import snapshot_segments
from lakestream.producers import Producer
from lakestream.store import open_store
from tests.helpers import SCHEMA, ids, put_entry, rows


class MeteredStore:
    """Counts GETs and the bytes they return, by whether they fetch an index segment."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: collections.Counter[str] = collections.Counter()
        self.bytes: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get(self, key: str, **kwargs: Any) -> bytes:
        kind = "index" if key.startswith(INDEX_DIR) else "other"
        data: bytes = self.inner.get(key, **kwargs)
        self.requests[kind] += 1
        self.bytes[kind] += len(data)
        return data

    def head(self, key: str) -> Any:
        self.requests["head"] += 1
        return self.inner.head(key)


def _wide(uri: str, fragments: int, per_entry: int = 1000, interval: int = 10) -> None:
    """A stream of ``fragments`` one-row fragments, ``per_entry`` per commit (no data files:
    only the index is under test)."""
    s = lakestream.create(uri, SCHEMA, global_batch_size=4, snapshot_interval=interval)
    done = 0
    while done < fragments:
        n = min(per_entry, fragments - done)

        def build(state: Any, cid: str, first: int = done, n: int = n) -> Append:
            refs = tuple(FragmentRef(f"data/_append/0-0-{first + k:09d}.parquet", 1, 100,
                                     state.next_offset + k, 0, 7) for k in range(n))
            return Append(None, 0, refs, None, cid)

        s.commit(build)
        done += n


@pytest.fixture(scope="module")
def small_and_large(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("index")
    small, large = str(root / "small"), str(root / "large")
    _wide(small, 400, per_entry=40)
    _wide(large, 40_000, per_entry=4000)  # 100 times as many, in as many versions
    return small, large


def test_opening_fetches_the_same_at_100_times_the_fragments(small_and_large) -> None:
    small, large = small_and_large
    opened = {}
    for uri in (small, large):
        store = MeteredStore(open_store(uri))
        state = load_state(store, uri)
        assert state.version == 10 and state.index.count() > 0
        opened[uri] = store
    a, b = opened[small], opened[large]
    assert a.requests == b.requests and a.requests["index"] == 0
    # The manifest names one more segment per SEGMENT_FRAGMENTS fragments: a few hundred
    # bytes, where one segment of them is tens of kilobytes.
    per_row = 200
    assert b.bytes["other"] - a.bytes["other"] <= per_row * (40_000 // SEGMENT_FRAGMENTS + 1)


def test_a_lookup_fetches_only_the_segments_it_touches(small_and_large) -> None:
    _, large = small_and_large
    store = MeteredStore(open_store(large))
    state = load_state(store, large)
    segments = len(state.index.parts)
    assert segments >= 40_000 // SEGMENT_FRAGMENTS
    last = state.fragments_between(39_996, 40_000)
    assert [f.offset for f in last] == [39_996, 39_997, 39_998, 39_999]
    assert store.requests["index"] == 1
    first = state.fragments_between(0, 4)
    assert [f.path for f in first] == [f"data/_append/0-0-{k:09d}.parquet" for k in range(4)]
    assert store.requests["index"] == 2
    state.fragments_between(1, 3)  # cached
    assert store.requests["index"] == 2
    assert [f.offset for f in state.all_fragments()] == list(range(40_000))


def test_a_producer_commits_on_a_large_stream_without_fetching_the_index(
        small_and_large, monkeypatch: pytest.MonkeyPatch) -> None:
    _, large = small_and_large

    def refuse(self: FragmentIndex, part: Any) -> Any:
        raise AssertionError(f"fetched index segment {part.key}")

    monkeypatch.setattr(FragmentIndex, "_fetch", refuse)
    with Producer(large, "writer") as p:
        for k in range(25):  # past two snapshots of interval 10: it writes them too
            p.write(rows(4 * k, 4))
            p.flush()
    s = lakestream.open(large)
    assert s.version >= 10 + 25 and s.num_samples == 40_000 + 100
    monkeypatch.undo()
    assert ids(s.read_step(s.num_steps - 1)) == [96, 97, 98, 99]


def test_memory_held_by_a_handle_does_not_grow_with_what_others_commit(tmp_path) -> None:
    uri = str(tmp_path / "s")
    _wide(uri, 100, per_entry=10)
    watcher = lakestream.open(uri)
    writer = lakestream.open(uri)
    for k in range(60):  # six snapshot intervals of 10 versions, 50 fragments each
        writer.append(rows(4 * k, 4))
        watcher.refresh()
    # Without rebasing it would hold all 60 appended fragments; it holds those past the
    # newest snapshot it has seen.
    assert watcher.version == writer.version
    assert watcher.state.index.in_memory <= 10
    assert watcher.state.all_fragments() == writer.state.all_fragments()


def test_a_reclaim_shrinks_stored_segments_when_they_are_read(tmp_path) -> None:
    uri = str(tmp_path / "s")
    _wide(uri, 100, per_entry=10)
    s = lakestream.open(uri)  # every fragment in stored segments
    s.register_group("train", 2)  # a group that holds from offset 8: what may go
    gone = tuple(FragmentRef(f"data/_append/0-0-{k:09d}.parquet", 1, 100, k, -1, 7)
                 for k in range(8))
    s.commit(lambda _state, cid: Reclaim(8, gone, cid))
    assert [f.offset for f in s.state.all_fragments()] == list(range(8, 100))
    assert s.state.index.count() == 92
    # The next snapshot rewrites only the shrunk segment, and a reopened handle agrees.
    while s.version % 10:
        s.append(rows(0, 4))
    reopened = lakestream.open(uri)
    assert reopened.state.all_fragments() == s.state.all_fragments()


def test_a_reclaim_of_a_fragment_past_its_point_is_corrupt_for_every_handle(tmp_path) -> None:
    # Regression: a handle holding the fragment in memory refused the entry at replay, one
    # holding it in a stored segment ignored it or failed later, when reading the segment.
    uri = str(tmp_path / "s")
    _wide(uri, 100, per_entry=10)
    lakestream.open(uri).register_group("train", 1)  # reclaims below offset 4 may land
    stored = lakestream.open(uri)  # from the snapshot at version 10: segments
    store = open_store(uri)
    replayed = lakestream.Stream(uri, store, load_state(NoSnapshots(store), uri))  # in memory
    bad = (FragmentRef("data/_append/0-0-000000050.parquet", 1, 100, 50, -1, 7),)
    v = stored.version + 1
    put_entry(stored.store, v, Reclaim(2, bad, "bad"))
    for handle in (stored, replayed):
        with pytest.raises(CorruptLogError, match="000000050"):
            handle.refresh()


class NoSnapshots:
    """A store in which no snapshot can be found: opening replays the log."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get(self, key: str, **kwargs: Any) -> bytes:
        if key.startswith("_lakestream/"):
            from lakestream.errors import NotFoundError

            raise NotFoundError(key)
        data: bytes = self.inner.get(key, **kwargs)
        return data

    def head(self, key: str) -> Any:
        return self.get(key) and self.inner.head(key)

    def list(self, prefix: str) -> Any:
        return iter(()) if prefix.startswith("_lakestream/") else self.inner.list(prefix)


def test_a_damaged_segment_is_named_when_read(tmp_path) -> None:
    uri = str(tmp_path / "s")
    _wide(uri, 100, per_entry=10)
    s = lakestream.open(uri)
    key = s.state.index.parts[0].key
    assert key is not None
    s.store.put(key, b"not parquet")
    with pytest.raises(CorruptLogError, match="CRC-32"):
        s.state.fragments_between(0, 4)


def test_a_format_2_snapshot_still_opens(tmp_path) -> None:
    """Format 2 named segments without offsets; opening fetches them, as it did."""
    import json
    import zlib

    uri = str(tmp_path / "s")
    _wide(uri, 100, per_entry=10)
    store = open_store(uri)
    data = store.get(snapshot_key(10))
    body = json.loads(data.rpartition(b"\ncrc32:")[0])
    body["format"] = 2
    body["segments"] = [[INDEX_DIR + row[0], *row[1:5]] for row in body["segments"]]
    old = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    store.put(snapshot_key(10), old + b"\ncrc32:" + str(zlib.crc32(old)).encode() + b"\n")
    s = lakestream.open(uri)
    assert [f.offset for f in s.state.all_fragments()] == list(range(100))
    while s.version % 10:
        s.append(rows(0, 4))  # the next snapshot is format 3 and names the same segments
    assert [f.offset for f in lakestream.open(uri).state.all_fragments()][:100] == \
        list(range(100))


@pytest.mark.parametrize("damage, named", [
    (lambda rows: [rows[0], rows[0], *rows[1:]], "overlaps"),  # a row twice
    (lambda rows: [[*rows[0][:5], str(rows[0][5]), rows[0][6]], *rows[1:]],
     "not a name and numbers"),
])
def test_a_manifest_with_its_checksum_but_wrong_segment_rows_is_corrupt(
        tmp_path, damage: Any, named: str) -> None:
    """What a writer's bug (not a torn byte, which the checksum catches) would record."""
    import json
    import zlib

    from lakestream.log.snapshot import decode_snapshot

    uri = str(tmp_path / "s")
    _wide(uri, 100, per_entry=10, interval=5)
    store = open_store(uri)
    body = json.loads(store.get(snapshot_key(10)).rpartition(b"\ncrc32:")[0])
    assert len(body["segments"]) == 2
    body["segments"] = damage(body["segments"])
    bad = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(CorruptLogError, match=f"snapshot .*{snapshot_key(10)}.*{named}"):
        decode_snapshot(10, bad + b"\ncrc32:" + str(zlib.crc32(bad)).encode() + b"\n",
                        store.get)


def test_a_handle_that_wrote_its_segments_fetches_them_back_once_evicted(tmp_path) -> None:
    # Regression: a state that began in memory (a created stream) had no store to fetch
    # from, so once the segments it had written left the cache, reading them failed.
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4,
                          snapshot_interval=1)
    for k in range(CACHED_SEGMENTS + 8):  # a segment per commit: more than the cache holds
        s.append(rows(4 * k, 4))
    assert s.state.index.in_memory == 0
    assert [f.offset for f in s.state.fragments_between(0, 4)] == [0]  # no fallback


def test_a_stale_handle_reopens_when_gc_deleted_a_segment_a_reclaim_superseded(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: a handle that held an old manifest's segment names hit a deleted segment
    # after a reclaim rewrote it and gc swept the original; its only way out replayed the
    # log from version 0, which gc had compacted away.
    import lakestream.log.view

    uri = str(tmp_path / "s")
    writer = lakestream.create(uri, SCHEMA, global_batch_size=4, snapshot_interval=4)
    for k in range(8):
        writer.append(rows(4 * k, 4))
    stale = lakestream.open(uri)  # names the segments of snapshot 8
    writer.mark_checkpoint("train", 2)
    writer.retain(keep_last=1)  # shrinks the segment holding steps 0-3
    while writer.version < 16:  # two more snapshots: gc keeps none that names the original
        writer.append(rows(100, 4))
    writer.gc(grace_seconds=0)

    def no_replay(*_: Any) -> Any:
        raise AssertionError("replayed the log instead of reopening")

    held = {p.key for p in stale.state.index.parts}
    assert held - {m.key for m in writer.store.list(INDEX_DIR)}  # gc deleted one it names
    monkeypatch.setattr(lakestream.log.view, "replay_log", no_replay)
    assert ids(stale.read_step(3)) == [12, 13, 14, 15]


def test_a_segment_put_that_finds_its_key_taken_refreshes_its_timestamp(tmp_path) -> None:
    # Regression: the writer reused an unnamed segment a dead writer had left, with its old
    # timestamp, so gc could delete it before the new manifest named it.
    import os

    from lakestream.log.segments import Columns
    from lakestream.log.snapshot import _put_segment

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4,
                          snapshot_interval=1)
    s.append(rows(0, 4))
    part = s.state.index.parts[0]
    assert part.key is not None
    path = os.path.join(s.uri, part.key)
    os.utime(path, (1_000_000_000, 1_000_000_000))
    cols = Columns.from_fragments(s.state.all_fragments())
    _put_segment(s.store, s.state.index.copy(), part.key, part.lo, part.hi, cols)
    assert s.store.head(part.key).last_modified > 1_000_000_000 + 3600


def test_a_reclaim_that_shrinks_nothing_rewrites_no_segment(tmp_path) -> None:
    uri = str(tmp_path / "s")
    _wide(uri, 100, per_entry=10)
    s = lakestream.open(uri)
    s.register_group("train", 13)  # holds from offset 52
    keys = [p.key for p in s.state.index.parts]
    void = (FragmentRef("data/void/0.parquet", 1, 100, 0, 0, 7),)  # not a live file
    s.commit(lambda _state, cid: Reclaim(50, void, cid))
    while s.version % 10:
        s.append(rows(0, 4))
    assert [p.key for p in s.state.index.parts][:len(keys)] == keys


def test_a_writer_idle_across_a_gc_never_names_a_collected_segment(tmp_path) -> None:
    """A writer's state names the segments of the manifest it last rebased on; gc deletes a
    segment once no remaining manifest names it. A writer idle across that gc wrote its next
    manifest naming the deleted segment, and every opener failed on it (found by the S3
    fault soak). It puts the segment again from the columns it holds."""
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4,
                          snapshot_interval=2)
    for k in range(5):
        s.append(rows(4 * k, 4))
    store = open_store(s.uri)
    first = f"{INDEX_DIR}0-2-0-0.parquet"
    store.head(first)  # the manifest at version 4 names it
    store.delete(first)  # collected, as gc does once a newer manifest no longer names it
    s.append(rows(20, 4))
    s.append(rows(24, 4))  # version 6: this writer's next manifest
    named = snapshot_segments(store, 6)
    assert first in named
    for key in named:  # each one there: the log below may be compacted, with no fallback
        store.head(key)
    fresh = lakestream.open(s.uri)
    assert fresh.num_steps == 7
    assert [ids(fresh.read_step(k)) for k in range(7)] == [
        list(range(4 * k, 4 * k + 4)) for k in range(7)]
