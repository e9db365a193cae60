"""What a writer of the log cannot do to the stream: rewrite what was committed unseen,
brick it for gc, or wipe it through retention (docs/deployment.md, "Threat model")."""

from __future__ import annotations

import gc
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import lakestream
from lakestream.errors import CorruptLogError
from lakestream.log.codec import encode_entry, entry_digest
from lakestream.log.entries import (
    Append,
    Checkpoint,
    Compacted,
    FragmentRef,
    Reclaim,
    Register,
    RemoveGroup,
)
from lakestream.log.fragments import encode_fragment
from lakestream.log.keys import fragment_key, log_key
from lakestream.log.manifest import snapshot_key
from lakestream.producers import Producer
from tests.helpers import DROP, SCHEMA, edit_entry, ids, put_entry, rows

B = 4


def _stream(uri: str, steps: int = 8, *, interval: int = 100,
            options: dict[str, str] | None = None) -> lakestream.Stream:
    s = lakestream.create(uri, SCHEMA, global_batch_size=B, snapshot_interval=interval,
                          storage_options=options)
    for k in range(steps):
        s.append(rows(B * k, B))
    return s


def _forged_append(s: lakestream.Stream, version: int, first_id: int) -> bytes:
    """The append at ``version`` (whose offset it takes), naming a forged fragment of ids
    ``first_id``...: what a producer's grant lets it write over a committed entry."""
    import zlib

    offset = s.state.fragments_between(B * (version - 1), B * version)[0].offset
    key = fragment_key("evil", 1, 0)
    body = bytes(encode_fragment(rows(first_id, B), 1))
    s.store.put(key, body, mode="create")
    ref = FragmentRef(key, B, len(body), offset, 0, zlib.crc32(body))
    return put_entry(s.store, version, Append("evil", 1, (ref,), None), mode="overwrite")


# -- a rewritten entry is never read silently ------------------------------------------


@pytest.mark.parametrize("where", ["middle", "head"])
def test_a_rewritten_entry_never_gives_two_handles_two_histories(backend, where) -> None:
    """Row 3: a plain PUT over a committed entry (the producer grant allows it on S3): a
    handle opened before and one opened after return the original step or raise
    CorruptLogError naming the version, never two different global batches."""
    uri = backend.uri()
    s = _stream(uri, 8, options=backend.options)
    before = lakestream.open(uri, storage_options=backend.options)
    target = 5 if where == "middle" else s.version
    original = ids(before.read_step(target - 1))
    _forged_append(s, target, 666)
    if where == "head":
        # Nothing follows the rewrite yet: the next commit of a handle that read the
        # original names the original's digest, and from then on the rewrite is refused.
        s.append(rows(999, B))
    with pytest.raises(CorruptLogError, match=f"log version {target + 1} does not follow"):
        lakestream.open(uri, storage_options=backend.options)
    assert ids(before.read_step(target - 1)) == original
    before.refresh()
    assert ids(before.read_step(target - 1)) == original


def test_a_committer_that_read_the_rewrite_cannot_make_it_stick(tmp_path) -> None:
    """A handle that opened after a rewrite of the head commits on top of it: the handles
    that read the original refuse its commit, by name."""
    s = _stream(str(tmp_path / "s"), 6)
    before = lakestream.open(s.uri)
    _forged_append(s, s.version, 666)
    after = lakestream.open(s.uri)
    after.append(rows(999, B))
    with pytest.raises(CorruptLogError, match=f"log version {s.version + 1} does not follow"):
        before.refresh()


def test_an_unchained_entry_after_the_chain_is_refused(tmp_path) -> None:
    """An entry in an older format (no link) after chained ones: a rewrite that strips the
    link, or a lakestream from before the chain, is not read."""
    s = _stream(str(tmp_path / "s"), 4)
    data = edit_entry(encode_entry(Checkpoint("train", 1)), format=1, prev=DROP)
    s.store.put(log_key(s.version + 1), data, mode="create")
    with pytest.raises(CorruptLogError, match="is not chained"):
        lakestream.open(s.uri)


