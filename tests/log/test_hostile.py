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
from lakestream.errors import CorruptLogError, StoreError
from tests.helpers import SCHEMA, ids, put_entry, rows

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
    # With data/ a link the log is compacted all the same; with the index one, no snapshot
    # can be read whole, and a reader would need the log from its start.
    assert (report.log_entries > 0) == (linked == "data")
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
    """Commits a file named after ``key`` as a hostile writer would: any bytes, any rows (in
    the folder of ``Stream.append``, the only one a writer may name without a producer)."""
    import zlib

    from lakestream.log.entries import Append, FragmentRef

    key = "data/_append/0-0-" + key.rsplit("/", 1)[-1]
    s.store.put(key, body, mode="create")
    ref = FragmentRef(key, rows, len(body), s.state.next_offset, 0, zlib.crc32(body))
    s.commit(lambda state, cid: Append(None, 0, (ref,), None, cid))


def _parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def test_a_small_fragment_that_decodes_huge_is_refused_before_it_is_decoded(
        tmp_path, monkeypatch) -> None:
    import lakestream.read.bounds

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    # Four rows of a million zeros each: a few KB on disk. Scaled down from the gigabytes
    # such a file can hold by lowering the bound a row may decode to (256 MiB) to 1 MiB.
    zeros = pa.array([[0] * 1_000_000] * 4, pa.list_(pa.int32()))
    body = _parquet(pa.table({"id": pa.array(range(4), pa.int64()), "tokens": zeros,
                              "reward": pa.array([0.0] * 4, pa.float32())}, schema=SCHEMA))
    assert len(body) < 100_000
    _commit_file(s, "data/evil/huge.parquet", body, 4)
    monkeypatch.setattr(lakestream.read.bounds, "MAX_DECODED_BYTES_PER_ROW", 1 << 20)
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
    from lakestream.log.keys import log_key
    from lakestream.log.manifest import HINT_KEY
    from lakestream.log.progress import progress_key, read_progress
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
    from lakestream.log.entries import Append, FragmentRef

    s = _stream(tmp_path)
    ref = FragmentRef("data/_append/0-0-x.parquet", 2**63, 10, s.state.next_offset, 0, 1)
    put_entry(s.store, s.version + 1, Append(None, 0, (ref,), None, "evil"))
    with pytest.raises(CorruptLogError, match="rows '9223372036854775808' is not an integer"):
        lakestream.open(s.uri)


def test_an_entry_larger_than_any_writer_makes_is_refused_unread(tmp_path) -> None:
    from lakestream.log.entries import MAX_ENTRY_BYTES
    from lakestream.log.keys import log_key

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

    from lakestream.log.checksum import lines_checksum
    from lakestream.log.codec import decode_entry, encode_entry
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


# -- special files: an error, never a wait ----------------------------------------------


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)


@pytest.mark.parametrize("where", ["hint", "next", "fragment", "hint-folder"])
def test_a_fifo_or_folder_where_an_object_goes_never_blocks_a_reader(tmp_path, where) -> None:
    """Row 8: a FIFO at the hint, at the next log version or at a fragment made open,
    ``status``, ``read_step`` and ``verify`` block for ever."""
    import multiprocessing

    s = _stream(tmp_path)
    root = Path(s.uri)
    if where == "hint":
        _fifo(root / "_lakestream" / "_last_snapshot")
    elif where == "hint-folder":
        (root / "_lakestream" / "_last_snapshot").unlink()
        (root / "_lakestream" / "_last_snapshot").mkdir()
    elif where == "next":
        from lakestream.log.keys import log_key

        _fifo(root / log_key(s.version + 1))
    else:
        _fifo(root / s.state.fragments_between(0, 4)[0].path)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:  # a blocked read must not take the test run with it
        outcome = pool.apply_async(_open_and_read, (s.uri,))
        result = outcome.get(timeout=60)
    if where in ("hint", "hint-folder"):
        assert result == "read [4, 5, 6, 7]"  # the hint is only a hint
    else:
        assert result.startswith("StoreError") and "not a regular file" in result, result


def _open_and_read(uri: str) -> str:
    from lakestream.ops.verify import verify

    try:
        s = lakestream.open(uri)
        verify(s.store)
        return f"read {ids(s.read_step(1))}"
    except lakestream.LakestreamError as e:
        return f"{type(e).__name__}: {e}"


def test_gc_names_a_folder_where_its_clock_goes(tmp_path) -> None:
    s = _stream(tmp_path)
    (Path(s.uri) / "_lakestream" / "_clock").mkdir(parents=True)
    with pytest.raises(StoreError, match="_clock"):
        s.gc(grace_seconds=0)
    (Path(s.uri) / "_lakestream" / "_clock").rmdir()
    (Path(s.uri) / "_lakestream" / "_compacted").mkdir()
    assert s.gc(grace_seconds=0).log_entries >= 0  # a pointer gc cannot read is no pointer


# -- tensor metadata, advisory numbers, names from the store ------------------------------


def test_a_fragment_cannot_change_a_tensor_columns_shape_or_dtype(tmp_path) -> None:
    """Row 9: the batch took the shape and dtype a fragment's field metadata said."""
    import numpy as np

    from lakestream.loaders.collate import collate_table
    from lakestream.schema.tensors import TENSOR_KEY, tensor_field

    schema = pa.schema([pa.field("id", pa.int64()), tensor_field("x", (2, 2), "uint8")])
    s = lakestream.create(str(tmp_path / "s"), schema, global_batch_size=2)
    other = pa.schema([pa.field("id", pa.int64()),
                       pa.field("x", pa.binary(), metadata={
                           TENSOR_KEY: b'{"shape": [1], "dtype": "int32"}'})])
    table = pa.table({"id": [0, 1], "x": [bytes(range(4)), bytes(range(4, 8))]}, schema=other)
    _commit_file(s, "data/evil/x.parquet", _parquet(table), 2)
    batch = collate_table(lakestream.open(s.uri).read_step(0))
    assert tuple(batch["x"].shape) == (2, 2, 2) and batch["x"].numpy().dtype == np.uint8


