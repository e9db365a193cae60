"""A fragment's footer, checked from its own bytes before pyarrow's accessors look at it: a
chunk per column in every row group, and nothing in a chunk's entry that those accessors
abort the process on (a C++ exception nothing catches): a codec Parquet does not define,
size statistics that do not fit the column, encryption."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq

from lakestream.read.compact import (
    T_BINARY,
    T_I32,
    T_I64,
    T_LIST,
    T_STRUCT,
    Damage,
    Past,
    list_head,
    skip,
    struct_list,
    varint,
    walk_struct,
)

FOOTER_READ = 64 << 10
"""The bytes read from a fragment's end for its footer, as pyarrow reads them (its default
footer read): more only where the footer is longer."""


MAX_FOOTER_BYTES = 64 << 20
"""The longest footer read: as long as the longest index segment (an 800-column fragment's
is 70 KB); a longer one is refused before it is read."""


def read_tail(f: Any, size: int) -> tuple[int, bytes]:
    """Where the end of the file ``f`` of ``size`` bytes that holds its footer starts, and
    those bytes: the last ``FOOTER_READ``, or the footer whole where it is longer, so that
    pyarrow's reads of the footer fall within them.

    Raises:
        ValueError: the file is shorter than ``size``, or does not end as Parquet does.
    """
    n = min(size, FOOTER_READ)
    f.seek(size - n)
    got = f.read(n)
    need = footer_length(memoryview(got), size) + 8
    if need > n:
        f.seek(size - need)
        n, got = need, f.read(need)
    if len(got) != n:
        raise ValueError(f"it ends before the {size:,} bytes the log says it holds")
    return size - n, got


def footer_length(end: memoryview, size: int) -> int:
    """The length of the footer of a file of ``size`` bytes that ``end`` ends.

    Raises:
        ValueError: it does not end as Parquet does, or its footer is longer than it or
            than ``MAX_FOOTER_BYTES``.
    """
    last = end[-8:].tobytes() if len(end) >= 8 else b""
    if last[4:] != b"PAR1":
        raise ValueError("it does not end as Parquet does (b'PAR1')")
    n = int.from_bytes(last[:4], "little")
    if n + 12 > size:
        raise ValueError(f"its footer of {n:,} bytes is longer than the file")
    if n > MAX_FOOTER_BYTES:
        raise ValueError(f"its footer of {n:,} bytes is longer than {MAX_FOOTER_BYTES:,}, "
                         "the most a fragment's may be")
    return n


def footer_bytes(end: memoryview, size: int) -> memoryview:
    """The Thrift bytes of the footer of a file of ``size`` bytes that ``end`` ends (all of
    the footer in it)."""
    n = footer_length(end, size)
    return end.cast("B")[len(end) - 8 - n:len(end) - 8]


CODECS = range(8)
"""The compression codecs Parquet defines, UNCOMPRESSED (0) to LZ4_RAW (7)."""


def check_footer(md: pq.FileMetaData, thrift: memoryview) -> None:
    """Raises ValueError if a row group holds another number of column chunks than the
    schema has columns, or a chunk's footer entry is one pyarrow's accessors abort the
    process on (``ChunkFacts.fault``), read from the footer's own bytes, ``thrift``: none is
    looked at before this holds."""
    columns = md.num_columns
    for i in range(md.num_row_groups):
        group = md.row_group(i)
        if group.num_columns != columns:
            raise ValueError(f"row group {i} holds {group.num_columns} columns, the schema "
                             f"{columns}")
    schema = [md.schema.column(j) for j in range(columns)]
    for i, chunks in enumerate(chunk_facts(thrift)):
        for j, chunk in enumerate(chunks):
            fault = chunk.fault(schema[j])
            if fault:
                raise ValueError(f"the chunk of column {j} in row group {i} {fault}")


@dataclass
class ChunkFacts:
    """What a column chunk's footer entry says that pyarrow's accessors do not survive when
    it is wrong (a C++ exception nothing catches aborts the process)."""

    meta: bool = False
    """It has its metadata (``ColumnMetaData``)."""
    encrypted: bool = False
    """Its metadata is encrypted, or it names how."""
    codec: int | None = None
    repetition_levels: int = 0
    """The length of its size statistics' repetition level histogram (0: none)."""
    definition_levels: int = 0
    byte_array_bytes: bool = False
    """Its size statistics count the unencoded bytes of byte arrays."""

    def fault(self, column: Any) -> str | None:
        """What is wrong with it, for ``column`` (a ``pq.ColumnSchema``), or None."""
        if self.encrypted:
            return "is encrypted, which a stream's fragments never are"
        if not self.meta:
            return "has no metadata"
        if self.codec not in CODECS:
            return f"names compression codec {self.codec}, which Parquet does not define"
        for kind, n, level in (("repetition", self.repetition_levels,
                                column.max_repetition_level),
                               ("definition", self.definition_levels,
                                column.max_definition_level)):
            if n and n != level + 1:
                return (f"has a {kind} level histogram of {n} levels, where its column has "
                        f"{level + 1}")
        if self.byte_array_bytes and column.physical_type != "BYTE_ARRAY":
            return f"counts byte array bytes in a column of {column.physical_type}"
        return None


