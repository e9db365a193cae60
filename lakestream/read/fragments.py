"""Reading fragments' rows back: only the row groups needed, every file checked against what
the log says of it before it is decoded."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from zlib_ng import zlib_ng

from lakestream.errors import CorruptLogError, NotFoundError
from lakestream.log.fragments import read_whole
from lakestream.log.segments import Fragment
from lakestream.plan.rows import plan_rows
from lakestream.read.cache import FragmentCache
from lakestream.store.base import ObjectStore

MAX_DECODED_BYTES_PER_ROW = 256 << 20
"""What a fragment may decode to, per row it holds, by the bound its footer gives: four times
a producer's default largest sample (``max_sample_bytes``, 64 MiB), so that no fragment a
producer writes is refused, and a crafted one (a few KB that honestly decode to gigabytes)
is refused before it is decoded."""
_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


def decoded_bound(md: pq.FileMetaData) -> int:
    """An upper bound of the bytes reading the whole file decodes to, from its footer alone:
    each column chunk's values times their width (and a word each of offsets and validity);
    a byte-array chunk's bytes once uncompressed, and, dictionary-encoded, as many copies of
    its dictionary as it has values beyond one per row (each row's one value is at most the
    dictionary)."""
    total = 0
    for i in range(md.num_row_groups):
        group = md.row_group(i)
        for j in range(group.num_columns):
            chunk = group.column(j)
            n = chunk.num_values
            kind = chunk.physical_type
            if kind in _WIDTHS:
                total += n * (_WIDTHS[kind] + 8)
            elif kind == "FIXED_LEN_BYTE_ARRAY":
                total += n * (md.schema.column(j).length + 8)
            elif chunk.has_dictionary_page:
                total += max(1, n // max(1, group.num_rows)) * chunk.total_uncompressed_size \
                    + n * 8
            else:
                total += chunk.total_uncompressed_size + n * 8
    return total


class FragmentReader:
    """Reads row ranges of fragments, only the row groups needed; caches Parquet footers.

    Every fragment is checked against what the log says of it before it is decoded: its row
    count, its schema (the stream's), and the bound its footer gives of what it decodes to
    (``MAX_DECODED_BYTES_PER_ROW``); a fragment that fails is ``CorruptLogError`` in time and
    memory bounded by its footer.
    """

    def __init__(self, store: ObjectStore, cache_size: int = 256, *,
                 schema: pa.Schema | None = None) -> None:
        self.store = store
        self.schema = schema
        self._expected: dict[tuple[str, ...] | None, tuple[list[str], list[pa.DataType]]] = {}
        self._footers: OrderedDict[str, pq.FileMetaData] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def read(self, path: str, size: int, start: int, stop: int,
             columns: list[str] | None = None, *, crc32: int = -1,
             rows: int | None = None) -> pa.Table:
        """Rows ``[start, stop)`` of the fragment at ``path``, which the log says holds
        ``rows`` rows (None: at least ``stop``).

        Raises:
            NotFoundError: the file is gone.
            CorruptLogError: it is not readable Parquet, differs from the size or checksum the
                log recorded, holds another number of rows than the log says, has another
                schema than the stream's, or would decode to more than its rows may.
        """
        try:
            whole = 0 <= crc32 and read_whole(size, (stop - start) / rows if rows else 0.0)
            if whole:
                data = self.store.get(path, max_bytes=max(size, 1))
                found = zlib_ng.crc32(data)
                if len(data) != size or found != crc32:
                    raise ValueError(f"{len(data)} bytes with CRC-32 {found}, the log recorded "
                                     f"{size} bytes with {crc32}: the file is damaged")
                source: Any = pa.BufferReader(data)
            else:
                source = self.store.open_input(path, size)
            with source as f:
                with self._lock:
                    md = self._footers.get(path)
                # Read whole, every byte was checked against the CRC-32 the log records.
                pf = pq.ParquetFile(f, metadata=md, page_checksum_verification=not whole)
                if md is None:
                    self._check(pf, rows)
                    with self._lock:
                        self._footers[path] = pf.metadata
                        while len(self._footers) > self._cache_size:
                            self._footers.popitem(last=False)
                md = pf.metadata
                groups, first, at = [], -1, 0
                for i in range(md.num_row_groups):
                    n = md.row_group(i).num_rows
                    if at + n > start and at < stop:
                        groups.append(i)
                        first = at if first < 0 else first
                    at += n
                if at < stop:
                    raise ValueError(f"holds {at} rows, the log says at least {stop}")
                table = pf.read_row_groups(groups, columns=columns, use_threads=False)
                self._check_schema(table, columns)
        except NotFoundError:
            raise
        except (OSError, pa.ArrowException, ValueError) as e:
            raise CorruptLogError(f"fragment {path} cannot be read: {e}") from None
        return table.slice(start - first, stop - start)

    def _check(self, pf: pq.ParquetFile, rows: int | None) -> None:
        """The footer's promises against the log's (once per footer read)."""
        md = pf.metadata
        if rows is not None and md.num_rows != rows:
            raise ValueError(f"holds {md.num_rows} rows, the log says {rows}")
        bound = decoded_bound(md)
        if bound > max(1, md.num_rows) * MAX_DECODED_BYTES_PER_ROW:
            raise ValueError(f"its {md.num_rows} rows would decode to up to {bound:,} bytes, "
                             f"over {MAX_DECODED_BYTES_PER_ROW:,} a row")

    def _check_schema(self, table: pa.Table, columns: list[str] | None) -> None:
        """What was decoded has the stream's columns and types (compared after decoding,
        which the footer's bound has kept small: building the file's Arrow schema from its
        footer to compare first cost a sixth of a small fragment's read)."""
        if self.schema is None:
            return
        key = None if columns is None else tuple(columns)
        want = self._expected.get(key)
        if want is None:
            fields = self.schema if columns is None else [self.schema.field(c)
                                                          for c in columns]
            want = self._expected[key] = ([f.name for f in fields], [f.type for f in fields])
        got = table.schema
        if got.names != want[0] or got.types != want[1]:
            raise ValueError(f"its schema is {_brief(got)}, the stream's is "
                             f"{_brief(self.schema)}")


def _brief(schema: pa.Schema) -> str:
    text = ", ".join(f"{f.name}: {f.type}" for f in schema)
    return text if len(text) <= 200 else text[:200] + "..."


def read_spans(reader: FragmentReader, fragments: Sequence[Fragment],
               spans: Sequence[tuple[int, int]], columns: list[str] | None,
               cache: FragmentCache | None = None) -> list[pa.Table]:
    """The rows at offsets ``[lo, hi)`` of each span, as slices in the order given, from
    ``fragments`` (contiguous, in offset order, covering every span). A fragment that several
    spans touch is read once, over the rows they need; with a ``cache``, read whole, once
    while the cache keeps it, in this thread (on a shared pool it cost more CPU:
    ``bench/mixing.py``; the caller's reader threads already fill the cores)."""
    plans = [plan_rows(fragments, a, b) for a, b in spans]
    reach: dict[int, tuple[int, int]] = {}
    for r in (r for plan in plans for r in plan):
        start, stop = reach.get(r.index, (r.start, r.stop))
        reach[r.index] = (min(start, r.start), max(stop, r.stop))
    if cache is None:
        tables = {i: reader.read(fragments[i].path, fragments[i].size, start, stop, columns,
                                 crc32=fragments[i].crc32, rows=fragments[i].rows)
                  for i, (start, stop) in reach.items()}
    else:
        kind = ",".join(columns) if columns is not None else "*"

        def whole(f: Fragment) -> pa.Table:
            return cache.fetch((f.path, kind), lambda: reader.read(
                f.path, f.size, 0, f.rows, columns, crc32=f.crc32, rows=f.rows))

        tables = {i: whole(fragments[i]) for i in reach}
        reach = {i: (0, fragments[i].rows) for i in reach}
    return [tables[r.index].slice(r.start - reach[r.index][0], r.stop - r.start)
            for plan in plans for r in plan]
