"""Reading fragments' rows back: only the row groups needed, every file checked against what
the log says of it before it is decoded."""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader
from zlib_ng import zlib_ng

from lakestream.errors import CorruptLogError, NotFoundError
from lakestream.log.fragments import read_whole
from lakestream.read.bounds import check_decoded, chunk_range, leaf_count
from lakestream.read.fastpages import FastPage
from lakestream.read.footer import check_footer, footer_bytes, read_tail
from lakestream.read.tensors import Direct, PlainValues, plain_values
from lakestream.store.base import ObjectStore, SeekableReader
from lakestream.store.diskcache import DiskCache

OPENED = 16
"""Readers opened by ``footer`` kept for a decode to come: as many fragments as a reader's
threads read at once, a few times over."""
OPENED_BYTES = 1 << 20
"""Only small fragments' readers are kept (each holds its fragment's bytes): opening one is
a sixth of a 4-row fragment's read, and nothing beside a large one's."""

LastStep = Callable[[int, int], int]
"""The last step that may read offsets ``[lo, hi)`` of a stream (``MixPlan.last_step``). One
whose ``final`` attribute is true (``StepPass``) says no later pass of the plan reads them
again, so that a host's disk cache lets them go first (``is_final``)."""


def is_final(last_step: LastStep | None) -> bool:
    """Whether ``last_step`` says its reads are the plan's last of what they read."""
    return bool(getattr(last_step, "final", False))