@pytest.mark.parametrize("meta", [
    b'{"shape": [4294967296, 4294967296], "dtype": "uint8"}',
    b'{"shape": [' + b"1," * 40 + b'1], "dtype": "uint8"}',
    b'{"shape": ' + b"[" * 100_000 + b"]" * 100_000 + b', "dtype": "uint8"}',
    b'{"shape": [2], "dtype": ["uint8"]}',
])
def test_tensor_metadata_that_overflows_or_nests_is_refused(meta: bytes) -> None:
    """Row 9: overflowing shapes and deep metadata gave RuntimeError and RecursionError."""
    from lakestream.schema.tensors import TENSOR_KEY, tensor_spec

    with pytest.raises(ValueError, match="tensor|metadata"):
        tensor_spec(pa.field("x", pa.binary(), metadata={TENSOR_KEY: meta}))


def test_two_entries_naming_one_file_are_read_as_two_files(tmp_path) -> None:
    """Row 11: on the cached read path a footer cached for one entry's claim of a path was
    used for another's, and the read failed with an IndexError."""
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    body = _parquet(rows(0, 8))
    _commit_file(s, "data/x/shared.parquet", body, 8)
    import zlib

    from lakestream.log.entries import Append, FragmentRef

    key = "data/_append/0-0-shared.parquet"
    s.refresh()
    ref = FragmentRef(key, 4, len(body), s.state.next_offset, 0, zlib.crc32(body))
    s.commit(lambda state, cid: Append(None, 0, (ref,), None, cid))  # the same file, 4 rows
    from lakestream.loaders import StreamDataset

    ds = StreamDataset(s.uri, group=None, timeout=1, max_steps=3)
    with pytest.raises(CorruptLogError, match="holds 8 rows, the log says 4"):
        list(ds)


def test_a_progress_object_with_numbers_out_of_range_is_no_progress(tmp_path) -> None:
    """Row 12: ``"updated": 10**400`` raised OverflowError in ``status``, producers and the
    trainer's progress thread."""
    from lakestream.log.progress import progress_key, read_progress

    s = _stream(tmp_path)
    for body in ('{"step": 1, "updated": 1' + "0" * 400 + "}",
                 '{"step": 1, "updated": NaN}', '{"step": 1, "job": ' + '"x' * 1000 + '"}'):
        s.store.put(progress_key("train"), body.encode())
        assert read_progress(s.store, "train") is None


def test_a_segment_name_with_controls_is_damage_and_reaches_no_terminal(tmp_path) -> None:
    """Row 14: C1 and RLO characters in a manifest's segment name reached stderr raw."""
    import json

    from zlib_ng import zlib_ng

    from lakestream.log.manifest import snapshot_key

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B,
                          snapshot_interval=2)
    s.append(rows(0, 4))
    s.append(rows(4, 4))
    data = s.store.get(snapshot_key(2))
    info = json.loads(data.split(b"\ncrc32:")[0])
    info["segments"][0][0] = "\u202e\x9b31mevil.parquet"
    body = json.dumps(info, sort_keys=True, separators=(",", ":")).encode()
    s.store.put(snapshot_key(2), body + b"\ncrc32:" + str(zlib_ng.crc32(body)).encode() + b"\n")
    from lakestream.log.snapshot import decode_snapshot

    with pytest.raises(CorruptLogError) as caught:
        decode_snapshot(2, s.store.get(snapshot_key(2)), s.store.get)
    assert "\u202e" not in str(caught.value) and "\x9b" not in str(caught.value)
    assert ids(lakestream.open(s.uri).read_step(1)) == [4, 5, 6, 7]  # from the log


def test_the_demo_never_imports_a_lakestream_folder_from_where_it_runs(tmp_path) -> None:
    """Row 16: ``lakestream demo`` started its children with ``python -m``, which imports
    from the working directory first: a planted ``lakestream/`` ran."""
    import subprocess

    from lakestream.demo import job

    planted = tmp_path / "lakestream"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (tmp_path / "fresh").mkdir()
    children: list[subprocess.Popen[bytes]] = []
    cwd = os.getcwd()
    os.chdir(tmp_path)  # where the user ran the demo from
    try:
        child = job._spawn(children, tmp_path / "fresh", "lakestream.errors")
    finally:
        os.chdir(cwd)
    assert child.wait(timeout=60) == 0, child.stderr.read() if child.stderr else ""
    assert not marker.exists()


def test_the_checkpoint_filesystem_keeps_no_secret_where_others_look() -> None:
    """Row 17: the fsspec filesystem for S3 checkpoints kept the secret in its
    ``storage_options`` (shown in reprs, pickled, and in fsspec's process-wide cache)."""
    from lakestream.store import open_filesystem

    fs = open_filesystem("s3://bucket/ckpt", {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "AKEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t-VALUE", "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true"})
    assert "s3cr3t" not in repr(fs.storage_options) + repr(vars(fs))
    assert all("s3cr3t" not in repr(vars(other)) for other in type(fs)._cache.values())
