"""Page headers: every page of pyarrow-written column chunks found, sized and placed; damaged,
hostile and random bytes refused with a ValueError, in time linear in the bytes parsed."""

from __future__ import annotations

import io
import struct
import time
import zlib
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakestream.read.compact import MAX_DEPTH
from lakestream.read.fastpages import chunk_pages, summed
from lakestream.read.pages import (
    MAX_HEADER_BYTES,
    Encoding,
    PageHeader,
    PageType,
    column_chunk_pages,
    parse_page_header,
)

# --- pyarrow-written files ---------------------------------------------------------------

N = 3000


def _table() -> pa.Table:
    rng = np.random.default_rng(7)
    ints = pa.array(rng.integers(0, 50, N), pa.int64(), mask=rng.random(N) < 0.2)
    lists = pa.array([None if i % 7 == 0 else list(range(i % 5)) for i in range(N)],
                     pa.list_(pa.int32()))
    blobs = pa.array([None if i % 11 == 0 else bytes([i % 251]) * (i % 37) for i in range(N)],
                     pa.binary())
    fixed = pa.array([bytes([i % 13]) * 6 for i in range(N)], pa.binary(6))
    return pa.table({"ints": ints, "lists": lists, "blobs": blobs, "fixed": fixed,
                     "dense": pa.array(np.arange(N, dtype=np.float32))})


def _write(table: pa.Table, **options: object) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **options)
    return sink.getvalue()


def _chunks(data: bytes) -> Iterator[tuple[pq.ColumnChunkMetaData, int, int]]:
    """Every column chunk of every row group: its metadata, where its pages start, its
    row group's rows."""
    meta = pq.ParquetFile(pa.BufferReader(data)).metadata
    for r in range(meta.num_row_groups):
        group = meta.row_group(r)
        for i in range(group.num_columns):
            chunk = group.column(i)
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page \
                else chunk.data_page_offset
            yield chunk, start, group.num_rows


WRITERS = {
    "v1-dict-snappy": {},
    "v1-plain-none": {"use_dictionary": False, "compression": "none"},
    "v1-zstd-small-pages": {"compression": "zstd", "data_page_size": 512,
                            "write_batch_size": 64, "row_group_size": 1000},
    "v1-crc-small-pages": {"write_page_checksum": True, "data_page_size": 256,
                           "write_batch_size": 32, "use_dictionary": False,
                           "compression": "snappy"},
    "v2-dict-zstd": {"data_page_version": "2.0", "compression": "zstd"},
    "v2-plain-none-small-pages": {"data_page_version": "2.0", "use_dictionary": False,
                                  "compression": "none", "data_page_size": 256,
                                  "write_batch_size": 32, "row_group_size": 700},
    "v2-crc-snappy": {"data_page_version": "2.0", "write_page_checksum": True,
                      "compression": "snappy", "data_page_size": 256,
                      "write_batch_size": 32, "row_group_size": 1200},
}


