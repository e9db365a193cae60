"""Fragments: encoding a table as one Parquet file, naming it, and reading rows back."""

from __future__ import annotations

import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from zlib_ng import zlib_ng

from lakestream.errors import AlreadyExistsError, CorruptLogError, NotFoundError
from lakestream.log.entries import DATA_DIR
from lakestream.log.segments import Fragment
from lakestream.plan.slices import plan_rows
from lakestream.store.base import ObjectStore

ROW_GROUP_TARGET_BYTES = 1 << 20
"""Row groups of about 1 MiB (decoded) let a rank slice read little of a large fragment."""
ENCODE_SLACK_BYTES, COLUMN_SLACK_BYTES = 64 << 10, 1 << 10
"""Room past an eighth over a table's Arrow size that its encoding is given, and more per
column (levels, page headers, the footer): a file that does not fit is encoded again into a
buffer that grows."""
WHOLE_FILE_BYTES = 8 << 20
"""Fragments up to this size are read whole, in one GET, and checked against their CRC-32;
larger ones are read by row group, their pages checked by Parquet's page checksums."""


ANONYMOUS = "_append"
"""The data folder of ``Stream.append`` (plain appends belong to no producer); no producer
id can clash with it, since ids start with a letter or digit."""
_KEY = re.compile(rf"{re.escape(DATA_DIR)}([^/]+)/([0-9]+)-([0-9]+)-[^/]*\.parquet")


def fragment_key(producer: str, epoch: int, seq: int) -> str:
    """``data/<producer>/<epoch>-<seq>-<uuid>.parquet``: unique even across zombies."""
    return f"{DATA_DIR}{producer}/{epoch}-{seq}-{uuid.uuid4().hex}.parquet"


def key_writer(key: str) -> tuple[str | None, int, int] | None:
    """``(producer, epoch, seq)`` of a fragment key that ``fragment_key`` made (producer
    None for ``Stream.append``'s), or None for a key of another shape."""
    m = _KEY.fullmatch(key)
    if m is None:
        return None
    producer = None if m.group(1) == ANONYMOUS else m.group(1)
    return producer, int(m.group(2)), int(m.group(3))


def put_fragment(store: ObjectStore, key: str, body: bytes | memoryview) -> None:
    """Creates the fragment at ``key`` (a key only this writer names, see ``fragment_key``).

    A 412 can only be our own earlier attempt, retried after its reply was lost: the object
    is ours, and the put succeeded.
    """
    try:
        store.put(key, body, mode="create")
    except AlreadyExistsError:
        pass


