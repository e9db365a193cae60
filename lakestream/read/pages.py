"""Parquet page headers, parsed in bounded time and memory from a column chunk's bytes."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lakestream.read.compact import (
    Damage,
    Fields,
    Past,
    bool_field,
    count_field,
    i32_field,
    read_struct,
    struct_field,
)

MAX_HEADER_BYTES = 64 << 10
"""The largest page header parsed (64 KiB): it caps the work one header may cost. Arrow writes
no page statistics for a value past 4 KiB, so its headers stay under 9 KiB."""


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


def view_of(buf: bytes | bytearray | memoryview) -> memoryview:
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
    view = view_of(buf)
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
    view = view_of(buf)
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
        fields, size = read_struct(view[pos:limit], 0, 1, 2)
        return _header(fields, size, end - pos - size), pos + size
    except (Past, IndexError):  # indexing past the view's end is the only IndexError here
        what = f"larger than {MAX_HEADER_BYTES} bytes" if limit < end else "runs past its end"
        raise ValueError(f"page header at byte {pos}: {what}") from None
    except Damage as e:
        raise ValueError(f"page header at byte {pos}: {e}") from None


_PAGE_TYPES = tuple(PageType)


def _header(top: Fields, size: int, room: int) -> PageHeader:
    """The header of these fields, ``size`` bytes long, checked: its body fits ``room``."""
    kind = i32_field(top, 1, "type")
    uncompressed = count_field(top, 2, "uncompressed_page_size")
    compressed = count_field(top, 3, "compressed_page_size")
    crc = i32_field(top, 4, "crc") if 4 in top else None
    if compressed > room:
        raise Damage(f"its body of {compressed} bytes runs past the {room} bytes left")
    if not 0 <= kind < len(_PAGE_TYPES):
        raise Damage(f"unknown page type {kind}")
    if kind == PageType.DATA_PAGE:
        page = struct_field(top, 5, "data_page_header")
        n = count_field(page, 1, "data_page_header.num_values")
        encoding = i32_field(page, 2, "data_page_header.encoding")
        levels = i32_field(page, 3, "data_page_header.definition_level_encoding")
        i32_field(page, 4, "data_page_header.repetition_level_encoding")
        return _new_header(_PAGE_TYPES[kind], uncompressed, compressed, n, None, None,
                           encoding, levels, None, None, None, crc, size)
    if kind == PageType.DATA_PAGE_V2:
        page = struct_field(top, 8, "data_page_header_v2")
        n = count_field(page, 1, "data_page_header_v2.num_values")
        nulls = count_field(page, 2, "data_page_header_v2.num_nulls")
        rows = count_field(page, 3, "data_page_header_v2.num_rows")
        encoding = i32_field(page, 4, "data_page_header_v2.encoding")
        def_bytes = count_field(page, 5, "data_page_header_v2.definition_levels_byte_length")
        rep_bytes = count_field(page, 6, "data_page_header_v2.repetition_levels_byte_length")
        is_compressed = bool_field(page, 7, "data_page_header_v2.is_compressed", True)
        if nulls > n or rows > n:
            raise Damage(f"{nulls} nulls or {rows} rows among {n} values")
        if def_bytes + rep_bytes > min(compressed, uncompressed):
            raise Damage(f"its levels' {def_bytes + rep_bytes} bytes exceed its body")
        return _new_header(_PAGE_TYPES[kind], uncompressed, compressed, n, nulls, rows,
                           encoding, None, def_bytes, rep_bytes, is_compressed, crc, size)
    if kind == PageType.DICTIONARY_PAGE:
        page = struct_field(top, 7, "dictionary_page_header")
        n = count_field(page, 1, "dictionary_page_header.num_values")
        encoding = i32_field(page, 2, "dictionary_page_header.encoding")
        return _new_header(_PAGE_TYPES[kind], uncompressed, compressed, n, None, None,
                           encoding, None, None, None, None, crc, size)
    struct_field(top, 6, "index_page_header")
    return _new_header(_PAGE_TYPES[kind], uncompressed, compressed, 0, None, None, None, None,
                       None, None, None, crc, size)


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