@pytest.mark.parametrize("name", WRITERS)
def test_every_page_of_every_chunk_is_found(name: str) -> None:
    options = WRITERS[name]
    data = _write(_table(), **options)
    v2 = options.get("data_page_version") == "2.0"
    many = "data_page_size" in options
    view = memoryview(pa.py_buffer(data))  # format "b": bytes must be read unsigned
    nulls: dict[str, int] = {}
    most = 0
    for chunk, start, rows in _chunks(data):
        pages = column_chunk_pages(view, start, chunk.total_compressed_size, chunk.num_values)
        assert pages == column_chunk_pages(data, start, chunk.total_compressed_size,
                                           chunk.num_values)
        # They tile the chunk: each starts where the last ended.
        assert pages[0].offset == start
        assert all(a.end == b.offset for a, b in zip(pages, pages[1:], strict=False))
        assert pages[-1].end == start + chunk.total_compressed_size
        # pyarrow counts a chunk's uncompressed size as every page's header plus its
        # uncompressed_page_size (levels included for v2; a v2 page left uncompressed
        # counts its stored bytes), the dictionary page too: exactly, in every writer here.
        assert chunk.total_uncompressed_size == sum(
            p.header.header_size + p.header.uncompressed_size for p in pages)
        data_pages = [p.header for p in pages if p.header.is_data]
        assert sum(h.num_values for h in data_pages) == chunk.num_values
        assert {h.kind for h in data_pages} == {
            PageType.DATA_PAGE_V2 if v2 else PageType.DATA_PAGE}
        dictionary = [p.header for p in pages if p.header.kind == PageType.DICTIONARY_PAGE]
        assert len(dictionary) == int(chunk.has_dictionary_page)
        if dictionary:
            assert pages[0].header is dictionary[0]
            assert dictionary[0].encoding in (Encoding.PLAIN, Encoding.PLAIN_DICTIONARY)
        used = {Encoding(h.encoding).name for h in data_pages + dictionary}
        assert used <= set(chunk.encodings)
        most = max(most, len(data_pages))
        for h in data_pages:
            if v2:
                assert h.num_nulls is not None and h.num_rows is not None
                assert h.def_levels_bytes is not None and h.rep_levels_bytes is not None
                assert h.is_compressed is not None and h.def_level_encoding is None
                if not h.is_compressed:  # pyarrow stores a v2 page raw where that is smaller
                    assert h.compressed_size == h.uncompressed_size
            else:
                assert h.num_nulls is None and h.num_rows is None
                assert h.def_levels_bytes is None and h.is_compressed is None
                assert h.def_level_encoding == Encoding.RLE
        if v2:
            assert sum(h.num_rows or 0 for h in data_pages) == rows
            column = chunk.path_in_schema.split(".")[0]
            nulls[column] = nulls.get(column, 0) + sum(h.num_nulls or 0 for h in data_pages)
        if options.get("write_page_checksum"):
            for p in pages:  # the body found is the one the writer checksummed
                assert p.header.crc is not None
                body = data[p.body_offset:p.end]
                assert p.header.crc & 0xFFFFFFFF == zlib.crc32(body)
        else:
            assert all(p.header.crc is None for p in pages)
    assert most >= 10 if many else most <= 3
    if v2:  # a v2 page's nulls count its null values; for a list, its null and empty lists
        table = _table()
        empty = sum(1 for v in table.column("lists").to_pylist() if v == [])
        assert nulls == {name: table.column(name).null_count + (empty if name == "lists" else 0)
                         for name in table.column_names}


def test_row_groups_are_walked_whole() -> None:
    data = _write(_table(), row_group_size=400, data_page_size=256, write_batch_size=50)
    meta = pq.read_metadata(pa.BufferReader(data))
    assert meta.num_row_groups == 8
    walked = 0
    for chunk, start, _ in _chunks(data):
        pages = column_chunk_pages(data, start, chunk.total_compressed_size, chunk.num_values)
        walked += sum(p.header.num_values for p in pages if p.header.is_data)
    assert walked == sum(meta.row_group(r).column(i).num_values
                         for r in range(meta.num_row_groups) for i in range(meta.num_columns))


def test_an_empty_chunk_holds_only_a_dictionary_page() -> None:
    """pyarrow writes a row group of no rows as a dictionary page and no data page (and a
    ``data_page_offset`` of 0)."""
    data = _write(pa.table({"a": pa.array([], pa.int64())}))
    (chunk, start, rows), = _chunks(data)
    pages = column_chunk_pages(data, start, chunk.total_compressed_size, chunk.num_values)
    assert rows == 0 and [p.header.kind for p in pages] == [PageType.DICTIONARY_PAGE]
    assert column_chunk_pages(data, start, 0, 0) == []