def _is_nested(t: pa.DataType) -> bool:
    return pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def encode_fragment(table: pa.Table, group_size: int, *, compression: str = "zstd",
                    compression_level: int | None = 1, nbytes: int | None = None) -> memoryview:
    """Parquet bytes for ``table``, with row groups aligned to ``group_size``: a view of
    Arrow's buffer, not a copy (stores, ``zlib_ng.crc32`` and files take it as it is).

    Dictionary encoding and statistics are kept for scalar columns (ids, rewards, versions
    repeat and are cheap to encode) and turned off for list and binary columns (tokens,
    log-probs, images), where they cost time and save little.

    Every byte stays checked on read: a fragment up to ``WHOLE_FILE_BYTES`` is read whole
    and checked against the CRC-32 its commit records, so only larger ones carry Parquet
    page checksums (their row groups are read alone). One that grows past the bound
    despite a small table is encoded again, with them.

    ``nbytes`` is ``table.nbytes`` when the caller has it: Arrow walks every column to
    compute it (about 14 µs for a 16-sample RL fragment, a third of its size check).
    """
    n = table.num_rows
    if nbytes is None:
        nbytes = table.nbytes
    per_row = max(1, nbytes // max(1, n))
    rows = max(group_size, (ROW_GROUP_TARGET_BYTES // per_row) // group_size * group_size)
    scalar = [f.name for f in table.schema if not _is_nested(f.type)]
    checksums = nbytes > WHOLE_FILE_BYTES // 2
    level = compression_level if compression != "none" else None
    room = nbytes + nbytes // 8 + ENCODE_SLACK_BYTES + COLUMN_SLACK_BYTES * table.num_columns
    while True:
        body = _write_parquet(table, room, row_group_size=rows, compression=compression,
                              compression_level=level, use_dictionary=scalar,
                              write_statistics=scalar, write_page_checksum=checksums)
        if checksums or len(body) <= WHOLE_FILE_BYTES:
            return body
        checksums = True


def _write_parquet(table: pa.Table, capacity: int, **options: Any) -> memoryview:
    """``pq.write_table`` into a buffer of ``capacity`` bytes allocated once; into one that
    grows (by doubling, each time copying what it holds) only if the file is larger."""
    buffer = pa.allocate_buffer(capacity)
    sink = pa.FixedSizeBufferWriter(buffer)
    try:
        pq.write_table(table, sink, **options)
    except OSError:  # past the end of the buffer (a codec's failure raises again below)
        grown = pa.BufferOutputStream()
        pq.write_table(table, grown, **options)
        return memoryview(grown.getvalue()).cast("B")
    return memoryview(buffer.slice(0, sink.tell())).cast("B")


class FragmentCache:
    """Decoded fragments, least recently used first out, bounded in bytes, shared by the
    threads of a reader: a fragment that several of them ask for at once is decoded once.

    A shuffled reader's windows are generations: each read of a step is wrapped in
    ``begin(g)`` / ``end(g)`` with its window g. When a read ends, a table is dropped if it
    was last used before both the latest generation begun and every generation still being
    read: once the next window is read and no read of the one before is in flight, the one
    before is done with. (Keeping it until the window after held twice the memory, and the
    allocator handed its pages back to have the kernel zero them again: ``bench/mixing.py``.)
    A reader whose windows of steps do not line up with its sources' windows keeps one
    generation more (``end(g, keep=1)``): a source window then spans two of its windows."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._generation = 0
        self._active: dict[int, int] = {}
        self._used: dict[tuple[str, str], int] = {}
        self._tables: OrderedDict[tuple[str, str], pa.Table] = OrderedDict()
        self._loading: dict[tuple[str, str], Future[pa.Table]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.decoded = 0
        """Fragments decoded through the cache (misses)."""

    def fetch(self, key: tuple[str, str], load: Callable[[], pa.Table]) -> pa.Table:
        """The table cached under ``key``, else ``load()``'s (once, whoever asks)."""
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
                self._used[key] = self._generation
                return table
            pending = self._loading.get(key)
            if pending is None:
                pending = self._loading[key] = Future()
                mine = True
            else:
                mine = False
        if not mine:
            return pending.result()
        try:
            table = load()
        except BaseException as e:
            with self._lock:
                del self._loading[key]
            pending.set_exception(e)
            raise
        with self._lock:
            del self._loading[key]
            self.decoded += 1
            self._tables[key] = table
            self._used[key] = self._generation
            self._bytes += table.nbytes
            while self._bytes > self.max_bytes and len(self._tables) > 1:
                gone, old = self._tables.popitem(last=False)
                del self._used[gone]
                self._bytes -= old.nbytes
        pending.set_result(table)
        return table

    def begin(self, generation: int) -> None:
        """A read of a step of ``generation`` starts (entering it, if later)."""
        with self._lock:
            self._active[generation] = self._active.get(generation, 0) + 1
            self._generation = max(self._generation, generation)
            # Keep the generation before: its last reads may not have begun yet (a pool's
            # threads start the steps handed to them in any order).
            self._drop_before(min([self._generation - 1, *self._active]))

    def end(self, generation: int, keep: int = 0) -> None:
        """That read is over: drops what only reads of generations before both every one
        still being read and the ``keep`` before the latest begun used (``keep=1`` where a
        later step may still need what an earlier generation's read used: a shuffled
        source whose windows do not start where the reader's windows of steps do)."""
        with self._lock:
            left = self._active.pop(generation) - 1
            if left:
                self._active[generation] = left
            self._drop_before(min([self._generation - keep, *self._active]))

    def _drop_before(self, generation: int) -> None:
        for key in [k for k, g in self._used.items() if g < generation]:
            del self._used[key]
            self._bytes -= self._tables.pop(key).nbytes


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
            if 0 <= crc32 and size <= WHOLE_FILE_BYTES:
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
                pf = pq.ParquetFile(f, metadata=md, page_checksum_verification=True)
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
