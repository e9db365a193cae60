"""Reading fragments' rows back: only the row groups needed, every file checked against what
the log says of it before it is decoded."""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
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
LastStep = Callable[[int, int], int]
"""The last step that may read offsets ``[lo, hi)`` of a stream (``MixPlan.last_step``)."""
_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


def decoded_bound(md: pq.FileMetaData) -> int:
    """An upper bound of the bytes reading the whole file decodes to, from its footer alone:
    each column chunk's values times their width (and a word each of offsets and validity);
    a byte-array chunk's bytes once uncompressed, and, dictionary-encoded, as many copies of
    its dictionary as it has values beyond one per row (each row's one value is at most the
    dictionary)."""
    total = 0
    columns = md.num_columns
    for i in range(md.num_row_groups):
        group = md.row_group(i)
        if group.num_columns != columns:  # pyarrow aborts the process on reading past them
            raise ValueError(f"row group {i} holds {group.num_columns} columns, the schema "
                             f"{columns}")
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


@dataclass(frozen=True)
class Footer:
    """A fragment's Parquet footer, and the first row of each of its row groups (then its
    row count)."""

    metadata: pq.FileMetaData
    starts: list[int]

    @classmethod
    def of(cls, md: pq.FileMetaData) -> Footer:
        starts = [0]
        for i in range(md.num_row_groups):
            starts.append(starts[-1] + md.row_group(i).num_rows)
        return cls(md, starts)

    def groups(self, start: int, stop: int) -> range:
        """The row groups that hold rows of ``[start, stop)``."""
        return range(bisect.bisect_right(self.starts, start) - 1,
                     bisect.bisect_left(self.starts, stop))


class FragmentReader:
    """Reads row ranges of fragments, only the row groups needed; caches Parquet footers.

    Every fragment is checked against what the log says of it before it is decoded: its row
    count, its schema (the stream's), and the bound its footer gives of what it decodes to
    (``MAX_DECODED_BYTES_PER_ROW``); a fragment that fails is ``CorruptLogError`` in time and
    memory bounded by its footer. A read's three parts (``fetch`` a file read whole, its
    ``footer``, ``decode`` row groups) are apart for ``read_spans``'s cache, which keeps
    each one's result for the steps that draw on it.
    """

    def __init__(self, store: ObjectStore, cache_size: int = 256, *,
                 schema: pa.Schema | None = None) -> None:
        self.store = store
        self.schema = schema
        self._expected: dict[tuple[str, ...] | None, tuple[list[str], list[pa.DataType]]] = {}
        self._footers: OrderedDict[str, Footer] = OrderedDict()
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
        data = self.fetch(path, size, crc32) \
            if fetched_whole(size, crc32, stop - start, rows) else None
        with _corrupt(path), self._source(path, size, data) as f:
            pf, footer = self._open(f, path, rows, checked=data is not None)
            if footer.starts[-1] < stop:
                raise ValueError(f"holds {footer.starts[-1]} rows, the log says at least {stop}")
            groups = footer.groups(start, stop)
            table = self._decode(pf, groups, columns)
        return table.slice(start - footer.starts[groups[0]], stop - start)

    def fetch(self, path: str, size: int, crc32: int) -> pa.Buffer:
        """The whole file at ``path``, checked against the size and CRC-32 the log recorded
        (for a fragment ``fetched_whole``).

        Raises:
            NotFoundError: the file is gone.
            CorruptLogError: it differs from what the log recorded.
        """
        with _corrupt(path):
            data = self.store.get(path, max_bytes=max(size, 1))
            found = zlib_ng.crc32(data)
            if len(data) != size or found != crc32:
                raise ValueError(f"{len(data)} bytes with CRC-32 {found}, the log recorded "
                                 f"{size} bytes with {crc32}: the file is damaged")
        return pa.py_buffer(data)

    def cached_footer(self, path: str) -> Footer | None:
        """The footer of ``path`` if this reader holds it (checked when it was read)."""
        with self._lock:
            return self._footers.get(path)

    def footer(self, path: str, size: int, data: pa.Buffer | None,
               rows: int | None) -> Footer:
        """The footer of the fragment at ``path`` (of ``data`` if fetched whole, else read by
        range), checked against the ``rows`` the log says it holds on first reading.

        Raises:
            NotFoundError: the file is gone.
            CorruptLogError: it is not readable Parquet, or its footer breaks what the log
                says of it (rows, the bound of what it decodes to).
        """
        footer = self.cached_footer(path)
        if footer is None:
            with _corrupt(path), self._source(path, size, data) as f:
                _, footer = self._open(f, path, rows, checked=data is not None)
        return footer

    def decode(self, path: str, size: int, data: pa.Buffer | None, footer: Footer,
               groups: Sequence[int], columns: list[str] | None) -> pa.Table:
        """Row groups ``groups`` of the fragment at ``path`` (of ``data`` if fetched whole,
        else read by range), checked against the stream's schema.

        Raises:
            NotFoundError: the file is gone.
            CorruptLogError: a page fails its checksum or cannot be decoded, or the schema is
                not the stream's.
        """
        with _corrupt(path), self._source(path, size, data) as f:
            pf = pq.ParquetFile(f, metadata=footer.metadata,
                                page_checksum_verification=data is None)
            return self._decode(pf, groups, columns)

    def _open(self, f: Any, path: str, rows: int | None, *, checked: bool
              ) -> tuple[pq.ParquetFile, Footer]:
        """The Parquet file ``f`` of ``path`` and its footer: cached, or read and checked
        against the ``rows`` the log says it holds, then cached. ``checked``: ``f`` holds
        bytes checked against the CRC-32 the log records."""
        footer = self.cached_footer(path)
        # Parquet's page checksums (slow) are checked only where the CRC-32 was not.
        pf = pq.ParquetFile(f, metadata=None if footer is None else footer.metadata,
                            page_checksum_verification=not checked)
        if footer is None:
            self._check(pf, rows)
            footer = Footer.of(pf.metadata)
            with self._lock:
                self._footers[path] = footer
                while len(self._footers) > self._cache_size:
                    self._footers.popitem(last=False)
        return pf, footer

    def _decode(self, pf: pq.ParquetFile, groups: Sequence[int],
                columns: list[str] | None) -> pa.Table:
        table = pf.read_row_groups(list(groups), columns=columns, use_threads=False)
        self._check_schema(table, columns)
        return table

    def _source(self, path: str, size: int, data: pa.Buffer | None) -> Any:
        return pa.BufferReader(data) if data is not None else self.store.open_input(path, size)

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
               cache: FragmentCache | None = None,
               last_step: LastStep | None = None) -> list[pa.Table]:
    """The rows at offsets ``[lo, hi)`` of each span, as slices in the order given, from
    ``fragments`` (contiguous, in offset order, covering every span). A fragment that several
    spans touch is read once, over the rows they need.

    With a ``cache``, each row group is decoded once, and a file read whole fetched once,
    while the cache keeps them: until ``last_step(lo, hi)``, the last step that may read
    offsets ``[lo, hi)`` (None: until the cache's bound pushes them out). They are loaded
    in this thread (on a shared pool it cost more CPU: ``bench/mixing.py``; the caller's
    reader threads already fill the cores)."""
    ranges = _row_ranges(fragments, spans)
    reach: dict[int, tuple[int, int]] = {}
    for i, start, stop in ranges:
        first, last = reach.get(i, (start, stop))
        reach[i] = (min(first, start), max(last, stop))
    tables: dict[int, tuple[pa.Table, int]] = {}  # rows from a first row on, and that row
    for i, (start, stop) in reach.items():
        f = fragments[i]
        tables[i] = (reader.read(f.path, f.size, start, stop, columns, crc32=f.crc32,
                                 rows=f.rows), start) if cache is None \
            else _cached_rows(reader, cache, f, start, stop, columns, last_step)
    return [tables[i][0].slice(start - tables[i][1], stop - start)
            for i, start, stop in ranges]


