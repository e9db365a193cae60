"""Columns copied from a fragment's bytes straight into a batch: tensor columns and columns of
one number a row, where each row's value lies in the file (``plain_values``) and the copy of a
run of rows into an array a reader gave (``copy_rows``), with no decoded Arrow column between.

A tensor column (``lakestream.tensor_field``) is stored as Parquet ``BYTE_ARRAY`` values, and a
column of 32- or 64-bit integers or floats as its fixed-width values, each uncompressed, PLAIN,
in v1 data pages (``lakestream.log.fragments.encode_fragment``). A page's body is then its
rows' values, each tensor value after a 4-byte length, behind the definition levels of a
nullable column (one run: every row present). So the values of a page are a strided array over
the file's bytes, and one copy per page moves them where the batch wants them; numpy releases
the GIL while it copies. A chunk laid out any other way (another writer's, one with nulls, a
dictionary) is decoded the general way and copied from there (``copy_values``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakestream.errors import CorruptLogError
from lakestream.read.fastpages import FastPage, fast_pages
from lakestream.read.pages import Encoding, PageType, column_chunk_pages
from lakestream.schema.arrays import as_numpy
from lakestream.schema.tensors import tensor_spec

_NUMBERS = {pa.int32(): ("INT32", "<i4"), pa.int64(): ("INT64", "<i8"),
            pa.float32(): ("FLOAT", "<f4"), pa.float64(): ("DOUBLE", "<f8")}
"""Arrow types read directly, their Parquet physical type and numpy dtype: the widths
Parquet stores them at (an int8 is stored as an INT32)."""


@dataclass(frozen=True)
class Direct:
    """A column read directly: its values' bytes a row, whether each follows a 4-byte length
    (a tensor column's ``BYTE_ARRAY``), and the Parquet physical type it is stored as."""

    nbytes: int
    prefixed: bool
    physical: str
    dtype: str
    """The numpy dtype of its values (``uint8`` for a tensor's bytes)."""


def direct_columns(schema: pa.Schema, columns: list[str] | None) -> dict[str, Direct]:
    """The columns of ``schema`` among ``columns`` (all if None) read directly: tensor
    columns, and 32- and 64-bit integer and float columns where every column read is one of
    these. Beside any other column, which Arrow decodes anyway, numbers ride along with it:
    read apart they cost each fragment a pass of its own (a shuffled SFT mix fell from 0.87x
    to 0.65x of log order, ``bench/sft_mix.py``); a tensor column's bytes are the batch, and
    worth it.

    Raises:
        CorruptLogError: a field's tensor metadata is malformed (the schema came from the
            store).
    """
    out = {}
    for field in schema:
        if columns is not None and field.name not in columns:
            continue
        if field.type in _NUMBERS:
            physical, dtype = _NUMBERS[field.type]
            out[field.name] = Direct(field.type.byte_width, False, physical, dtype)
            continue
        try:
            spec = tensor_spec(field)
        except ValueError as e:
            raise CorruptLogError(f"the stream's schema: {e}") from None
        if spec is not None:
            out[field.name] = Direct(spec.nbytes, True, "BYTE_ARRAY", "uint8")
    if any(name not in out for name in (schema.names if columns is None else columns)):
        out = {name: d for name, d in out.items() if d.prefixed}
    return out


@dataclass(frozen=True)
class PlainValues:
    """Where the values of one column of one fragment lie in its bytes: per data page, its
    first row and where its first value's bytes start; each row's value ``nbytes`` long,
    ``stride`` apart."""

    nbytes: int
    stride: int
    first_rows: np.ndarray
    """Per page, its first row in the fragment (then the fragment's rows)."""
    starts: np.ndarray
    """Per page, the offset of its first value's bytes in the file."""


def plain_values(buf: Any, md: pq.FileMetaData, column: int, direct: Direct,
                 memo: dict[int, list[FastPage]] | None = None) -> PlainValues | None:
    """Where each row's value of leaf ``column`` lies in the file ``buf``, if the column is
    laid out plainly (see the module docstring) and, for a tensor, every row's length prefix
    says ``direct.nbytes``; None for any other layout, decoded then the general way.

    Raises:
        ValueError: a page header is damaged (``column_chunk_pages``).
    """
    desc = md.schema.column(column)
    if desc.physical_type != direct.physical or desc.max_repetition_level \
            or desc.max_definition_level > 1:
        return None
    nullable = desc.max_definition_level == 1
    stride = direct.nbytes + 4 if direct.prefixed else direct.nbytes
    view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    first_rows, starts, row = [], [], 0
    for g in range(md.num_row_groups):
        chunk = md.row_group(g).column(column)
        if chunk.compression != "UNCOMPRESSED" or chunk.has_dictionary_page:
            return None
        for kind, _, compressed, n, encoding, body in _pages(view, chunk, memo):
            if kind != PageType.DATA_PAGE or encoding != Encoding.PLAIN:
                return None
            values = body + _all_present(view, body, n) if nullable else body
            if values < body or compressed != values - body + n * stride:
                return None
            if n:
                first_rows.append(row)
                starts.append(values + 4 if direct.prefixed else values)
            row += n
    first_rows.append(row)
    firsts, at = np.asarray(first_rows, np.int64), np.asarray(starts, np.int64)
    if direct.prefixed and row and not _lengths_are(view, firsts, at - 4, stride,
                                                    direct.nbytes):
        return None  # read the general way, which names the row
    return PlainValues(direct.nbytes, stride, firsts, at)


def _lengths_are(view: memoryview, first_rows: np.ndarray, prefixes: np.ndarray, stride: int,
                 nbytes: int) -> bool:
    """Whether every row's 4-byte length prefix says ``nbytes``: the rows of page p from
    ``first_rows[p]``, their prefixes from ``prefixes[p]``, ``stride`` apart (one gather for
    the whole fragment, not one per page)."""
    counts = np.diff(first_rows)
    rows = np.arange(int(first_rows[-1]), dtype=np.int64)
    at = np.repeat(prefixes - first_rows[:-1] * stride, counts) + rows * stride
    raw = np.frombuffer(view, np.uint8)[at[:, None] + np.arange(4)]
    return bool((raw.view("<u4").ravel() == nbytes).all())


def _pages(view: memoryview, chunk: Any, memo: dict[int, list[FastPage]] | None
           ) -> list[FastPage]:
    start, length, values = chunk.data_page_offset, chunk.total_compressed_size, \
        chunk.num_values
    pages = memo.get(start) if memo is not None else None
    if pages is None:
        pages = fast_pages(view, start, length, values)
    if pages is None:
        pages = [(int(p.header.kind), p.header.uncompressed_size, p.header.compressed_size,
                  p.header.num_values, -1 if p.header.encoding is None else p.header.encoding,
                  p.body_offset) for p in column_chunk_pages(view, start, length, values)]
    if memo is not None:
        memo[start] = pages
    return pages


def _all_present(view: memoryview, body: int, n: int) -> int:
    """The bytes a v1 page's definition levels take at ``body`` (a 4-byte length, then the
    levels) if they say every one of its ``n`` rows is present, as one RLE run or bit-packed
    ones; -1 for anything else (a null, another encoding of the levels)."""
    try:
        length = int.from_bytes(view[body:body + 4], "little")
        levels = bytes(view[body + 4:body + 4 + length])
    except (ValueError, IndexError):
        return -1
    if levels == _varint(n << 1) + b"\x01":
        return 4 + length
    groups = -(-n // 8)
    packed = bytes([0xFF] * (n // 8) + ([(1 << (n % 8)) - 1] if n % 8 else []))
    if levels == _varint(groups << 1 | 1) + packed:
        return 4 + length
    return -1


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def copy_rows(buf: Any, values: PlainValues, start: int, stop: int, out: np.ndarray) -> None:
    """Copies the values of rows ``[start, stop)`` of the fragment ``buf`` into ``out``
    (``[stop - start, nbytes]`` uint8): one copy per page the rows span."""
    step = values.stride
    page = int(np.searchsorted(values.first_rows, start, side="right")) - 1
    at = 0
    while start < stop:
        first, end = int(values.first_rows[page]), int(values.first_rows[page + 1])
        k = min(stop, end) - start
        src = np.ndarray((k, values.nbytes), np.uint8, buf,
                         int(values.starts[page]) + (start - first) * step, (step, 1))
        out[at:at + k] = src
        at += k
        start += k
        page += 1


class ColumnSink:
    """Where a read puts its rows of directly read columns: per column, how it is read, and
    the ``[rows, nbytes]`` uint8 array the caller made for the read's rows, in the memory it
    delivers from (pinned, shared, or plain)."""

    def __init__(self, columns: dict[str, Direct], arrays: dict[str, np.ndarray]) -> None:
        self.columns = columns
        self.arrays = arrays

    def part(self, at: int, rows: int) -> ColumnSink:
        """The sink of rows ``[at, at + rows)`` (a source's share of a mixed step)."""
        return ColumnSink(self.columns, {k: v[at:at + rows] for k, v in self.arrays.items()})


Alloc = Callable[[str, int], np.ndarray]
"""Makes the ``[rows, nbytes]`` uint8 array a read puts column ``name``'s rows in."""


def binary_chunks(column: Any) -> list[tuple[pa.Buffer | None, np.ndarray, np.ndarray | None]]:
    """(data buffer, ``[k + 1]`` int64 offsets into it, validity or None where no row is
    null) of each chunk of a binary column (an array or chunked array), a null row spanning
    no bytes: the bytes can be copied out where they lie, once."""
    out = []
    for arr in getattr(column, "chunks", [column]):
        valid = None
        if arr.null_count:
            mask = arr.is_valid()
            valid = mask.to_numpy(zero_copy_only=False)
            arr = pc.if_else(mask, arr, pa.scalar(b"", arr.type))
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], np.int32, len(arr) + 1, arr.offset * 4) \
            if len(arr) else np.zeros(1, np.int32)
        out.append((bufs[2], offsets.astype(np.int64), valid))
    return out


def copy_values(column: Any, direct: Direct, out: np.ndarray, name: str) -> None:
    """The values of a column decoded into Arrow (an array or chunked array) into ``out``
    (``[len, nbytes]`` uint8), a null row as zeros.

    Raises:
        CorruptLogError: a tensor value neither null nor ``nbytes`` long (a writer that went
            around the producer's checks), naming the row.
    """
    if not direct.prefixed:
        out.reshape(-1).view(direct.dtype)[:] = as_numpy(column, fill=0)
        return
    nbytes, row = direct.nbytes, 0
    for data, offsets, valid in binary_chunks(column):
        k = len(offsets) - 1
        if not k:
            continue
        lengths = np.diff(offsets)
        wrong = lengths != nbytes if valid is None else (lengths != nbytes) & valid
        if wrong.any():
            bad = int(np.flatnonzero(wrong)[0])
            raise CorruptLogError(f"column {name} holds a value of {int(lengths[bad])} bytes at "
                                  f"row {row + bad}; its tensors are {nbytes} bytes")
        if data is None:  # no row holds a byte: nulls, or tensors of no bytes
            out[row:row + k] = 0
        elif valid is None:
            out[row:row + k] = np.frombuffer(data, np.uint8, k * nbytes,
                                             int(offsets[0])).reshape(k, nbytes)
        else:
            out[row:row + k] = 0
            for j in np.flatnonzero(valid).tolist():
                out[row + j] = np.frombuffer(data, np.uint8, nbytes, int(offsets[j]))
        row += k
