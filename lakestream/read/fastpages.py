"""Column chunks' pages found fast: the headers Parquet writers lay out matched by a pattern
in one call each, summed up into what a chunk decodes to; any other layout is left to the
careful parse of ``read/pages.py``."""

from __future__ import annotations

import re
from typing import NamedTuple

from lakestream.read.compact import T_BINARY, T_FALSE, T_I32, T_I64, T_STOP, T_TRUE
from lakestream.read.pages import Encoding, Page, PageType, column_chunk_pages, view_of


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
    view = view_of(buf)
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
    view = view_of(buf)
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
        if t == T_STOP:
            return i
        if head < 0x10:
            return -1
        if t == T_BINARY:
            n, i = _fast_varint(b, i)
            i += n
        elif t == T_I64 or t == T_I32:
            i = _fast_varint(b, i)[1]
        elif t != T_TRUE and t != T_FALSE:
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