def _row_ranges(fragments: Sequence[Fragment], spans: Sequence[tuple[int, int]]
                ) -> list[tuple[int, int, int]]:
    """(fragment index, first row, end row) covering each span in turn: ``plan_rows``, with
    the spans inside one fragment (each sample of a shuffled step of single-sample groups)
    found at once."""
    offsets = [f.offset for f in fragments]
    ends = [f.offset + f.rows for f in fragments]
    out: list[tuple[int, int, int]] = []
    for lo, hi in spans:
        i = bisect.bisect_right(offsets, lo) - 1
        if i >= 0 and hi <= ends[i]:
            out.append((i, lo - offsets[i], hi - offsets[i]))
        else:
            out.extend((r.index, r.start, r.stop) for r in plan_rows(fragments, lo, hi))
    return out


def _cached_rows(reader: FragmentReader, cache: FragmentCache, f: Fragment, start: int,
                 stop: int, columns: list[str] | None, last_step: LastStep | None
                 ) -> tuple[pa.Table, int]:
    """The row groups of ``f`` that hold rows ``[start, stop)``, and the first row of them,
    through ``cache``; the file's bytes, when it is fetched whole, are kept while row groups
    of it are still to be decoded."""
    kind = ",".join(columns) if columns is not None else "*"
    whole = fetched_whole(f.size, f.crc32, stop - start, f.rows)

    def until(lo: int, hi: int) -> int | None:
        return None if last_step is None else last_step(f.offset + lo, f.offset + hi)

    def data() -> pa.Buffer | None:
        if not whole:
            return None
        return cache.fetch((f.path,), lambda: reader.fetch(f.path, f.size, f.crc32),
                           until=until(0, f.rows))

    footer = reader.cached_footer(f.path) or reader.footer(f.path, f.size, data(), f.rows)
    starts = footer.starts

    def decode(g: int) -> pa.Table:
        return reader.decode(f.path, f.size, data(), footer, [g], columns)

    groups = footer.groups(start, stop)
    parts = [cache.fetch((f.path, kind, g), partial(decode, g),
                         until=until(starts[g], starts[g + 1])) for g in groups]
    if whole and cache.holds((f.path,)) \
            and cache.holds(*[(f.path, kind, g) for g in range(len(starts) - 1)]):
        cache.discard((f.path,))  # every row group decoded: the bytes are done with
    return (parts[0] if len(parts) == 1 else pa.concat_tables(parts)), starts[groups[0]]


def fetched_whole(size: int, crc32: int, wanted: int, rows: int | None) -> bool:
    """Whether a fragment of ``rows`` rows (None: not known) of which a read wants ``wanted``
    is fetched whole, in one GET, and checked against its CRC-32
    (``lakestream.log.fragments.read_whole``; a fragment whose commit recorded no CRC-32 is
    read by range)."""
    return 0 <= crc32 and read_whole(size, wanted / rows if rows else 0.0)


@contextmanager
def _corrupt(path: str) -> Iterator[None]:
    """Turns what a damaged file raises into ``CorruptLogError`` (a missing one stays
    ``NotFoundError``)."""
    try:
        yield
    except NotFoundError:
        raise
    except (OSError, pa.ArrowException, ValueError) as e:
        raise CorruptLogError(f"fragment {path} cannot be read: {e}") from None