def test_a_snapshot_pins_the_digest_it_covers(tmp_path) -> None:
    """An opener from a snapshot checks the first entry after it against the digest the
    snapshot pins: a rewrite of the snapshot's own version is not read past."""
    s = _stream(str(tmp_path / "s"), 7, interval=5)
    pinned = json.loads(s.store.get(snapshot_key(5)).split(b"\ncrc32:")[0])["digest"]
    assert pinned == entry_digest(s.store.get(log_key(5)))
    _forged_append(s, 5, 666)
    with pytest.raises(CorruptLogError, match="log version 6 does not follow"):
        lakestream.Stream(s.uri, s.store, _replayed(s)).read_step(4)
    assert ids(lakestream.open(s.uri).read_step(4)) == [16, 17, 18, 19]  # from the snapshot


def _replayed(s: lakestream.Stream) -> Any:
    from lakestream.log.replay import ReplayState
    from lakestream.log.tail import read_tail

    return read_tail(s.store, ReplayState())


# -- gc trusts only what it reads ------------------------------------------------------


def test_garbage_at_the_next_snapshot_versions_never_makes_gc_delete_the_last_good_one(
        tmp_path) -> None:
    """Row 1: a producer puts garbage where the next two snapshots go; honest commits go past
    them; gc with no grace compacted every entry below and deleted the last readable
    snapshot, and every later open failed."""
    s = _stream(str(tmp_path / "s"), 6, interval=5)  # a snapshot at version 5
    for v in (10, 15):
        s.store.put(snapshot_key(v), b"{garbage", mode="create")
    for k in range(6, 17):
        s.append(rows(B * k, B))
    assert s.version == 17
    report = s.gc(grace_seconds=0)
    assert any("snapshots/" in line for line in report.forged), report.forged
    fresh = lakestream.open(s.uri)
    assert fresh.version == 17 and ids(fresh.read_step(0)) == [0, 1, 2, 3]
    assert ids(fresh.read_step(16)) == [64, 65, 66, 67]
    assert s.gc(grace_seconds=0).skipped == []  # and gc runs again
    assert ids(lakestream.open(s.uri).read_step(16)) == [64, 65, 66, 67]


def test_a_planted_floor_deletes_nothing_gc_has_not_read_as_a_tombstone(tmp_path) -> None:
    """Row 4: ``_compacted`` naming version 10**18 made gc delete every entry older than an
    hour without reading it; the next append then landed at a freed version."""
    s = _stream(str(tmp_path / "s"), 6, interval=5)
    s.store.put("_lakestream/_compacted", json.dumps({"version": 10**18}).encode())
    old = time.time() - 7200
    import os

    for v in range(s.version + 1):
        os.utime(Path(s.uri) / log_key(v), (old, old))
    s.gc(grace_seconds=0)
    for v in range(5, s.version + 1):  # what readers open from is still there
        assert (Path(s.uri) / log_key(v)).exists()
    s.append(rows(100, B))
    assert lakestream.open(s.uri).version == 7
    assert ids(lakestream.open(s.uri).read_step(6)) == [100, 101, 102, 103]


def test_a_tombstone_at_the_head_is_refused_as_forged_not_blamed_on_gc(tmp_path) -> None:
    """Row 15: a producer writes gc's tombstone at the next version: readers said the log
    was compacted past every snapshot, blaming gc."""
    s = _stream(str(tmp_path / "s"), 3)
    s.store.put(log_key(s.version + 1), encode_entry(Compacted(0, None)), mode="create")
    with pytest.raises(CorruptLogError, match="gc never writes one"):
        lakestream.open(s.uri)


def test_a_far_future_entry_and_a_garbage_delta_checkpoint_are_removed_by_gc(tmp_path) -> None:
    """Row 6: either stopped every gc on a deltalake error, and Delta readers refused the
    table."""
    from tests.helpers import delta_ids

    s = _stream(str(tmp_path / "s"), 3)
    s.store.put(log_key(1000), b'{"commitInfo":{}}\n', mode="create")
    s.store.put("_delta_log/00000000000000000002.checkpoint.parquet", b"garbage")
    report = s.gc(grace_seconds=0)
    assert sorted(line.split(":")[0] for line in report.forged) == [
        "_delta_log/00000000000000000002.checkpoint.parquet", log_key(1000)]
    assert delta_ids(s.uri, None) == list(range(12))
    s.append(rows(12, B))
    assert lakestream.open(s.uri).num_steps == 4


