"""Reading fragments: every byte a reader takes is checked, by the whole-file CRC-32 the
commit records or, for fragments read by row group, by Parquet's page checksums; the cache
shared by a reader's threads decodes each fragment once."""

from __future__ import annotations

import zlib
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lakestream
import lakestream.log.fragments as fragment
from lakestream.errors import CorruptLogError
from lakestream.log.fragments import encode_fragment
from lakestream.read.fragments import FragmentReader
from lakestream.store.local import LocalStore


def _table(n: int, width: int) -> pa.Table:
    return pa.table({"id": pa.array(range(n), pa.int64()),
                     "tokens": pa.array([list(range(i, i + width)) for i in range(n)],
                                        pa.list_(pa.int32()))})


def _damage_tokens(body: bytes) -> bytes:
    """One flipped byte among the token values (the end of their column chunk)."""
    col = pq.ParquetFile(pa.BufferReader(body)).metadata.row_group(0).column(1)
    at = col.data_page_offset + col.total_compressed_size - 3
    return body[:at] + bytes([body[at] ^ 0x40]) + body[at + 1:]


def _read(tmp_path, body: bytes, crc32: int, rows: tuple[int, int] = (0, 4),
          store: LocalStore | None = None) -> pa.Table:
    store = store or LocalStore(str(tmp_path))
    store.put("f.parquet", body)
    return FragmentReader(store).read("f.parquet", len(body), *rows, crc32=crc32, rows=4)


@pytest.mark.parametrize("whole_file_bytes, width", [(1 << 12, 2_000), (1 << 9, 2)],
                         ids=["large-table", "small-table-large-file"])
