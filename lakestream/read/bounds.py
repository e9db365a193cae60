"""What a fragment may decode to, bounded before it is decoded (its footer checked first:
``read/footer.py``): each row group's decoded size bounded by what its pages hold, not by
what its footer says."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lakestream.read.fastpages import FastPage, chunk_pages

MAX_DECODED_BYTES_PER_ROW = 256 << 20
"""What a fragment may decode to, per row it holds, by the bound its footer gives: four times
a producer's default largest sample (``max_sample_bytes``, 64 MiB), so that no fragment a
producer writes is refused, and a crafted one (a few KB that honestly decode to gigabytes)
is refused before it is decoded."""
_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


def leaf_count(t: pa.DataType) -> int:
    """The Parquet columns an Arrow type is stored in."""
    if isinstance(t, pa.ListType | pa.LargeListType | pa.FixedSizeListType):
        return leaf_count(t.value_type)
    if isinstance(t, pa.MapType):
        return leaf_count(t.key_type) + leaf_count(t.item_type)
    if isinstance(t, pa.StructType):
        return sum(leaf_count(t.field(i).type) for i in range(t.num_fields))
    return 1


def chunk_range(md: pq.FileMetaData, group: int, column: int) -> tuple[int, int]:
    """``(start, end)`` of a column chunk in the file, as Parquet readers compute it: from its
    dictionary page if that comes first, over ``total_compressed_size`` bytes."""
    chunk = md.row_group(group).column(column)
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
        start = chunk.dictionary_page_offset
    return start, start + chunk.total_compressed_size


def decoded_bound(md: pq.FileMetaData, group: int, buf: Any, base: int = 0,
                  leaves: Sequence[int] | None = None,
                  memo: dict[int, list[FastPage]] | None = None) -> int:
    """An upper bound of the bytes row group ``group`` decodes to, from what its pages hold:
    each page's header (``lakestream.read.pages``) is parsed from ``buf`` (the file's bytes
    from offset ``base``), since a footer's sizes may lie (a 36 KB file whose footer said so
    decompressed to 1.2 GB). Each page decompresses to its header's size; a column chunk's
    values are its values times their width (and a word each of offsets and validity), or,
    for byte arrays, the pages' bytes, and, where a value may repeat another's bytes (a
    dictionary, prefix sharing), as many copies of the largest page as there are values.
    An uncompressed chunk of fixed-width values decompresses nothing: its values' widths and
    its stored bytes bound it, and its pages are not read.

    Raises:
        ValueError: a page header is damaged, or the pages do not tile their chunk or hold
            another number of values than the footer says.
    """
    row_group = md.row_group(group)
    total = 0
    for j in range(md.num_columns) if leaves is None else leaves:
        chunk = row_group.column(j)
        n = chunk.num_values
        kind = chunk.physical_type
        if kind in _WIDTHS and chunk.compression == "UNCOMPRESSED":
            # Nothing is decompressed, and every value is its width, dictionary or not:
            # the values and the stored bytes bound it, the pages need not be read.
            total += n * (_WIDTHS[kind] + 8) + chunk.total_compressed_size
            continue
        start, end = chunk_range(md, group, j)
        pages = chunk_pages(buf, start - base, end - start, n, memo)
        if kind in _WIDTHS:
            values = n * _WIDTHS[kind]
        elif kind == "FIXED_LEN_BYTE_ARRAY":
            values = n * md.schema.column(j).length
        elif pages.repeats:
            values = n * pages.largest
        else:
            values = pages.inflated
        total += pages.inflated + values + n * 8
    return total


def check_decoded(md: pq.FileMetaData, groups: Sequence[int], buf: Any, base: int = 0,
                  leaves: Sequence[int] | None = None,
                  memo: dict[int, list[FastPage]] | None = None) -> None:
    """Raises ValueError if row groups ``groups`` (their columns ``leaves``; None: all) would
    decode to more than ``MAX_DECODED_BYTES_PER_ROW`` a row (``decoded_bound``)."""
    for g in groups:
        rows = md.row_group(g).num_rows
        bound = decoded_bound(md, g, buf, base, leaves, memo)
        if bound > max(1, rows) * MAX_DECODED_BYTES_PER_ROW:
            raise ValueError(f"its row group {g} of {rows} rows would decode to up to "
                             f"{bound:,} bytes, over {MAX_DECODED_BYTES_PER_ROW:,} a row")