def _values_of(body: bytes) -> list[bytes]:
    """PLAIN byte-array values: a 4-byte little-endian length, then the bytes, each."""
    out, pos = [], 0
    while pos < len(body):
        (n,) = struct.unpack_from("<i", body, pos)
        out.append(body[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_plain_uncompressed_binary_bodies_hold_the_values(version: str) -> None:
    values = [bytes([i % 256]) * (i % 300) for i in range(2000)]
    schema = pa.schema([pa.field("b", pa.binary(), nullable=False),
                        pa.field("f", pa.binary(3), nullable=False),
                        pa.field("n", pa.binary())])
    nullable = [None if i % 3 == 0 else v for i, v in enumerate(values)]
    fixed = [bytes([i % 256]) * 3 for i in range(2000)]
    table = pa.table({"b": values, "f": fixed, "n": nullable}, schema=schema)
    data = _write(table, use_dictionary=False, compression="none", data_page_size=1024,
                  write_batch_size=64, data_page_version=version)
    found: dict[str, list[bytes]] = {"b": [], "f": [], "n": []}
    for chunk, start, _ in _chunks(data):
        name = chunk.path_in_schema
        pages = column_chunk_pages(data, start, chunk.total_compressed_size, chunk.num_values)
        assert len(pages) > 3
        for p in pages:
            h = p.header
            assert h.encoding == Encoding.PLAIN and h.compressed_size == h.uncompressed_size
            body = data[p.body_offset:p.end]
            if h.kind == PageType.DATA_PAGE_V2:  # levels first, never compressed
                assert h.is_compressed is False and h.rep_levels_bytes == 0
                body = body[(h.def_levels_bytes or 0):]
            elif name == "n":  # v1: a 4-byte length, then the RLE definition levels
                (levels,) = struct.unpack_from("<i", body)
                body = body[4 + levels:]
            if name == "f":
                assert len(body) == 3 * h.num_values
                found[name] += [body[i:i + 3] for i in range(0, len(body), 3)]
            else:
                found[name] += _values_of(body)
    assert found["b"] == values
    assert found["f"] == fixed
    assert found["n"] == [v for v in nullable if v is not None]


def test_a_compressed_page_says_what_it_inflates_to() -> None:
    """The footer's sizes aside, each zstd page's header gives what its body inflates to."""
    data = _write(pa.table({"z": [b"\0" * 1_000_000] * 4}), compression="zstd",
                  use_dictionary=False)
    (chunk, start, _), = _chunks(data)
    pages = column_chunk_pages(data, start, chunk.total_compressed_size, chunk.num_values)
    assert sum(p.header.uncompressed_size for p in pages) >= 4_000_000
    assert chunk.total_compressed_size < 1000


# --- hand-made headers: the compact protocol -----------------------------------------------

BOOL_TRUE, BOOL_FALSE, BYTE, I16, I32, I64, DOUBLE = 1, 2, 3, 4, 5, 6, 7
BINARY, LIST, SET, MAP, STRUCT = 8, 9, 10, 11, 12


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _int(v: int) -> bytes:
    return _varint(2 * v if v >= 0 else -2 * v - 1)


def _struct(*fields: tuple[int, int, bytes], long_ids: bool = False) -> bytes:
    """A struct of (field id, compact type, encoded value) fields, then STOP."""
    out, last = bytearray(), 0
    for fid, kind, value in fields:
        if 0 < fid - last <= 15 and not long_ids:
            out.append((fid - last) << 4 | kind)
        else:
            out += bytes([kind]) + _int(fid)
        out += value
        last = fid
    return bytes(out + b"\0")


def _list(kind: int, items: list[bytes]) -> bytes:
    head = bytes([len(items) << 4 | kind]) if len(items) < 15 else \
        bytes([0xF0 | kind]) + _varint(len(items))
    return head + b"".join(items)


def _v1(n: int = 10, encoding: int = 0, *extra: tuple[int, int, bytes]) -> bytes:
    return _struct((1, I32, _int(n)), (2, I32, _int(encoding)), (3, I32, _int(3)),
                   (4, I32, _int(3)), *extra)


def _header(kind: int = 0, unc: int = 4, comp: int = 4, *fields: tuple[int, int, bytes],
            page: bytes | None = None, long_ids: bool = False) -> bytes:
    own = {0: (5, page if page is not None else _v1()),
           2: (7, page if page is not None else _struct((1, I32, _int(2)),
                                                        (2, I32, _int(0)))),
           3: (8, page if page is not None else _v2())}.get(kind)
    rest = [*fields, *([(own[0], STRUCT, own[1])] if own else [])]
    return _struct((1, I32, _int(kind)), (2, I32, _int(unc)), (3, I32, _int(comp)),
                   *sorted(rest), long_ids=long_ids)


def _v2(n: int = 10, nulls: int = 2, rows: int = 10, def_bytes: int = 1, rep_bytes: int = 0,
        *extra: tuple[int, int, bytes]) -> bytes:
    return _struct((1, I32, _int(n)), (2, I32, _int(nulls)), (3, I32, _int(rows)),
                   (4, I32, _int(8)), (5, I32, _int(def_bytes)), (6, I32, _int(rep_bytes)),
                   *extra)


def test_a_data_page_header() -> None:
    raw = _header(0, 40, 30, (4, I32, _int(-5))) + bytes(30)
    h, body = parse_page_header(raw, 0, len(raw))
    assert body == len(raw) - 30 and h.header_size == body
    made = PageHeader(PageType.DATA_PAGE, 40, 30, 10, None, None, 0, 3, None, None, None, -5,
                      body)
    assert h == made and hash(h) == hash(made) and repr(h) == repr(made) and h.is_data


def test_a_v2_and_a_dictionary_page_header() -> None:
    raw = _header(3, 9, 7, page=_v2(12, 3, 5, 2, 1, (7, BOOL_FALSE, b""))) + bytes(7)
    h, _ = parse_page_header(raw, 0, len(raw))
    assert (h.kind, h.num_values, h.num_nulls, h.num_rows, h.encoding) == (3, 12, 3, 5, 8)
    assert (h.def_levels_bytes, h.rep_levels_bytes, h.is_compressed) == (2, 1, False)
    raw = _header(3, 9, 7) + bytes(7)
    assert parse_page_header(raw, 0, len(raw))[0].is_compressed is True  # the default
    raw = _header(2, 4, 4, page=_struct((1, I32, _int(2)), (2, I32, _int(2)),
                                        (3, BOOL_TRUE, b""))) + bytes(4)
    h, _ = parse_page_header(raw, 0, len(raw))
    assert (h.kind, h.num_values, h.encoding, h.is_data) == (PageType.DICTIONARY_PAGE, 2, 2,
                                                             False)
    raw = _header(1, 0, 0, (6, STRUCT, _struct()))
    h, body = parse_page_header(raw, 0, len(raw))
    assert (h.kind, h.num_values, h.encoding, body) == (PageType.INDEX_PAGE, 0, None, len(raw))


def test_unknown_fields_of_every_type_are_skipped() -> None:
    nested = _struct((1, LIST, _list(STRUCT, [_struct((2, BINARY, _varint(3) + b"abc"))])))
    unknown = [
        (20, BOOL_TRUE, b""), (21, BOOL_FALSE, b""), (22, BYTE, b"\xff"), (23, I16, _int(-7)),
        (24, I32, _int(1 << 30)), (25, I64, _int(-(1 << 62))), (26, DOUBLE, bytes(8)),
        (27, BINARY, _varint(200) + bytes(200)),
        (28, LIST, _list(I32, [_int(i) for i in range(40)])),
        (29, SET, _list(BOOL_TRUE, [b"\x01", b"\x02", b"\x00"])),
        (30, LIST, _list(DOUBLE, [bytes(8)] * 3)), (31, LIST, _list(LIST, [_list(BYTE, [])])),
        (32, MAP, _varint(2) + bytes([BINARY << 4 | BOOL_TRUE]) + b"\x01a\x01\x01b\x02"),
        (33, MAP, _varint(0)), (34, STRUCT, nested), (-3, I64, _int(5)),
    ]
    statistics = _struct((1, BINARY, _varint(2) + b"zz"), (3, I64, _int(4)),
                         (5, BINARY, _varint(1) + b"a"), (7, BOOL_TRUE, b""))
    page = _v1(10, 0, (5, STRUCT, statistics), *unknown[:8])
    for long_ids in (False, True):
        raw = _header(0, 4, 4, *unknown, page=page, long_ids=long_ids) + bytes(4)
        h, body = parse_page_header(raw, 0, len(raw))
        assert (h.num_values, h.uncompressed_size, body) == (10, 4, len(raw) - 4)


def test_a_header_is_parsed_where_it_lies() -> None:
    raw = b"junk" + _header(0, 4, 2) + b"xy" + b"more"
    h, body = parse_page_header(memoryview(raw), 4, len(raw) - 4)
    assert raw[body:body + h.compressed_size] == b"xy"
    with pytest.raises(ValueError, match="runs past the"):
        parse_page_header(raw, 4, len(raw) - 5)


BAD = {
    "a varint longer than 10 bytes": _struct((1, I32, b"\x80" * 10 + b"\x00")),
    "runs past its end": _header(0, 4, 4)[:-3],
    "not an i32": _struct((1, I32, _int(1 << 31))),
    "compressed_page_size is negative": _header(0, 4, -1),
    "uncompressed_page_size is negative": _header(0, -4, 4),
    "num_values is negative": _header(0, 4, 0, page=_v1(-1)),
    "num_rows is negative": _header(3, 4, 0, page=_v2(rows=-2)),
    "rows among": _header(3, 4, 4, page=_v2(n=3, rows=4)) + bytes(4),
    "levels' 5 bytes exceed": _header(3, 4, 4, page=_v2(def_bytes=3, rep_bytes=2)) + bytes(4),
    "body of 40 bytes runs past the 39 bytes left": _header(0, 4, 40) + bytes(39),
    "unknown page type 9": _header(9, 0, 0),
    "without data_page_header": _struct((1, I32, _int(0)), (2, I32, b"\0"), (3, I32, b"\0")),
    "without data_page_header_v2": _struct((1, I32, _int(3)), (2, I32, b"\0"),
                                           (3, I32, b"\0")),
    "without dictionary_page_header": _struct((1, I32, _int(2)), (2, I32, b"\0"),
                                              (3, I32, b"\0")),
    "without index_page_header": _struct((1, I32, _int(1)), (2, I32, b"\0"), (3, I32, b"\0")),
    "uncompressed_page_size is missing": _struct((1, I32, _int(0)), (3, I32, b"\0")),
    "data_page_header.encoding is missing": _header(0, 0, 0, page=_struct((1, I32, _int(1)))),
    "data_page_header_v2.num_rows is missing": _header(3, 0, 0, page=_struct(
        (1, I32, _int(1)), (2, I32, _int(0)))),
    "type has compact type 6": _struct((1, I64, _int(0))),
    "is_compressed has compact type 5": _header(3, 0, 0, page=_v2(1, 0, 1, 0, 0,
                                                                  (7, I32, _int(1)))),
    "data_page_header has compact type 8": _struct((1, I32, b"\0"), (2, I32, b"\0"),
                                                   (3, I32, b"\0"), (5, BINARY, b"\0")),
    "unknown compact type 13": _struct((9, 13, b"")),
    "unknown compact type 0 in a list": _struct((9, LIST, b"\x10")),
    "unknown compact type 14 in a map": _struct((9, MAP, b"\x01\x8e")),
    "field id 40000 is not an i16": bytes([I32]) + _int(40000) + _int(1),
    "nested deeper than 8": _struct((9, LIST, b"\x19" * 8 + b"\x00")),
    f"larger than {MAX_HEADER_BYTES} bytes": _struct((9, BINARY, _varint(MAX_HEADER_BYTES)))
    + bytes(MAX_HEADER_BYTES),
}


@pytest.mark.parametrize("what", BAD)
def test_a_damaged_header_is_a_value_error(what: str) -> None:
    with pytest.raises(ValueError, match=what):
        parse_page_header(BAD[what], 0, len(BAD[what]))


def test_nesting_to_the_bound_is_parsed() -> None:
    """The page header is depth 1; each struct, list, set or map inside it one more."""
    lists = b"\x19" * (MAX_DEPTH - 2) + b"\x05"  # lists of one list, then an empty list
    raw = _header(0, 0, 0, (9, LIST, lists))
    assert parse_page_header(raw, 0, len(raw))[0].num_values == 10
    raw = _header(0, 0, 0, (9, LIST, b"\x19" + lists))
    with pytest.raises(ValueError, match="nested deeper"):
        parse_page_header(raw, 0, len(raw))
    raw = _header(0, 0, 0, (9, STRUCT, b"\x1c" * (MAX_DEPTH - 2) + b"\0" * (MAX_DEPTH - 1)))
    parse_page_header(raw, 0, len(raw))
    raw = _header(0, 0, 0, (9, STRUCT, b"\x1c" * (MAX_DEPTH - 1) + b"\0" * MAX_DEPTH))
    with pytest.raises(ValueError, match="nested deeper"):
        parse_page_header(raw, 0, len(raw))


def test_bad_arguments_are_value_errors() -> None:
    raw = _header(0, 4, 4) + bytes(4)
    for pos, end in ((-1, 5), (0, len(raw) + 1), (5, 4)):
        with pytest.raises(ValueError, match="do not lie within"):
            parse_page_header(raw, pos, end)
    with pytest.raises(ValueError, match="do not lie within"):
        column_chunk_pages(raw, 1, len(raw), 10)
    with pytest.raises(ValueError, match="a column chunk of -1 bytes"):
        column_chunk_pages(raw, 0, -1, 10)
    strided = memoryview(bytes(a for b in raw for a in (b, 0)))[::2]
    assert parse_page_header(strided, 0, len(raw)) == parse_page_header(raw, 0, len(raw))
    with pytest.raises(ValueError, match="contiguous buffer"):
        parse_page_header(memoryview(pa.py_buffer(raw * 2))[::2], 0, 4)


def test_a_chunk_whose_pages_do_not_add_up_is_refused() -> None:
    dictionary = _header(2, 4, 4) + bytes(4)
    page = _header(0, 4, 4) + bytes(4)  # 10 values
    chunk = dictionary + page + page
    assert [p.header.kind for p in column_chunk_pages(chunk, 0, len(chunk), 20)] == [2, 0, 0]
    with pytest.raises(ValueError, match="hold 20 values, its metadata says 21"):
        column_chunk_pages(chunk, 0, len(chunk), 21)
    with pytest.raises(ValueError, match="runs past the"):  # the footer's length is short
        column_chunk_pages(chunk, 0, len(chunk) - 1, 20)
    with pytest.raises(ValueError):  # ... or long: what follows is no page
        column_chunk_pages(chunk + b"\x15\x00", 0, len(chunk) + 2, 20)
    with pytest.raises(ValueError, match="is not its first page"):
        column_chunk_pages(page + dictionary, 0, len(chunk) - len(page), 10)
    with pytest.raises(ValueError, match="is not its first page"):
        column_chunk_pages(dictionary + dictionary, 0, 2 * len(dictionary), 0)


# --- bounded: random and mutated bytes -----------------------------------------------------

SMALL = _write(_table().slice(0, 200), data_page_size=128, write_batch_size=16,
               write_page_checksum=True)
SMALL_V2 = _write(_table().slice(0, 200), data_page_size=128, write_batch_size=16,
                  data_page_version="2.0", compression="zstd")
CHUNKS = [(data, chunk.num_values, start, chunk.total_compressed_size)
          for data in (SMALL, SMALL_V2) for chunk, start, _ in _chunks(data)]
INTERESTING = [0x00, 0x01, 0x02, 0x15, 0x16, 0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x29, 0x3C, 0x4C,
               0x5C, 0x7F, 0x80, 0xF9, 0xFC, 0xFF]
FUZZ = settings(max_examples=400, deadline=250, suppress_health_check=[HealthCheck.too_slow])


def _parse_or_refuse(raw: bytes, pos: int = 0) -> None:
    try:
        h, body = parse_page_header(raw, pos, len(raw))
    except ValueError as e:
        assert str(e)
        return
    assert pos < body <= len(raw) - h.compressed_size
    assert min(h.uncompressed_size, h.compressed_size, h.num_values) >= 0


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_parse_or_are_refused(raw: bytes) -> None:
    _parse_or_refuse(raw)


@FUZZ
@given(st.lists(st.sampled_from(INTERESTING) | st.integers(0, 255), max_size=120))
def test_compact_looking_bytes_parse_or_are_refused(raw: list[int]) -> None:
    _parse_or_refuse(bytes(raw))
    _parse_or_refuse(_header(0, 1, 1)[:9] + bytes(raw))  # after a valid start


@FUZZ
@given(st.sampled_from(range(len(CHUNKS))), st.data())
def test_mutated_chunks_parse_or_are_refused(which: int, data: st.DataObject) -> None:
    body, values, start, length = CHUNKS[which]
    raw = bytearray(body[start:start + length])
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        edit = data.draw(st.sampled_from(["set", "flip", "insert", "delete"]))
        byte = data.draw(st.sampled_from(INTERESTING) | st.integers(0, 255))
        if edit == "set":
            raw[at] = byte
        elif edit == "flip":
            raw[at] ^= 1 << data.draw(st.integers(0, 7))
        elif edit == "insert":
            raw.insert(at, byte)
        elif len(raw) > 1:
            del raw[at]
    length = data.draw(st.sampled_from([len(raw), length, max(0, len(raw) - 3)]))
    length = min(length, len(raw))
    try:
        pages = column_chunk_pages(bytes(raw), 0, length, values)
    except ValueError:
        with pytest.raises(ValueError):
            chunk_pages(bytes(raw), 0, length, values)
    else:
        assert pages and pages[-1].end == length
        assert chunk_pages(bytes(raw), 0, length, values) == summed(pages)
    _parse_or_refuse(bytes(raw))


def _seconds(raw: bytes) -> float:
    began = time.perf_counter()
    with pytest.raises(ValueError):
        parse_page_header(raw, 0, len(raw))
    return time.perf_counter() - began


def test_hostile_headers_cost_time_linear_in_their_bytes() -> None:
    """A claimed size is checked against the bytes left before anything is read, and what is
    read is read once: no input costs more than a pass over at most 1 MiB."""
    huge_claims = [
        _struct((9, LIST, b"\xf5" + _varint(1 << 60))),  # a list of 2^60 i32s
        _struct((9, MAP, _varint(1 << 62) + b"\x55")),
        _struct((9, BINARY, _varint(1 << 63))),
        _struct((9, LIST, b"\xf7" + _varint(1 << 40))),  # of doubles
    ]
    for raw in huge_claims:
        assert _seconds(raw + bytes(1000)) < 0.05
    # The worst there is: a 1 MiB header of one-byte list elements, read past one by one
    # (0.5 s on a shared 2-core machine), refused for what follows them: no type, no sizes.
    n = MAX_HEADER_BYTES - 16
    assert _seconds(_struct((9, LIST, b"\xf5" + _varint(n) + bytes(n)))) < 5
    assert _seconds(_struct((9, LIST, b"\xf5" + _varint(n + 16) + bytes(n + 16)))) < 0.05
    deep = _struct((9, LIST, b"\x19" * 100_000))
    assert _seconds(deep) < 0.05


@pytest.mark.parametrize("name", WRITERS)
def test_the_fast_summary_is_the_careful_parsesummed(name: str) -> None:
    """``chunk_pages`` reads the common layout by a pattern: what it finds is what parsing
    every header finds."""
    data = _write(_table(), **WRITERS[name])
    for chunk, start, _ in _chunks(data):
        pages = column_chunk_pages(data, start, chunk.total_compressed_size, chunk.num_values)
        assert chunk_pages(data, start, chunk.total_compressed_size, chunk.num_values) == \
            summed(pages)