def test_gc_goes_on_when_deltalake_fails(tmp_path, monkeypatch) -> None:
    s = _stream(str(tmp_path / "s"), 3)
    import deltalake

    def fail(*_a: Any, **_k: Any) -> None:
        raise deltalake.exceptions.DeltaError("kernel error")

    monkeypatch.setattr(deltalake.DeltaTable, "create_checkpoint", fail)
    report = s.gc(grace_seconds=0)
    assert any("deltalake failed" in line for line in report.skipped)
    assert report.log_entries == 0  # the log is kept whole without a Delta checkpoint


# -- retention: a writer's entries cannot wipe the stream ------------------------------


@pytest.mark.parametrize("attack", ["marker", "register-first", "after-removal"])
def test_a_hold_past_the_stream_cannot_license_a_reclaim(tmp_path, attack) -> None:
    """Row 2: a marker (or a registration before the trainer's, or after a removal) at
    step 2**62 made a reclaim of everything pass: the trainer got StepNotAvailableError at
    step 0 and gc deleted every data file."""
    s = _stream(str(tmp_path / "s"), 8)
    if attack == "marker":
        s.mark_checkpoint("train", 0)
        put_entry(s.store, s.version + 1, Checkpoint("train", 2**62))
    elif attack == "register-first":
        put_entry(s.store, s.version + 1, Register("train", 2**62))
        s.refresh()
        s.register_group("train", 0)
    else:
        s.register_group("train", 0)
        put_entry(s.store, s.version + 1, RemoveGroup("train"))
        put_entry(s.store, s.version + 2, Register("train", 2**62))
    s.refresh()
    everything = tuple(FragmentRef(f.path, f.rows, f.size, f.offset, -1, f.crc32)
                       for f in s.state.all_fragments())
    put_entry(s.store, s.version + 1, Reclaim(s.state.next_offset, everything))
    fresh = lakestream.open(s.uri)
    assert fresh.state.reclaimed_below == 0
    time.sleep(1.1)
    assert s.gc(grace_seconds=1).data_files == 0
    assert ids(lakestream.open(s.uri).read_step(0)) == [0, 1, 2, 3]