@dataclass(frozen=True)
class Footer:
    """A fragment's Parquet footer, and the first row of each of its row groups (then its
    row count)."""

    metadata: pq.FileMetaData
    starts: list[int]
    checked: set[int] = field(default_factory=set)
    """The leaves whose pages have been checked (``check_decoded``) in the file fetched
    whole: a decode of them from its bytes need not check them again."""
    spans: dict[str, range] | None = None
    """The leaves of each top-level column, once ``leaves`` has looked."""
    plains: dict[str, PlainValues | None] = field(default_factory=dict)
    """Per column read directly from the whole file, where its values lie (``plain``)."""
    pages: dict[int, list[FastPage]] = field(default_factory=dict)
    """Pages of the file's chunks as parsed when it was fetched whole, by chunk start."""

    @classmethod
    def of(cls, md: pq.FileMetaData) -> Footer:
        starts = [0]
        for i in range(md.num_row_groups):
            starts.append(starts[-1] + md.row_group(i).num_rows)
        return cls(md, starts)

    def leaves(self, columns: list[str] | None) -> list[int] | None:
        """The Parquet columns (leaves) holding the Arrow ``columns`` (None: all), in the
        order of ``columns``."""
        if columns is None:
            return None
        spans = self.spans
        if spans is None:
            at, spans = 0, {}
            for f in self.metadata.schema.to_arrow_schema():
                n = leaf_count(f.type)
                spans[f.name] = range(at, at + n)
                at += n
            object.__setattr__(self, "spans", spans)
        return [j for c in columns for j in spans.get(c, ())]

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
                 schema: pa.Schema | None = None, disk: DiskCache | None = None) -> None:
        self.store = store
        self.disk = disk
        """The host's disk cache that whole fragments are fetched through, if any."""
        self.schema = schema
        self._expected: dict[tuple[str, ...] | None,
                             tuple[list[str], list[pa.DataType], pa.Schema]] = {}
        self._footers: OrderedDict[tuple[str, int, int], Footer] = OrderedDict()
        self._opened: OrderedDict[tuple[str, int], tuple[pa.Buffer, ParquetReader]] = \
            OrderedDict()
        """Readers ``footer`` opened on whole fragments' bytes, each for the first decode of
        those bytes (a fragment of a few rows spent a sixth of its read opening one)."""
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
        footer = self.footer(path, size, data, rows, crc32)
        if footer.starts[-1] < stop:
            raise CorruptLogError(f"fragment {path} cannot be read: it holds "
                                  f"{footer.starts[-1]} rows, the log says at least {stop}")
        groups = footer.groups(start, stop)
        table = self.decode(path, size, data, footer, groups, columns)
        return table.slice(start - footer.starts[groups[0]], stop - start)

    def fetch(self, path: str, size: int, crc32: int, *, final: bool = False) -> pa.Buffer:
        """The whole file at ``path``, checked against the size and CRC-32 the log recorded
        (for a fragment ``fetched_whole``); through the disk cache, where there is one,
        marked there as read for the last time if ``final``.

        Raises:
            NotFoundError: the file is gone.
            CorruptLogError: it differs from what the log recorded.
        """
        def check(data: Any) -> None:
            n = memoryview(data).nbytes
            found = zlib_ng.crc32(data)
            if n != size or found != crc32:
                raise ValueError(f"{n} bytes with CRC-32 {found}, the log recorded "
                                 f"{size} bytes with {crc32}: the file is damaged")

        with _corrupt(path):
            if self.disk is not None:
                data = self.disk.fetch(self.store.uri, path, size, crc32,
                                       lambda: self.store.get_buffer(path, size), check,
                                       final=final)
            else:
                data = self.store.get_buffer(path, size)
                check(data)
        return pa.py_buffer(data)

    def cached_footer(self, path: str, size: int, crc32: int) -> Footer | None:
        """The footer of the file the log names ``path`` of ``size`` bytes and CRC-32
        ``crc32``, if this reader holds it (checked when it was read). Keyed by all three:
        two entries that name one path with other sizes are two files to a reader."""
        with self._lock:
            return self._footers.get((path, size, crc32))

    def footer(self, path: str, size: int, data: pa.Buffer | None, rows: int | None,
               crc32: int = -1) -> Footer:
        """The footer of the fragment at ``path`` (of ``data`` if fetched whole, else read by
        range), checked against the ``rows`` the log says it holds.

        Raises:
            NotFoundError: the file is gone.
            CorruptLogError: it is not readable Parquet, or holds other rows than the log
                says.
        """
        footer = self.cached_footer(path, size, crc32)
        with _corrupt(path):
            if footer is None:
                if data is not None:
                    opened = _reader(pa.BufferReader(data), None, False)
                    md = opened.metadata
                    thrift = footer_bytes(memoryview(data), size)
                else:
                    with self.store.open_input(path, size) as f:
                        at, got = read_tail(f, size)
                    tail = Spans(size)  # pyarrow reads the footer from what was read
                    tail.add(at, got)
                    md = _reader(tail, None, False).metadata
                    thrift = footer_bytes(memoryview(got), size)
                check_footer(md, thrift)
                footer = Footer.of(md)
                with self._lock:
                    self._footers[(path, size, crc32)] = footer
                    while len(self._footers) > self._cache_size:
                        self._footers.popitem(last=False)
                    if data is not None and size <= OPENED_BYTES:  # for its decode
                        self._opened[(path, size)] = (data, opened)
                        while len(self._opened) > OPENED:
                            self._opened.popitem(last=False)
            if rows is not None and footer.starts[-1] != rows:
                raise ValueError(f"holds {footer.starts[-1]} rows, the log says {rows}")
        return footer

    def decode(self, path: str, size: int, data: pa.Buffer | None, footer: Footer,
               groups: Sequence[int], columns: list[str] | None) -> pa.Table:
        """Row groups ``groups`` of the fragment at ``path`` (of ``data`` if fetched whole and
        checked by ``footer``; else their column chunks are fetched by range, one GET a row
        group, and their pages checked first), checked against the stream's schema.

        Raises:
            NotFoundError: the file is gone.
            CorruptLogError: a page fails its checksum or cannot be decoded, the chunks would
                decode to more than their rows may, or the schema is not the stream's.
        """
        with _corrupt(path):
            leaves = footer.leaves(columns)
            if data is not None:
                self._check_pages(footer, data, leaves)
                source: Any = pa.BufferReader(data)
            else:
                source = self._fetch_groups(path, size, footer, groups, columns)
            # Parquet's page checksums (slow) are checked only where the CRC-32 was not.
            with self._lock:
                opened = self._opened.pop((path, size), None)
            reader = opened[1] if opened is not None and opened[0] is data else \
                _reader(source, footer.metadata, data is None)
            table = reader.read_row_groups(list(groups), column_indices=leaves,
                                           use_threads=False)
            return self._check_schema(table, columns)

    def plain(self, path: str, footer: Footer, data: pa.Buffer, column: str,
              direct: Direct) -> PlainValues | None:
        """Where the values of column ``column``, read as ``direct`` says, lie in ``data``,
        the fragment at ``path`` fetched whole, if they lie plainly
        (``lakestream.read.tensors.plain_values``), kept with the footer. Nothing is decoded:
        ``plain_values`` checks that each of the column's pages holds exactly its rows'
        values, which are then copied into arrays the caller sized by the rows, so the
        bound ``check_decoded`` keeps on a decode holds without it.

        Raises:
            CorruptLogError: a page header is damaged.
        """
        with _corrupt(path):
            if column not in footer.plains:
                leaves = footer.leaves([column]) or []
                footer.plains[column] = plain_values(data, footer.metadata, leaves[0],
                                                     direct, footer.pages) \
                    if len(leaves) == 1 else None
            return footer.plains[column]

    @staticmethod
    def _check_pages(footer: Footer, data: pa.Buffer, leaves: list[int] | None) -> None:
        """The pages of ``leaves`` (None: all) in a fragment fetched whole checked
        (``check_decoded``), each leaf once."""
        md = footer.metadata
        todo = [j for j in (range(md.num_columns) if leaves is None else leaves)
                if j not in footer.checked]
        if todo:
            check_decoded(md, range(md.num_row_groups), memoryview(data).cast("B"),
                          leaves=todo, memo=footer.pages)
            footer.checked.update(todo)

    @property
    def schema_names(self) -> list[str] | None:
        """The stream's columns (None: not known)."""
        return None if self.schema is None else self.schema.names

    def _fetch_groups(self, path: str, size: int, footer: Footer, groups: Sequence[int],
                      columns: list[str] | None) -> Spans:
        """The column chunks of ``columns`` in row groups ``groups``, one ranged GET a row
        group, their pages checked (``check_decoded``), as a file Parquet can read them
        from."""
        md, leaves = footer.metadata, footer.leaves(columns)
        spans = Spans(size)
        for g in groups:
            ranges = [chunk_range(md, g, j) for j in
                      (range(md.num_columns) if leaves is None else leaves)]
            lo, hi = min(a for a, _ in ranges), max(b for _, b in ranges)
            if not 0 <= lo <= hi <= size:
                raise ValueError(f"row group {g} lies at bytes [{lo}, {hi}), past the file")
            data = self.store.get_range(path, lo, hi)
            check_decoded(md, [g], memoryview(data), lo, leaves)
            spans.add(lo, data)
        return spans

    def _check_schema(self, table: pa.Table, columns: list[str] | None) -> pa.Table:
        """What was decoded has the stream's columns and types (compared after decoding,
        which the footer's bound has kept small: building the file's Arrow schema from its
        footer to compare first cost a sixth of a small fragment's read)."""
        if self.schema is None:
            return table
        key = None if columns is None else tuple(columns)
        want = self._expected.get(key)
        if want is None:
            fields = self.schema if columns is None else [self.schema.field(c)
                                                          for c in columns]
            want = self._expected[key] = ([f.name for f in fields], [f.type for f in fields],
                                          pa.schema(fields))
        got = table.schema
        if got.names != want[0] or got.types != want[1]:
            raise ValueError(f"its schema is {_brief(got)}, the stream's is "
                             f"{_brief(self.schema)}")
        # The stream's fields, metadata included: a tensor column's shape and dtype are the
        # stream's, never what a fragment's footer says.
        return pa.Table.from_arrays(table.columns, schema=want[2])