def test_a_fragment_read_by_row_group_carries_page_checksums(tmp_path, monkeypatch,
                                                             whole_file_bytes, width) -> None:
    """Past ``WHOLE_FILE_BYTES`` a reader takes row groups alone: a damaged page is named
    there, whether the table was large or only its file came out large."""
    monkeypatch.setattr(fragment, "WHOLE_FILE_BYTES", whole_file_bytes)
    table = _table(4, width)
    body = bytes(encode_fragment(table, 4, compression="none"))
    assert len(body) > whole_file_bytes
    assert (table.nbytes > whole_file_bytes // 2) == (width > 2)  # both ways to get there
    assert _read(tmp_path / "ok", body, crc32=zlib.crc32(body), rows=(3, 4)).num_rows == 1
    with pytest.raises(CorruptLogError, match="f.parquet"):
        _read(tmp_path / "bad", _damage_tokens(body), crc32=zlib.crc32(body), rows=(3, 4))


class _CountingStore(LocalStore):
    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.gets = 0

    def get(self, key: str, **kwargs: object) -> bytes:
        self.gets += 1
        return super().get(key, **kwargs)  # type: ignore[arg-type]

    def get_buffer(self, key: str, size: int):  # type: ignore[no-untyped-def]
        self.gets += 1
        return super().get_buffer(key, size)


def test_a_large_fragment_mostly_wanted_is_read_whole_and_checked_by_its_crc(tmp_path,
                                                                             monkeypatch) -> None:
    """Read by row group, a fragment of 64 images cost 2.5x the CPU of one GET and a CRC-32
    (Parquet's page checksums are slow): when half its rows or more are wanted, it is read
    whole and checked whole."""
    monkeypatch.setattr(fragment, "WHOLE_FILE_BYTES", 1 << 12)
    body = bytes(encode_fragment(_table(4, 2_000), 4, compression="none"))
    assert len(body) > 1 << 12
    store = _CountingStore(str(tmp_path / "whole"))
    assert _read(tmp_path, body, crc32=zlib.crc32(body), rows=(1, 3), store=store).num_rows == 2
    assert store.gets == 1
    partial = _CountingStore(str(tmp_path / "partial"))
    _read(tmp_path, body, crc32=zlib.crc32(body), rows=(3, 4), store=partial)
    assert partial.gets == 0  # by row group, through ranged reads
    with pytest.raises(CorruptLogError, match="CRC-32"):
        _read(tmp_path / "bad", _damage_tokens(body), crc32=zlib.crc32(body), rows=(0, 4))


def test_a_small_fragment_is_checked_by_its_crc_alone(tmp_path) -> None:
    """Below ``WHOLE_FILE_BYTES`` pages carry no checksum (the encoder skips that work):
    the damage passes Parquet unseen and the whole-file CRC-32 names it."""
    body = bytes(encode_fragment(_table(4, 64), 4, compression="none"))
    damaged = _damage_tokens(body)
    assert _read(tmp_path / "unchecked", damaged, crc32=-1).num_rows == 4  # no page checksum
    with pytest.raises(CorruptLogError, match="CRC-32"):
        _read(tmp_path / "checked", damaged, crc32=zlib.crc32(body))


def test_the_fragment_cache_loads_once_and_keeps_an_entry_until_its_last_step_is_read(
        ) -> None:
    import threading

    from lakestream.read.cache import OVERTAKEN, FragmentCache

    cache = FragmentCache(max_bytes=1 << 30)
    loads: list[str] = []
    gate = threading.Event()

    def load(name: str) -> pa.Table:
        loads.append(name)
        gate.wait(5)
        return pa.table({"x": [1, 2, 3]})

    threads = [threading.Thread(target=cache.fetch, args=(("a", "*"), lambda: load("a")))
               for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert loads == ["a"] and cache.decoded == 1  # four readers, one decode
    cache.begin(0)
    cache.fetch("a0", lambda: load("a0"), until=0)
    cache.fetch("b2", lambda: load("b2"), until=2)
    cache.end(0)
    cache.begin(1)  # a read of step 1 while step 0's is over: step 0's entry stays a while
    cache.end(1)
    assert cache.holds("a0", "b2", ("a", "*"))
    # Later steps begin, and end, before step 2 does (a pool thread took it first but began
    # it last): what step 2 needs stays.
    for step in range(3, 3 + OVERTAKEN):
        cache.begin(step)
        cache.end(step)
    assert not cache.holds("a0") and cache.holds("b2")
    cache.begin(2)
    cache.fetch("b2", lambda: load("b2"), until=2)
    cache.end(2)
    assert loads == ["a", "a0", "b2"]  # b2 loaded once for steps 0..2
    for step in range(3 + OVERTAKEN, 4 + 2 * OVERTAKEN):
        assert cache.holds("b2")  # step 2 began lately: one begun before it may yet come
        cache.begin(step)
        cache.end(step)
    assert not cache.holds("b2")  # every recent step is past it
    assert cache.holds(("a", "*"))  # loaded with no last step: only the bound drops it


def test_the_fragment_cache_stays_within_its_bound_least_recently_used_first_out() -> None:
    from lakestream.read.cache import FragmentCache

    one = pa.table({"x": list(range(100))})
    size = one.get_total_buffer_size()
    cache = FragmentCache(max_bytes=2 * size)
    for key in "abc":
        cache.fetch(key, lambda: one, until=10)
        cache.fetch("a", lambda: one, until=10)  # "a" is used again each time
    assert cache.holds("a", "c") and not cache.holds("b")
    assert cache.nbytes == 2 * size
    cache.fetch("data", lambda: pa.py_buffer(b"12345"))
    assert cache.fetched == 1 and cache.decoded == 3  # files fetched, row groups decoded
    cache.discard("data")
    assert not cache.holds("data") and cache.nbytes <= 2 * size


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_shuffled_mix_decodes_each_fragment_once_an_epoch_when_windows_straddle_steps(
        tmp_path, seed: int) -> None:
    # 40 samples in fragments of 4, windows of 4 steps of 4: two windows of 16 and a short
    # one of 8, placed anywhere in an epoch's order, so a source window can begin in the
    # middle of the steps' window and end in the next one.
    from lakestream.read.steps import Source, mix_steps
    from tests.helpers import SCHEMA, rows

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    for i in range(10):
        s.append(rows(4 * i, 4))
    s.seal()
    mix = mix_steps([Source(s.uri, take=4)], [lakestream.open(s.uri)], shuffle_window=4,
                    epochs=3, seed=seed)
    cache = mix.cache
    fetch, decoded = cache.fetch, []

    def counted(key, load, until=None):  # what each epoch decodes
        return fetch(key, lambda: (decoded[-1].append(key), load())[1], until=until)

    cache.fetch = counted  # type: ignore[method-assign]
    seen = []
    for epoch in range(3):
        decoded.append([])
        for step in range(10 * epoch, 10 * epoch + 10):
            seen += mix.read(step, 0, 1).column("id").to_pylist()
        assert len(decoded[-1]) == len(set(decoded[-1])), f"epoch {epoch}: {decoded[-1]}"
    assert sorted(seen) == sorted(list(range(40)) * 3)


@pytest.mark.parametrize("prefetch, loads", [(None, 2), (8, 1)])
def test_the_cache_keeps_what_a_step_begun_late_needs_up_to_the_readers_prefetch(
        prefetch: int | None, loads: int) -> None:
    """A reader with a prefetch of 8 may begin step 2 after steps 3 to 9 have come and gone:
    what step 3 loaded, and step 2 needs, must still be there (the cache kept the last 5
    steps begun, whatever the prefetch)."""
    from lakestream.read.cache import FragmentCache

    cache = FragmentCache(max_bytes=1 << 30)
    if prefetch is not None:
        cache.expect_overtaking(prefetch)
    calls: list[int] = []

    def load() -> pa.Table:
        calls.append(1)
        return pa.table({"x": [1]})

    cache.begin(3)
    cache.fetch("k", load, until=3)
    cache.end(3)
    for step in range(4, 10):
        cache.begin(step)
        cache.end(step)
    cache.begin(2)
    cache.fetch("k", load, until=3)
    cache.end(2)
    assert len(calls) == loads


def test_a_footer_whose_row_group_has_other_columns_than_the_schema_is_refused() -> None:
    """Found by the soak's fuzzing of fragment bytes: pyarrow aborted the whole process on
    reading a column chunk past the ones a mutated row group held. The bound refuses such a
    footer before touching a column."""
    from types import SimpleNamespace

    from lakestream.read.footer import check_footer

    def column(j: int) -> object:
        raise AssertionError("a column chunk was read")

    group = SimpleNamespace(num_columns=3, num_rows=1, column=column)
    md = SimpleNamespace(num_columns=2, num_row_groups=1, row_group=lambda i: group)
    with pytest.raises(ValueError, match="row group 0 holds 3 columns, the schema 2"):
        check_footer(md, memoryview(b""))  # type: ignore[arg-type]


def _footer_changed(body: bytes, values: Any, wanted: Any) -> bytes:
    """``body`` with one byte of its footer changed, to one of ``values(byte)``, so that
    pyarrow still parses it and ``wanted(facts)`` holds for the facts of one of its chunks."""
    from lakestream.read.footer import chunk_facts, footer_bytes

    end = len(body) - 8
    start = end - int.from_bytes(body[end:end + 4], "little")
    for at in range(start, end):
        for value in values(body[at]):
            changed = body[:at] + bytes([value]) + body[at + 1:]
            try:
                pq.ParquetFile(pa.BufferReader(changed))
                facts = chunk_facts(footer_bytes(memoryview(changed), len(changed)))
            except (OSError, ValueError):
                continue
            if any(wanted(f) for g in facts for f in g):
                return changed
    raise AssertionError("no byte of the footer changes it so")


CHANGES = {
    # the codec UNCOMPRESSED (0, zigzag 0) made -51 (zigzag 101)
    "codec": (lambda b: [101] if b == 0 else [],
              lambda f: f.codec == -51,
              "names compression codec -51, which Parquet does not define"),
    # a list of i64 (a level histogram) made longer than its column's levels
    "histogram": (lambda b: [(k << 4) | 6 for k in range(3, 6)] if b & 0x0F == 6 else [],
                  lambda f: f.definition_levels > 2 or f.repetition_levels > 1,
                  "level histogram of"),
}


def test_a_footer_entry_pyarrow_aborts_on_is_refused(tmp_path) -> None:
    """Found by fuzzing fragment bytes: a column chunk whose codec is out of Parquet's range,
    or whose size statistics hold more levels than its column has, made pyarrow throw a C++
    exception nothing catches (from ``compression``, from ``RowGroupMetaData.column``),
    aborting the process. Each read whole and by range, in a process of its own, so that an
    abort fails this test alone."""
    import subprocess
    import sys

    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": pa.array([1, 2, None], pa.int64())}), sink,
                   compression="none")
    reads = []
    for change, (values, wanted, _) in sorted(CHANGES.items()):
        body = _footer_changed(sink.getvalue().to_pybytes(), values, wanted)
        (tmp_path / f"{change}.parquet").write_bytes(body)
        reads += [(change, len(body), zlib.crc32(body)), (change, len(body), -1)]
    code = f"""
import pyarrow as pa
from lakestream.errors import CorruptLogError
from lakestream.read.fragments import FragmentReader
from lakestream.store.local import LocalStore
reader = FragmentReader(LocalStore({str(tmp_path)!r}), cache_size=0,
                        schema=pa.schema([("id", pa.int64())]))
for change, size, crc in {reads!r}:
    try:
        reader.read(change + ".parquet", size, 0, 3, crc32=crc, rows=3)
        print(change, "read")
    except CorruptLogError as e:
        print(change, e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == len(reads)
    for line, (change, _, _) in zip(lines, reads, strict=True):
        assert line.startswith(change) and CHANGES[change][2] in line, line


def test_a_fragment_whose_footer_is_longer_than_one_read_of_its_end_is_read_by_range(
        tmp_path) -> None:
    """Its footer is read whole from the file's end, beyond ``FOOTER_READ``, and pyarrow
    reads it from those bytes."""
    from lakestream.read.footer import FOOTER_READ

    table = pa.table({f"c{i}": pa.array([i, i + 1], pa.int64()) for i in range(800)})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    body = sink.getvalue().to_pybytes()
    assert int.from_bytes(body[-8:-4], "little") > FOOTER_READ
    (tmp_path / "f.parquet").write_bytes(body)
    reader = FragmentReader(LocalStore(str(tmp_path)), cache_size=0, schema=table.schema)
    assert reader.read("f.parquet", len(body), 0, 2, rows=2).equals(table)


@pytest.mark.parametrize(("kept", "opens"), [(1 << 20, 1), (0, 2)])
def test_a_small_fragment_read_whole_is_opened_once(tmp_path, monkeypatch, kept: int,
                                                    opens: int) -> None:
    """Its decode uses the reader its footer opened; a larger one's reader is not kept (it
    holds the fragment's bytes), so its decode opens another."""
    import lakestream.read.fragments as fragments

    table = pa.table({"id": pa.array(range(4), pa.int64())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    body = sink.getvalue().to_pybytes()
    (tmp_path / "f.parquet").write_bytes(body)
    calls = []
    real = fragments._reader
    monkeypatch.setattr(fragments, "_reader", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(fragments, "OPENED_BYTES", kept)
    reader = FragmentReader(LocalStore(str(tmp_path)), schema=table.schema)
    got = reader.read("f.parquet", len(body), 0, 4, crc32=zlib.crc32(body), rows=4)
    assert got.equals(table) and len(calls) == opens
    assert not reader._opened  # nothing kept past its decode


def test_a_footer_longer_than_any_fragments_is_refused_before_it_is_read(
        tmp_path, monkeypatch) -> None:
    """Its length, from the file's last bytes, is checked before the footer is read: a
    crafted length within a large file is not read into memory."""
    import lakestream.read.footer as footer

    table = pa.table({"id": pa.array(range(4), pa.int64())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    body = sink.getvalue().to_pybytes()
    (tmp_path / "f.parquet").write_bytes(body)
    monkeypatch.setattr(footer, "MAX_FOOTER_BYTES", 64)
    reader = FragmentReader(LocalStore(str(tmp_path)), cache_size=0, schema=table.schema)
    for crc in (zlib.crc32(body), -1):
        with pytest.raises(CorruptLogError, match="footer of .* bytes is longer than 64"):
            reader.read("f.parquet", len(body), 0, 4, crc32=crc, rows=4)