def test_a_registration_holds_from_its_earliest_step(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"), 8)
    put_entry(s.store, s.version + 1, Register("train", 6))  # first, and higher
    s.refresh()
    s.register_group("train", 2)  # the trainer's own registration still holds from step 2
    assert s.group_holds(keep_last=1) == {"train": 2}
    assert lakestream.open(s.uri).group_holds(keep_last=1) == {"train": 2}


def test_retain_reclaims_in_bounded_entries(tmp_path, monkeypatch) -> None:
    """Row 7: the one reclaim entry of 160k live fragments (or of 78k void files) went past
    the largest entry, and every retain failed for good. (Scaled down by the bound.)"""
    import lakestream.log.retention as retention

    monkeypatch.setattr(retention, "MAX_FRAGMENTS_PER_ENTRY", 3)
    s = _stream(str(tmp_path / "s"), 10)
    s.mark_checkpoint("train", 8)
    start = s.version
    last = s.retain(keep_last=1)
    assert last is not None and last - start == 3  # 8 fragments, 3 a time
    fresh = lakestream.open(s.uri)
    assert fresh.state.reclaimed_below == 32 and len(fresh.state.all_fragments()) == 2
    assert ids(fresh.read_step(8)) == [32, 33, 34, 35]


def test_an_append_of_empty_fragments_is_void(tmp_path) -> None:
    """Row 7: void appends of tens of thousands of zero-row fragments filled the reclaim."""
    s = _stream(str(tmp_path / "s"), 2)
    refs = tuple(FragmentRef(f"data/_append/0-0-{k}.parquet", 0, 10, s.state.next_offset, 0)
                 for k in range(50))
    put_entry(s.store, s.version + 1, Append(None, 0, refs, None))
    fresh = lakestream.open(s.uri)
    assert fresh.state.voided == () and fresh.num_samples == 8


def test_an_append_naming_another_writers_file_is_void(tmp_path) -> None:
    """Row 10: an append naming a live fragment's file made a later honest retain make every
    read of the retained steps fail, blaming the honest entry."""
    s = _stream(str(tmp_path / "s"), 4)
    live = s.state.all_fragments()[1]
    with Producer(s.uri, "p") as p:
        p.write(rows(100, B))
    s.refresh()
    dup = FragmentRef(live.path, live.rows, live.size, s.state.next_offset, 9, live.crc32)
    put_entry(s.store, s.version + 1, Append("p", 1, (dup,), None))
    stolen = s.state.all_fragments()[-1]  # p's own, named again under its epoch and a new seq
    again = FragmentRef(stolen.path, stolen.rows, stolen.size, s.state.next_offset, 9,
                        stolen.crc32)
    put_entry(s.store, s.version + 2, Append("p", 1, (again,), None))
    s.refresh()
    assert s.num_samples == 20  # neither landed
    s.mark_checkpoint("train", 3)
    s.retain(keep_last=1)
    time.sleep(1.1)
    s.gc(grace_seconds=1)
    fresh = lakestream.open(s.uri)
    assert ids(fresh.read_step(3)) == [12, 13, 14, 15]
    assert ids(fresh.read_step(4)) == [100, 101, 102, 103]


def test_a_void_append_naming_a_live_file_leaves_it_live(tmp_path) -> None:
    """The files of a void append are reclaimed from the void list only, never from the
    index: a live fragment of the same name stays live (and on disk)."""
    s = _stream(str(tmp_path / "s"), 4)
    with Producer(s.uri, "p") as p:
        p.write(rows(100, B))
    s.refresh()
    mine = s.state.all_fragments()[-1]
    zombie = FragmentRef(mine.path, mine.rows, mine.size, s.state.next_offset, 0,
                         mine.crc32)
    put_entry(s.store, s.version + 1, Append("p", 1, (zombie,), None))  # a duplicate seq
    s.refresh()
    assert [v for v, _ in s.state.voided] == [s.version]
    s.mark_checkpoint("train", 4)
    s.retain(keep_last=1)
    assert s.state.voided == ()
    time.sleep(1.1)
    s.gc(grace_seconds=1)
    assert ids(lakestream.open(s.uri).read_step(4)) == [100, 101, 102, 103]


# -- decoding enforces what writing enforces -------------------------------------------


def test_a_state_no_writer_writes_is_void_and_never_reaches_a_manifest(tmp_path) -> None:
    """Row 1: appends under made-up ids with 30 MiB states made the honest committer write
    manifests larger than readers read."""
    s = _stream(str(tmp_path / "s"), 2, interval=4)
    big = {"blob": "x" * (2 << 20)}
    key = fragment_key("ghost", 0, 0)
    body = bytes(encode_fragment(rows(50, B), 1))
    s.store.put(key, body, mode="create")
    import zlib

    ref = FragmentRef(key, B, len(body), s.state.next_offset, 0, zlib.crc32(body))
    data = put_entry(s.store, s.version + 1, Append("ghost", 0, (ref,), None))
    s.store.put(log_key(s.version + 1), edit_entry(data, state=big))  # past the encoder's check
    s.refresh()
    assert "ghost" not in s.producers and s.num_samples == 8
    s.append(rows(8, B))  # version 4: the snapshot is written
    assert len(s.store.get(snapshot_key(4))) < 100_000
    assert lakestream.open(s.uri).num_samples == 12


def test_a_manifest_readers_would_refuse_is_not_written(tmp_path, monkeypatch) -> None:
    import lakestream.log.manifest as manifest

    s = _stream(str(tmp_path / "s"), 2, interval=4)
    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 1000)
    with Producer(s.uri, "p") as p:
        p.write(rows(8, B), state={"cursor": "y" * 2000})
    s.refresh()
    assert s.version == 4
    assert not (Path(s.uri) / snapshot_key(4)).exists()
    monkeypatch.undo()
    assert lakestream.open(s.uri).producers["p"][2] == {"cursor": "y" * 2000}


def test_commits_do_not_grow_with_the_producers_the_stream_knows(tmp_path) -> None:
    """Row 13: with 100k producer ids each commit copied them all (a second a commit)."""
    from lakestream.log.overlay import OverlayDict
    from lakestream.log.replay import ProducerState

    s = _stream(str(tmp_path / "s"), 1)
    state = s.state.copy()
    state.producers = OverlayDict({f"p{k}": ProducerState(1, k, None) for k in range(100_000)})
    best = float("inf")
    gc.disable()  # a collection of the suite's heap inside a round is not a copy's cost
    try:
        for _ in range(5):  # the best of 5 rounds: the machine's other work is not either
            t0 = time.perf_counter()
            for _ in range(20):
                state = state.copy()
                state.producers[f"new-{uuid.uuid4().hex}"] = ProducerState(1, 0, None)
            best = min(best, (time.perf_counter() - t0) / 20)
    finally:
        gc.enable()
    assert best < 0.002, best
    assert len(state.producers) == 100_100


