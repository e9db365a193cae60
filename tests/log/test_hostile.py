"""What a writer of the stream's folder or log cannot do to the rest of the machine or the
stream (docs/deployment.md, "Threat model")."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lakestream
import lakestream.read.fragments
from lakestream.errors import CorruptLogError, StoreError
from tests.helpers import SCHEMA, ids, rows

B = 4


def _old_files(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for k in range(n):
        f = folder / f"precious-{k}.parquet"
        f.write_bytes(b"not the stream's")
        os.utime(f, (time.time() - 3600, time.time() - 3600))
        files.append(f)
    return files


def _stream(tmp_path: Path) -> lakestream.Stream:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B, snapshot_interval=5)
    for k in range(12):
        s.append(rows(4 * k, 4))
    return s


@pytest.mark.parametrize("linked", ["data", "_lakestream/index"])
def test_gc_never_deletes_through_a_link_out_of_the_stream(tmp_path, linked) -> None:
    s = _stream(tmp_path)
    outside = tmp_path / "elsewhere"
    precious = _old_files(outside, 3)
    real = Path(s.uri) / linked
    os.rename(real, tmp_path / "moved")  # the stream's own files, out of reach now
    os.symlink(outside, real)
    time.sleep(1.1)
    report = s.gc(grace_seconds=1)
    assert all(f.exists() for f in precious)
    assert report.skipped and "link" in report.skipped[0]
    assert report.log_entries > 0  # the log is compacted all the same
    if linked == "data":  # and nothing is written through it either
        with pytest.raises(StoreError, match="link"):
            s.append(rows(100, 4))
        assert sorted(p.name for p in outside.iterdir()) == sorted(f.name for f in precious)


def test_a_fragment_that_is_a_link_is_not_read_and_only_the_link_is_deleted(tmp_path) -> None:
    s = _stream(tmp_path)
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 100)
    first = s.state.fragments_between(0, 4)[0].path
    path = Path(s.uri) / first
    path.unlink()
    os.symlink(secret, path)
    fresh = lakestream.open(s.uri)
    with pytest.raises(StoreError, match="link"):
        fresh.read_step(0)
    assert ids(fresh.read_step(1)) == [4, 5, 6, 7]
    stray = Path(s.uri) / "data" / "_append" / "stray.parquet"
    os.symlink(secret, stray)
    os.utime(stray, (time.time() - 3600,) * 2, follow_symlinks=False)
    s.gc(grace_seconds=1)
    assert not stray.is_symlink() and secret.read_bytes() == b"x" * 100


def test_gc_skips_a_file_it_cannot_name_and_compacts(tmp_path) -> None:
    s = _stream(tmp_path)
    odd = Path(s.uri) / "data" / "evil"
    odd.mkdir()
    (odd / "a\\b.parquet").write_bytes(b"?")
    os.utime(odd / "a\\b.parquet", (time.time() - 3600,) * 2)
    time.sleep(1.1)
    report = s.gc(grace_seconds=1)
    assert report.log_entries > 0
    assert any("a\\\\b.parquet" in line for line in report.skipped), report.skipped
    assert (odd / "a\\b.parquet").exists()


# -- crafted bytes: every parse bounded and typed ----------------------------------------


def _commit_file(s: lakestream.Stream, key: str, body: bytes, rows: int) -> None:
    """Commits ``key`` (already in the store) as a hostile writer would: any file, any rows."""
    import zlib

    from lakestream.log.entries import Append, FragmentRef

    s.store.put(key, body, mode="create")
    ref = FragmentRef(key, rows, len(body), s.state.next_offset, 0, zlib.crc32(body))
    s.commit(lambda state, cid: Append(None, 0, (ref,), None, cid))


def _parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def test_a_small_fragment_that_decodes_huge_is_refused_before_it_is_decoded(
        tmp_path, monkeypatch) -> None:
    import lakestream.read.fragments

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    # Four rows of a million zeros each: a few KB on disk. Scaled down from the gigabytes
    # such a file can hold by lowering the bound a row may decode to (256 MiB) to 1 MiB.
    zeros = pa.array([[0] * 1_000_000] * 4, pa.list_(pa.int32()))
    body = _parquet(pa.table({"id": pa.array(range(4), pa.int64()), "tokens": zeros,
                              "reward": pa.array([0.0] * 4, pa.float32())}, schema=SCHEMA))
    assert len(body) < 100_000
    _commit_file(s, "data/evil/huge.parquet", body, 4)
    monkeypatch.setattr(lakestream.read.fragments, "MAX_DECODED_BYTES_PER_ROW", 1 << 20)
    before = pa.total_allocated_bytes()
    t0 = time.monotonic()
    with pytest.raises(CorruptLogError, match="would decode to up to"):
        lakestream.open(s.uri).read_step(0)
    assert time.monotonic() - t0 < 2 and pa.total_allocated_bytes() - before < 4_000_000


@pytest.mark.parametrize("table, rows, match", [
    (pa.table({"id": pa.array(range(2000), pa.int64()),
               "tokens": pa.array([[1]] * 2000, pa.list_(pa.int32())),
               "reward": pa.array([0.0] * 2000, pa.float32())}), 4,
     "holds 2000 rows, the log says 4"),
    (pa.table({"id": pa.array(["a"] * 4), "extra": pa.array([b"x"] * 4)}), 4,
     "its schema is id: string, extra: binary, the stream's is id: int64"),
], ids=["rows", "schema"])
def test_a_fragment_is_read_only_as_the_log_describes_it(tmp_path, table, rows, match) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    _commit_file(s, "data/evil/lie.parquet", _parquet(table), rows)
    with pytest.raises(CorruptLogError, match=match):
        lakestream.open(s.uri).read_step(0)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deeply_nested_json_is_a_typed_error_or_ignored_where_advisory(tmp_path) -> None:
    from lakestream.log.entries import log_key
    from lakestream.log.progress import progress_key, read_progress
    from lakestream.log.snapshot import HINT_KEY
    from lakestream.producers import Producer

    s = _stream(tmp_path)
    deep = _nested(100_000).encode()
    s.store.put(HINT_KEY, b'{"version": ' + deep + b"}", mode="overwrite")
    assert lakestream.open(s.uri).version == s.version  # a hint is only a hint
    s.store.put(progress_key("train"), b'{"step": ' + deep + b"}", mode="overwrite")
    assert read_progress(s.store, "train") is None  # advisory: no progress
    with Producer(s.uri, "p", max_lag_steps=100) as p:  # reads that progress, and goes on
        p.write(rows(48, 4))
    s.refresh()
    s.store.put(log_key(s.version + 1), b'{"commitInfo": ' + deep + b"}\n", mode="create")
    with pytest.raises(CorruptLogError, match="nested too deeply"):
        lakestream.open(s.uri)


def test_counts_past_int64_are_damage_not_data(tmp_path) -> None:
    from lakestream.log.codec import encode_entry
    from lakestream.log.entries import Append, FragmentRef, log_key

    s = _stream(tmp_path)
    ref = FragmentRef("data/evil/x.parquet", 2**63, 10, s.state.next_offset, 0, 1)
    s.store.put(log_key(s.version + 1),
                encode_entry(Append(None, 0, (ref,), None, "evil")), mode="create")
    with pytest.raises(CorruptLogError, match="rows '9223372036854775808' is not an integer"):
        lakestream.open(s.uri)


def test_an_entry_larger_than_any_writer_makes_is_refused_unread(tmp_path) -> None:
    from lakestream.log.entries import MAX_ENTRY_BYTES, log_key

    s = _stream(tmp_path)
    s.store.put(log_key(s.version + 1), b"x" * (MAX_ENTRY_BYTES + 10), mode="create")
    t0 = time.monotonic()
    with pytest.raises(CorruptLogError, match="larger than 33,554,432 bytes"):
        lakestream.open(s.uri)
    assert time.monotonic() - t0 < 5


# -- authority: what a producer's entry cannot do -------------------------------------------


def test_a_reclaim_past_what_the_markers_hold_is_void(tmp_path) -> None:
    from lakestream.log.entries import FragmentRef, Reclaim

    s = _stream(tmp_path)  # 12 steps
    s.mark_checkpoint("train", 10)
    everything = tuple(FragmentRef(f.path, f.rows, f.size, f.offset, -1, f.crc32)
                       for f in s.state.all_fragments())
    # A producer's identity may write the log: it writes the reclaim retain never would.
    s.commit(lambda state, cid: Reclaim(s.state.next_offset, everything, cid))
    fresh = lakestream.open(s.uri)
    assert fresh.state.reclaimed_below == 0
    assert ids(fresh.read_step(0)) == [0, 1, 2, 3]
    time.sleep(1.1)
    assert s.gc(grace_seconds=1).data_files == 0  # nothing live is deleted
    assert ids(lakestream.open(s.uri).read_step(11)) == [44, 45, 46, 47]
    # What retain may reclaim (below the marker) still goes.
    assert s.retain(keep_last=1) is not None
    assert lakestream.open(s.uri).state.reclaimed_below == 40


@pytest.mark.parametrize("field, value", [("tags", True), ("tags", [1]), ("path", 7)])
def test_an_entry_with_a_value_of_another_type_is_damage(field: str, value: object) -> None:
    """Found by the soak's fuzzing: ``"tags": true`` in an add action raised a raw
    ``AttributeError`` from the decoder."""
    import json

    from lakestream.log.codec import decode_entry, encode_entry, lines_checksum
    from lakestream.log.entries import Append, FragmentRef

    ref = FragmentRef("data/p/0-0-a.parquet", 4, 10, 0, 0, 1)
    lines = [json.loads(line) for line in encode_entry(Append("p", 0, (ref,), None, "c"))
             .decode().splitlines()]
    for action in lines:
        if "add" in action:
            action["add"][field] = value
    info = lines[0]["commitInfo"]["lakestream"]
    info.pop("crc32")
    info["crc32"] = lines_checksum(lines)
    data = "".join(json.dumps(a) + "\n" for a in lines).encode()
    with pytest.raises(CorruptLogError, match="log version 1"):
        decode_entry(1, data)