class Spans(SeekableReader):
    """A file of which only some byte ranges were fetched, as Parquet reads it: a read
    outside them is an error, never a request."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self._starts: list[int] = []
        self._parts: list[bytes] = []

    def add(self, start: int, data: bytes) -> None:
        i = bisect.bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._parts.insert(i, data)

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        i = bisect.bisect_right(self._starts, self._pos) - 1
        if i < 0 or self._pos + n > self._starts[i] + len(self._parts[i]):
            raise OSError(f"a read of bytes [{self._pos}, {self._pos + n}) outside the row "
                          "groups fetched: the footer and the pages disagree")
        at = self._pos - self._starts[i]
        buffer[:n] = self._parts[i][at:at + n]
        self._pos += n
        return n


def _reader(source: Any, metadata: pq.FileMetaData | None, checksums: bool
            ) -> ParquetReader:
    """pyarrow's reader of ``source``, opened as ``pq.ParquetFile`` opens one, less what
    that adds for a reader of every kind (column paths by name, buffering ahead): a
    fragment is opened twice a read, and those were most of a small one's opening."""
    reader = ParquetReader()
    reader.open(source, metadata=metadata, pre_buffer=False,
                page_checksum_verification=checksums)
    return reader


def _brief(schema: pa.Schema) -> str:
    text = ", ".join(f"{f.name}: {f.type}" for f in schema)
    return text if len(text) <= 200 else text[:200] + "..."


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