# -- a fragment decodes to what its pages say, not its footer --------------------------


def _commit_parquet(s: lakestream.Stream, table: Any, **options: Any) -> None:
    """Commits ``table`` written as Parquet with ``options``, as a writer going around the
    encoder would."""
    import zlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **options)
    body = sink.getvalue().to_pybytes()
    key = fragment_key("_append", 0, 0)
    s.store.put(key, body, mode="create")
    ref = FragmentRef(key, table.num_rows, len(body), s.state.next_offset, 0, zlib.crc32(body))
    put_entry(s.store, s.version + 1, Append(None, 0, (ref,), None))
    s.refresh()


def test_a_footer_that_lies_about_its_sizes_bounds_nothing(tmp_path, monkeypatch) -> None:
    """Row 5: a 36 KB fragment whose footer said its chunks were small decoded to 1.2 GB: the
    bound is taken from the pages' own headers. (Scaled down by the bound a row may decode
    to.)"""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import lakestream.read.bounds as bounds
    import lakestream.read.fragments as fragments

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    zeros = pa.array([[0] * 500_000] * B, pa.list_(pa.int32()))
    table = pa.table({"id": pa.array(range(B), pa.int64()), "tokens": zeros,
                      "reward": pa.array([0.0] * B, pa.float32())}, schema=SCHEMA)
    _commit_parquet(s, table, compression="zstd")
    real = fragments._reader

    class Lying:
        """The footer, its chunks' sizes all said to be a few bytes."""

        def __init__(self, md: Any) -> None:
            self._md = md

        def __getattr__(self, name: str) -> Any:
            return getattr(self._md, name)

        def row_group(self, i: int) -> Any:
            group = self._md.row_group(i)
            return type("G", (), {"num_rows": group.num_rows, "num_columns": group.num_columns,
                                  "column": lambda _s, j: _LyingChunk(group.column(j))})()

    class LyingReader:
        def __init__(self, *args: Any) -> None:
            self.metadata = Lying(real(*args).metadata)

    monkeypatch.setattr(fragments, "_reader", LyingReader)
    monkeypatch.setattr(bounds, "MAX_DECODED_BYTES_PER_ROW", 1 << 20)
    with pytest.raises(CorruptLogError, match="would decode to up to"):
        lakestream.open(s.uri).read_step(0)
    assert Lying(pq.read_metadata(pa.BufferReader(s.store.get(
        s.state.all_fragments()[0].path)))).row_group(0).column(1).total_uncompressed_size == 10


class _LyingChunk:
    def __init__(self, chunk: Any) -> None:
        self._chunk = chunk

    def __getattr__(self, name: str) -> Any:
        if name == "total_uncompressed_size":
            return 10
        return getattr(self._chunk, name)


def test_values_that_share_one_dictionary_entry_count_it_once_a_row(tmp_path,
                                                                     monkeypatch) -> None:
    """Row 5: four rows pointing at one 600 MB dictionary entry (18 KB on disk, an honest
    footer) decoded 2.4 GB: a dictionary is counted once per value that may use it.
    (Scaled down: 4 MB, the bound 2 MB a row.)"""
    import pyarrow as pa

    import lakestream.read.bounds as bounds

    schema = pa.schema([("id", pa.int64()), ("blob", pa.binary())])
    s = lakestream.create(str(tmp_path / "s"), schema, global_batch_size=B)
    big = b"\0" * (4 << 20)
    table = pa.table({"id": pa.array(range(B), pa.int64()), "blob": pa.array([big] * B)},
                     schema=schema)
    _commit_parquet(s, table, compression="zstd", use_dictionary=["blob"])
    monkeypatch.setattr(bounds, "MAX_DECODED_BYTES_PER_ROW", 2 << 20)
    with pytest.raises(CorruptLogError, match="would decode to up to"):
        lakestream.open(s.uri).read_step(0)
    monkeypatch.setattr(bounds, "MAX_DECODED_BYTES_PER_ROW", 8 << 20)
    assert lakestream.open(s.uri).read_step(0).column("blob").to_pylist() == [big] * B
