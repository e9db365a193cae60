"""Parquet page headers, parsed in bounded time and memory from a column chunk's bytes."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import NamedTuple

MAX_HEADER_BYTES = 64 << 10
"""The largest page header parsed (64 KiB): it caps the work one header may cost. Arrow writes
no page statistics for a value past 4 KiB, so its headers stay under 9 KiB."""

MAX_DEPTH = 8
"""The deepest nesting of structs, lists, sets and maps parsed or skipped (a page header
with statistics nests 3 deep); a deeper one is damage, never a RecursionError."""

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1

# Compact-protocol types: the low nibble of a field header, or of a list's element header.
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE = 0, 1, 2, 3, 4, 5, 6, 7
_BINARY, _LIST, _SET, _MAP, _STRUCT = 8, 9, 10, 11, 12


class PageType(enum.IntEnum):
    """``PageType`` of parquet.thrift."""

    DATA_PAGE = 0
    INDEX_PAGE = 1
    DICTIONARY_PAGE = 2
    DATA_PAGE_V2 = 3


class Encoding(enum.IntEnum):
    """The ``Encoding`` values of parquet.thrift (a header holds the raw number, which may be
    one a later format adds)."""

    PLAIN = 0
    PLAIN_DICTIONARY = 2
    RLE = 3
    BIT_PACKED = 4
    DELTA_BINARY_PACKED = 5
    DELTA_LENGTH_BYTE_ARRAY = 6
    DELTA_BYTE_ARRAY = 7
    RLE_DICTIONARY = 8
    BYTE_STREAM_SPLIT = 9


@dataclass(frozen=True)
class PageHeader:
    """One page's header, checked: every size and count is non-negative and fits an i32.

    Attributes:
        kind: The page's type.
        uncompressed_size: Bytes of its body once decompressed (v2: levels included).
        compressed_size: Bytes of its body as stored, right after the header.
        num_values: Values, nulls included (0 for an index page).
        num_nulls: Nulls among them (v2 only, else None).
        num_rows: Rows the page holds (v2 only, else None).
        encoding: Encoding of its values (None for an index page).
        def_level_encoding: Encoding of its definition levels (v1 only, else None).
        def_levels_bytes: Bytes of definition levels at the body's start, never compressed
            (v2 only, else None).
        rep_levels_bytes: Bytes of repetition levels before them (v2 only, else None).
        is_compressed: Whether the values past the levels are compressed with the chunk's
            codec (v2 only, else None: a v1 or dictionary body is, whole).
        crc: The CRC-32 of the body as stored, if the writer recorded one.
        header_size: Bytes of the header itself.
    """

    kind: PageType
    uncompressed_size: int
    compressed_size: int
    num_values: int
    num_nulls: int | None
    num_rows: int | None
    encoding: int | None
    def_level_encoding: int | None
    def_levels_bytes: int | None
    rep_levels_bytes: int | None
    is_compressed: bool | None
    crc: int | None
    header_size: int

    @property
    def is_data(self) -> bool:
        """Whether this is a data page (v1 or v2)."""
        return self.kind in (PageType.DATA_PAGE, PageType.DATA_PAGE_V2)


@dataclass(frozen=True)
class Page:
    """A page of a column chunk: where it lies in the buffer parsed, and its header.

    Attributes:
        offset: Where its header starts.
        body_offset: Where its body starts (``offset + header.header_size``).
        header: Its header.
    """

    offset: int
    body_offset: int
    header: PageHeader

    @property
    def end(self) -> int:
        """Where its body ends, and the next page starts."""
        return self.body_offset + self.header.compressed_size


_Fields = dict[int, object]
"""A struct's fields 1-8 as read: field id -> value: an i32 as an int, a bool as a bool, a
struct as its fields if kept (else empty), any other as (compact type, value or None)."""


class _Damage(Exception):
    """What is wrong with a header: raised inside the parser, reported as a ValueError."""


class _Past(Exception):
    """The header runs past the bytes it may take (as an IndexError from indexing does)."""


def _varint(mv: memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos``: its value, and where it ends."""
    value = shift = 0
    for i in range(pos, pos + 10):
        b = mv[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + 1
        shift += 7
    raise _Damage("a varint longer than 10 bytes")


def _struct(mv: memoryview, pos: int, depth: int, keep: int) -> tuple[_Fields, int]:
    """Reads the struct at ``pos``, nested at ``depth``: its fields 1-8 if ``keep`` > 0 (the
    structs among them kept to ``keep - 1`` levels), and where it ends. Every other field is
    read past, whatever its type."""
    if depth > MAX_DEPTH:
        raise _Damage(f"nested deeper than {MAX_DEPTH}")
    fields: _Fields = {}
    fid = 0
    while True:
        head = mv[pos]
        pos += 1
        t = head & 0x0F
        if t == _STOP:
            return fields, pos
        if head > 0x0F:
            fid += head >> 4
        else:
            n, pos = _varint(mv, pos)
            fid = (n >> 1) ^ -(n & 1)
            if not -0x8000 <= fid < 0x8000:
                raise _Damage(f"field id {fid} is not an i16")
        value: object = None
        if t == _I32 or t == _I64 or t == _I16:
            n = mv[pos]
            if n < 0x80:  # the common one-byte varint, inline
                pos += 1
            else:
                n, pos = _varint(mv, pos)
            value = (n >> 1) ^ -(n & 1)
            if t != _I32:
                value = (t, value)
        elif t == _TRUE or t == _FALSE:  # a bool field's value is in its type
            value = t == _TRUE
        elif t == _STRUCT:
            value, pos = _struct(mv, pos, depth + 1, keep - 1)
        elif t == _BINARY:  # statistics' min and max, inline
            n = mv[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = _varint(mv, pos)
            pos += n
            if pos > len(mv):
                raise _Past
            value = (t, None)
        else:
            pos = _skip(mv, pos, t, depth)
            value = (t, None)
        if keep > 0 and 0 < fid <= 8:
            fields[fid] = value


def _skip(mv: memoryview, pos: int, t: int, depth: int) -> int:
    """Reads past a value of compact type ``t`` in a container nested at ``depth`` (a bool
    takes a byte: this is a list's or a map's element, or a field of another type)."""
    if t == _I32 or t == _I64 or t == _I16:
        return _varint(mv, pos)[1]
    if t == _BINARY:
        n, pos = _varint(mv, pos)
        return _ahead(mv, pos, n)
    if t == _BYTE or t == _TRUE or t == _FALSE:
        return _ahead(mv, pos, 1)
    if t == _DOUBLE:
        return _ahead(mv, pos, 8)
    if t == _STRUCT:
        return _struct(mv, pos, depth + 1, 0)[1]
    if t == _LIST or t == _SET:
        if depth >= MAX_DEPTH:
            raise _Damage(f"nested deeper than {MAX_DEPTH}")
        head = mv[pos]
        pos += 1
        n, kind = head >> 4, head & 0x0F
        if n == 15:
            n, pos = _varint(mv, pos)
        if kind == _STOP or kind > _STRUCT:
            raise _Damage(f"unknown compact type {kind} in a list")
        # Every element takes a byte at least: a list longer than the bytes left is found
        # before any element is read, and reading the rest costs a byte's work a byte.
        if n > len(mv) - pos:
            raise _Past
        if kind == _BYTE or kind == _TRUE or kind == _FALSE:
            return pos + n
        if kind == _DOUBLE:
            return _ahead(mv, pos, 8 * n)
        for _ in range(n):
            pos = _skip(mv, pos, kind, depth + 1)
        return pos
    if t == _MAP:
        if depth >= MAX_DEPTH:
            raise _Damage(f"nested deeper than {MAX_DEPTH}")
        n, pos = _varint(mv, pos)
        if n == 0:
            return pos
        kinds = mv[pos]
        pos += 1
        keys, values = kinds >> 4, kinds & 0x0F
        for kind in (keys, values):
            if kind == _STOP or kind > _STRUCT:
                raise _Damage(f"unknown compact type {kind} in a map")
        if n > (len(mv) - pos) // 2:  # two bytes an entry at least
            raise _Past
        for _ in range(n):
            pos = _skip(mv, pos, keys, depth + 1)
            pos = _skip(mv, pos, values, depth + 1)
        return pos
    raise _Damage(f"unknown compact type {t}")


def _ahead(mv: memoryview, pos: int, n: int) -> int:
    if n > len(mv) - pos:
        raise _Past
    return pos + n


def _view(buf: bytes | bytearray | memoryview) -> memoryview:
    """``buf`` as a memoryview of unsigned bytes (a pyarrow Buffer's has format ``b``)."""
    try:
        view = memoryview(buf)
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except TypeError as e:
        raise ValueError(f"page bytes must be a contiguous buffer ({e})") from None


def _check_range(size: int, pos: int, end: int) -> None:
    if not 0 <= pos <= end <= size:
        raise ValueError(f"bytes [{pos}, {end}) do not lie within a buffer of {size} bytes")


def parse_page_header(buf: bytes | bytearray | memoryview, pos: int,
                      end: int) -> tuple[PageHeader, int]:
    """Parses the page header at ``buf[pos:end]``.

    Args:
        buf: The bytes (a ``memoryview`` of a pyarrow Buffer will do).
        pos: Where the header starts.
        end: Where the bytes the page may take end (its column chunk's end).

    Returns:
        The header, and where the page's body starts; the body lies within ``end``.

    Raises:
        ValueError: The header is damaged, larger than 1 MiB or nested deeper than 8, a size
            or count is negative or not an i32, a field the page's type needs is missing, or
            the body runs past ``end``. Nothing else is raised, whatever the bytes, in time
            linear in the bytes read.
    """
    view = _view(buf)
    _check_range(len(view), pos, end)
    return _parse(view, pos, end)


def column_chunk_pages(buf: bytes | bytearray | memoryview, start: int, length: int,
                       expected_values: int) -> list[Page]:
    """Parses every page header of the column chunk at ``buf[start:start + length]``.

    Args:
        buf: The bytes (a ``memoryview`` of a pyarrow Buffer will do).
        start: The chunk's ``dictionary_page_offset`` if it has a dictionary page, else its
            ``data_page_offset`` (as offsets into ``buf``).
        length: The chunk's ``total_compressed_size``.
        expected_values: The chunk's ``num_values``, which its data pages must hold.

    Returns:
        Its pages in order: they tile the chunk exactly, a dictionary page only first.

    Raises:
        ValueError: A header is damaged (see ``parse_page_header``), the pages do not tile
            the chunk, there is more than one dictionary page or one after a data page, or
            the data pages hold other than ``expected_values`` values. Nothing else is
            raised, whatever the bytes, in time linear in ``length``.
    """
    view = _view(buf)
    if length < 0 or expected_values < 0:
        raise ValueError(f"a column chunk of {length} bytes and {expected_values} values")
    end = start + length
    _check_range(len(view), start, end)
    pages: list[Page] = []
    values = 0
    pos = start
    while pos < end:
        if len(pages) >= length:  # each page takes a byte at least: never reached, but cheap
            raise ValueError(f"column chunk at byte {start}: more than {length} pages")
        header, body = _parse(view, pos, end)
        if header.kind == PageType.DICTIONARY_PAGE and pages:
            raise ValueError(f"column chunk at byte {start}: a dictionary page at byte {pos} "
                             "is not its first page")
        if header.kind == PageType.DATA_PAGE or header.kind == PageType.DATA_PAGE_V2:
            values += header.num_values
        page = object.__new__(Page)  # see _new_header
        page.__dict__.update(offset=pos, body_offset=body, header=header)
        pages.append(page)
        pos = body + header.compressed_size
    if values != expected_values:
        raise ValueError(f"column chunk at byte {start}: its data pages hold {values} values, "
                         f"its metadata says {expected_values}")
    return pages


def _parse(view: memoryview, pos: int, end: int) -> tuple[PageHeader, int]:
    limit = min(end, pos + MAX_HEADER_BYTES)
    try:
        fields, size = _struct(view[pos:limit], 0, 1, 2)
        return _header(fields, size, end - pos - size), pos + size
    except (_Past, IndexError):  # indexing past the view's end is the only IndexError here
        what = f"larger than {MAX_HEADER_BYTES} bytes" if limit < end else "runs past its end"
        raise ValueError(f"page header at byte {pos}: {what}") from None
    except _Damage as e:
        raise ValueError(f"page header at byte {pos}: {e}") from None


_PAGE_TYPES = tuple(PageType)


def _header(top: _Fields, size: int, room: int) -> PageHeader:
    """The header of these fields, ``size`` bytes long, checked: its body fits ``room``."""
    kind = _i32(top, 1, "type")
    uncompressed = _count(top, 2, "uncompressed_page_size")
    compressed = _count(top, 3, "compressed_page_size")
    crc = _i32(top, 4, "crc") if 4 in top else None
    if compressed > room:
        raise _Damage(f"its body of {compressed} bytes runs past the {room} bytes left")
    if not 0 <= kind < len(_PAGE_TYPES):
        raise _Damage(f"unknown page type {kind}")
    if kind == PageType.DATA_PAGE:
        page = _struct_field(top, 5, "data_page_header")
        n = _count(page, 1, "data_page_header.num_values")
        encoding = _i32(page, 2, "data_page_header.encoding")
        levels = _i32(page, 3, "data_page_header.definition_level_encoding")
        _i32(page, 4, "data_page_header.repetition_level_encoding")
        return _new_header(_PAGE_TYPES[kind], uncompressed, compressed, n, None, None,
                           encoding, levels, None, None, None, crc, size)
    if kind == PageType.DATA_PAGE_V2:
        page = _struct_field(top, 8, "data_page_header_v2")
        n = _count(page, 1, "data_page_header_v2.num_values")
        nulls = _count(page, 2, "data_page_header_v2.num_nulls")
        rows = _count(page, 3, "data_page_header_v2.num_rows")
        encoding = _i32(page, 4, "data_page_header_v2.encoding")
        def_bytes = _count(page, 5, "data_page_header_v2.definition_levels_byte_length")
        rep_bytes = _count(page, 6, "data_page_header_v2.repetition_levels_byte_length")
        is_compressed = _bool(page, 7, "data_page_header_v2.is_compressed", True)
        if nulls > n or rows > n:
            raise _Damage(f"{nulls} nulls or {rows} rows among {n} values")
        if def_bytes + rep_bytes > min(compressed, uncompressed):
            raise _Damage(f"its levels' {def_bytes + rep_bytes} bytes exceed its body")
        return _new_header(_PAGE_TYPES[kind], uncompressed, compressed, n, nulls, rows,
                           encoding, None, def_bytes, rep_bytes, is_compressed, crc, size)
    if kind == PageType.DICTIONARY_PAGE:
        page = _struct_field(top, 7, "dictionary_page_header")
        n = _count(page, 1, "dictionary_page_header.num_values")
        encoding = _i32(page, 2, "dictionary_page_header.encoding")
        return _new_header(_PAGE_TYPES[kind], uncompressed, compressed, n, None, None,
                           encoding, None, None, None, None, crc, size)
    _struct_field(top, 6, "index_page_header")
    return _new_header(_PAGE_TYPES[kind], uncompressed, compressed, 0, None, None, None, None,
                       None, None, None, crc, size)


def _i32(fields: _Fields, fid: int, name: str) -> int:
    value = fields.get(fid)
    if type(value) is int:  # an i32 field's (bool, a subclass, is a bool field's)
        if _I32_MIN <= value <= _I32_MAX:
            return value
        raise _Damage(f"{name} {value} is not an i32")
    if value is None:
        raise _Damage(f"{name} is missing")
    raise _Damage(f"{name} has compact type {_type_of(value)}, not i32")


def _count(fields: _Fields, fid: int, name: str) -> int:
    value = fields.get(fid)
    if type(value) is int and 0 <= value <= _I32_MAX:
        return value
    if type(value) is int and value < 0:
        raise _Damage(f"{name} is negative ({value})")
    return _i32(fields, fid, name)  # raises: what is wrong


def _bool(fields: _Fields, fid: int, name: str, default: bool) -> bool:
    value = fields.get(fid, default)
    if isinstance(value, bool):
        return value
    raise _Damage(f"{name} has compact type {_type_of(value)}, not bool")


def _struct_field(fields: _Fields, fid: int, name: str) -> _Fields:
    value = fields.get(fid)
    if isinstance(value, dict):
        return value
    if value is None:
        raise _Damage(f"a page of its type without {name}")
    raise _Damage(f"{name} has compact type {_type_of(value)}, not struct")


def _type_of(value: object) -> int:
    """The compact type a field's value was read from (see ``_Fields``)."""
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    if isinstance(value, int):
        return _I32
    if isinstance(value, tuple):
        return int(value[0])
    return _STRUCT


def _new_header(kind: PageType, uncompressed_size: int, compressed_size: int,
                num_values: int, num_nulls: int | None, num_rows: int | None,
                encoding: int | None, def_level_encoding: int | None,
                def_levels_bytes: int | None, rep_levels_bytes: int | None,
                is_compressed: bool | None, crc: int | None, header_size: int) -> PageHeader:
    """A ``PageHeader`` made without the ``__init__`` a frozen dataclass generates, which sets
    each field through ``object.__setattr__`` (2.5 µs here, a fifth of a header's parse).
    Equality, hashing and repr are the dataclass's."""
    header = object.__new__(PageHeader)
    header.__dict__.update(
        kind=kind, uncompressed_size=uncompressed_size, compressed_size=compressed_size,
        num_values=num_values, num_nulls=num_nulls, num_rows=num_rows, encoding=encoding,
        def_level_encoding=def_level_encoding, def_levels_bytes=def_levels_bytes,
        rep_levels_bytes=rep_levels_bytes, is_compressed=is_compressed, crc=crc,
        header_size=header_size)
    return header


class ChunkPages(NamedTuple):
    """What a column chunk's pages say of what it decodes to (``chunk_pages``)."""

    inflated: int
    """Bytes its pages decompress to, in all."""
    largest: int
    """The most one of its pages (or its dictionary) decompresses to."""
    repeats: bool
    """Whether a value may repeat another's bytes: a dictionary, or an encoding other than
    PLAIN and DELTA_LENGTH_BYTE_ARRAY (prefix sharing)."""


_WINDOW = 256
"""The bytes the fast path reads a header from: a header of pyarrow's without statistics
takes 15-30 bytes, with a scalar column's 50-70."""
_OWN_BYTES = (Encoding.PLAIN, Encoding.DELTA_LENGTH_BYTE_ARRAY)


FastPage = tuple[int, int, int, int, int, int]
"""``(type, uncompressed, compressed, values, encoding, body offset)`` of a page."""


def chunk_pages(buf: bytes | bytearray | memoryview, start: int, length: int,
                expected_values: int, memo: dict[int, list[FastPage]] | None = None
                ) -> ChunkPages:
    """``column_chunk_pages`` summed up, in a fifth of its time where the headers are laid
    out as Parquet writers lay them out (``fast_pages``); any other chunk is parsed by
    ``column_chunk_pages``, whose errors it raises. ``memo`` keeps the pages found by the
    chunk's start, for another pass over the same bytes.

    Raises:
        ValueError: as ``column_chunk_pages``.
    """
    view = _view(buf)
    pages = memo.get(start) if memo is not None else None
    if pages is None:
        pages = fast_pages(view, start, length, expected_values)
    if pages is None:
        return summed(column_chunk_pages(view, start, length, expected_values))
    if memo is not None:
        memo[start] = pages
    inflated = largest = 0
    repeats = False
    for kind, uncompressed, _, _, encoding, _ in pages:
        inflated += uncompressed
        largest = max(largest, uncompressed)
        repeats = repeats or kind == PageType.DICTIONARY_PAGE or encoding not in _OWN_BYTES
    return ChunkPages(inflated, largest, repeats)


def fast_pages(buf: bytes | bytearray | memoryview, start: int, length: int,
               expected_values: int) -> list[FastPage] | None:
    """The pages of the column chunk at ``buf[start:start + length]`` read by the pattern
    writers' headers match (``_fast_header``), checked as ``column_chunk_pages`` checks
    them; None where a header is laid out another way or anything is amiss, for the
    careful parse to say what."""
    view = _view(buf)
    end = start + length
    if length < 0 or expected_values < 0 or not 0 <= start <= end <= len(view):
        return None
    pos, values = start, 0
    out: list[FastPage] = []
    try:
        while pos < end:
            header = _fast_header(bytes(view[pos:min(end, pos + _WINDOW)]))
            if header is None:
                return None
            kind, uncompressed, compressed, n, encoding, size = header
            body = pos + size
            pos = body + compressed
            if pos > end or kind == PageType.DICTIONARY_PAGE and out:
                return None
            if kind != PageType.DICTIONARY_PAGE:
                values += n
            out.append((kind, uncompressed, compressed, n, encoding, body))
    except IndexError:  # a header past its window or the chunk
        return None
    return out if values == expected_values else None


def summed(pages: list[Page]) -> ChunkPages:
    """What ``chunk_pages`` returns for these pages."""
    headers = [p.header for p in pages]
    return ChunkPages(sum(h.uncompressed_size for h in headers),
                      max((h.uncompressed_size for h in headers), default=0),
                      any(h.kind == PageType.DICTIONARY_PAGE or h.is_data
                          and h.encoding not in _OWN_BYTES for h in headers))


_V = rb"([\x80-\xff]{0,4}[\x00-\x7f])"
"""A varint of up to 5 bytes (an i32's), captured."""
_FAST = re.compile(
    rb"\x15" + _V + rb"\x15" + _V + rb"\x15" + _V + rb"(?:\x15" + _V + rb")?(?:"
    # field 5, a v1 data page: values, encoding, and the levels' encodings
    + rb"[\x1c\x2c]\x15" + _V + rb"\x15" + _V + rb"\x15" + _V + rb"\x15" + _V + rb"|"
    # field 7, a dictionary page: values, encoding, is_sorted
    + rb"[\x3c\x4c]\x15" + _V + rb"\x15" + _V + rb"[\x11\x12]?)", re.S)
"""The header of a v1 data page or a dictionary page as Parquet writers lay it out (short
field ids in order; a CRC or not), up to its page struct's statistics, if any: matched in one
call where parsing it a byte at a time took 5 µs. (v2 pages, rarer, take the careful way.)"""
_STATS = re.compile(
    rb"\x1c(?:[\x18\x28\x38\x48\x58\x68](?:\x00|\x01.|\x02.{2}|\x04.{4}|\x08.{8})"
    rb"|[\x16\x26\x36\x46][\x80-\xff]{0,9}[\x00-\x7f]|[\x11\x12\x21\x22])*\x00", re.S)
"""A data page's statistics as writers lay them out for a column of fixed-width values:
binary minima and maxima of 0-8 bytes, i64 counts, bool flags (others: the slow loop)."""


def _fast_header(b: bytes) -> tuple[int, int, int, int, int, int] | None:
    """``(type, uncompressed, compressed, values, encoding, header size)`` of the data or
    dictionary page header at the start of ``b``, or None where it is not laid out the
    common way or a number is out of range (``column_chunk_pages`` then says what is
    wrong). Raises IndexError where it runs past ``b``."""
    m = _FAST.match(b)
    if m is None:
        return None
    g = m.groups()
    data = g[5] is not None
    numbers = (g[0], g[1], g[2], g[4], g[5]) if data else (g[0], g[1], g[2], g[8], g[9])
    if not all(len(v) < 5 or v[4] < 0x10 for v in numbers):
        return None  # a zigzag varint of 33 bits or more: not an i32
    if g[3] is not None and len(g[3]) == 5 and g[3][4] >= 0x10:
        return None
    kind, uncompressed, compressed, values, encoding = map(_zigzag, numbers)
    i = m.end()
    if data and b[i] == 0x1C:  # a v1 data page's statistics (field 5)
        stats = _STATS.match(b, i)
        i = stats.end() if stats is not None else _fast_statistics(b, i + 1)
        if i < 0:
            return None
    if b[i] or b[i + 1]:  # the page struct and the header end here
        return None
    expected = PageType.DATA_PAGE if data else PageType.DICTIONARY_PAGE
    if kind != expected or min(uncompressed, compressed, values) < 0:
        return None
    return kind, uncompressed, compressed, values, encoding, i + 2


def _unzig(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


_SHORT = {bytes([n]): _unzig(n) for n in range(128)} | {
    bytes([0x80 | (n & 0x7F), n >> 7]): _unzig(n) for n in range(128, 1 << 14)}
"""The value of every varint of one or two bytes (most sizes and counts of a page)."""


def _zigzag(varint: bytes) -> int:
    value = _SHORT.get(varint)
    if value is not None:
        return value
    n = shift = 0
    for byte in varint:
        n |= (byte & 0x7F) << shift
        shift += 7
    return _unzig(n)


def _fast_statistics(b: bytes, i: int) -> int:
    """Where the statistics struct at ``i`` ends, or -1 where it is laid out another way."""
    while True:
        head = b[i]
        i += 1
        t = head & 0x0F
        if t == _STOP:
            return i
        if head < 0x10:
            return -1
        if t == _BINARY:
            n, i = _fast_varint(b, i)
            i += n
        elif t == _I64 or t == _I32:
            i = _fast_varint(b, i)[1]
        elif t != _TRUE and t != _FALSE:
            return -1


def _fast_varint(b: bytes, i: int) -> tuple[int, int]:
    n = b[i]
    if n < 0x80:
        return n, i + 1
    value, shift = n & 0x7F, 7
    for j in range(i + 1, i + 10):
        n = b[j]
        value |= (n & 0x7F) << shift
        if n < 0x80:
            return value, j + 1
        shift += 7
    raise IndexError("a varint longer than 10 bytes")  # the careful parse names it