def chunk_facts(mv: memoryview) -> list[list[ChunkFacts]]:
    """Each row group's column chunks' ``ChunkFacts``, read from the footer's Thrift bytes
    ``mv`` (which pyarrow parsed), not from pyarrow's accessors (nor from the bytes pyarrow
    writes back of them: writing some damaged footers crashed it)."""
    groups: list[list[ChunkFacts]] = []

    def facts() -> ChunkFacts:
        return groups[-1][-1]

    def codec(pos: int) -> int:
        n, end = varint(mv, pos)
        facts().codec = (n >> 1) ^ -(n & 1)
        return end

    def histogram(levels: str) -> tuple[int, Callable[[int], int]]:
        def read(pos: int) -> int:  # a list of i64: its length noted
            setattr(facts(), levels, list_head(mv, pos, 4)[0])
            return skip(mv, pos, T_LIST, 4)
        return T_LIST, read

    def byte_array_bytes(pos: int) -> int:
        facts().byte_array_bytes = True
        return skip(mv, pos, T_I64, 4)

    sizes = {1: (T_I64, byte_array_bytes), 2: histogram("repetition_levels"),
             3: histogram("definition_levels")}

    def meta(pos: int) -> int:
        facts().meta = True
        return walk_struct(mv, pos, 3, {
            4: (T_I32, codec), 16: (T_STRUCT, lambda at: walk_struct(mv, at, 4, sizes))})

    def encrypted(t: int) -> tuple[int, Callable[[int], int]]:
        def read(pos: int) -> int:
            facts().encrypted = True
            return skip(mv, pos, t, 3)
        return t, read

    chunk = {3: (T_STRUCT, meta), 8: encrypted(T_STRUCT), 9: encrypted(T_BINARY)}

    def one_chunk(pos: int) -> int:
        groups[-1].append(ChunkFacts())
        return walk_struct(mv, pos, 2, chunk)

    def one_group(pos: int) -> int:
        groups.append([])
        return walk_struct(mv, pos, 1, {1: (T_LIST, lambda at: struct_list(mv, at, 1,
                                                                           one_chunk))})

    def row_groups(pos: int) -> int:
        struct_list(mv, pos, 0, one_group)
        raise _Read  # what follows the row groups is not needed

    try:
        walk_struct(mv, 0, 0, {4: (T_LIST, row_groups)})
    except _Read:
        return groups
    except (Damage, Past, IndexError) as e:  # pyarrow parsed it: not expected
        raise ValueError(f"its footer cannot be walked: {e or type(e).__name__}") from None
    raise ValueError("its footer has no row groups")


class _Read(Exception):
    """The footer's row groups are read: the rest of it is not walked."""
