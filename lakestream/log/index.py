"""The fragment index: the live fragments in offset order, as columns, in parts that are
either in memory or an immutable index segment in the store, fetched only when a lookup
needs offsets in it (docs/design.md §4).

A stored or looked-up part is numpy columns and an Arrow array of paths, and a ``Fragment``
is made only for what a lookup returns; what an entry carried stays as its records until the
next snapshot or rebase. Parts are immutable, so copying an index (every commit forks the
replay state) copies a list of parts, not fragments.
"""

from __future__ import annotations

import bisect
import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from zlib_ng import zlib_ng

from lakestream.errors import CorruptLogError, NotFoundError
from lakestream.log.entries import FragmentRef

FRAGMENT_SCHEMA = pa.schema([
    ("offset", pa.int64()), ("rows", pa.int64()), ("path", pa.string()),
    ("size", pa.int64()), ("version", pa.int64()), ("crc32", pa.int64()),
])
SEGMENT_FRAGMENTS = 8192
"""The most fragments a segment written by a snapshot holds: what a lookup fetches at most."""
CACHED_SEGMENTS = 32
"""Decoded segments an index (and its copies) keeps, least recently used dropped first."""
_INTS = ("offset", "rows", "size", "version", "crc32")


class SegmentError(CorruptLogError):
    """An index segment a lookup needs is missing or damaged. A newer snapshot, or the log
    it was made from while it is retained, still holds the truth: ``Stream`` reopens."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Fragment:
    """A live fragment: rows ``[offset, offset + rows)`` of the global order."""

    offset: int
    rows: int
    path: str
    size: int
    version: int
    crc32: int = -1

    @property
    def end(self) -> int:
        return self.offset + self.rows


@dataclass(frozen=True, eq=False)
class Columns:
    """Fragments in offset order, one numpy array per integer field and an Arrow array of
    paths."""

    offset: np.ndarray
    rows: np.ndarray
    size: np.ndarray
    version: np.ndarray
    crc32: np.ndarray
    paths: pa.Array

    def __len__(self) -> int:
        return len(self.offset)

    @property
    def start(self) -> int:
        return int(self.offset[0]) if len(self) else 0

    @property
    def end(self) -> int:
        return int(self.offset[-1] + self.rows[-1]) if len(self) else 0

    def fragment(self, i: int) -> Fragment:
        return Fragment(int(self.offset[i]), int(self.rows[i]), self.paths[i].as_py(),
                        int(self.size[i]), int(self.version[i]), int(self.crc32[i]))

    def fragments(self) -> list[Fragment]:
        paths = self.paths.to_pylist()
        return list(map(Fragment, self.offset.tolist(), self.rows.tolist(), paths,
                        self.size.tolist(), self.version.tolist(), self.crc32.tolist()))

    @classmethod
    def of(cls, ints: Sequence[np.ndarray], paths: pa.Array) -> Columns:
        """From the integer columns in ``_INTS`` order, and the paths."""
        offset, rows, size, version, crc32 = ints
        return cls(offset, rows, size, version, crc32, paths)

    def keep(self, mask: np.ndarray) -> Columns:
        return Columns.of([getattr(self, n)[mask] for n in _INTS],
                          self.paths.filter(pa.array(mask)))

    def slice(self, a: int, b: int) -> Columns:
        return Columns.of([getattr(self, n)[a:b] for n in _INTS], self.paths.slice(a, b - a))

    def table(self) -> pa.Table:
        return pa.Table.from_arrays(
            [pa.array(self.offset), pa.array(self.rows), self.paths, pa.array(self.size),
             pa.array(self.version), pa.array(self.crc32)], schema=FRAGMENT_SCHEMA)

    @classmethod
    def from_table(cls, table: pa.Table) -> Columns:
        if table.schema.names != FRAGMENT_SCHEMA.names:
            raise ValueError(f"columns {table.schema.names}, expected {FRAGMENT_SCHEMA.names}")
        ints = [table.column(n).to_numpy().astype(np.int64, copy=False) for n in _INTS]
        return cls.of(ints, table.column("path").combine_chunks().cast(pa.string()))

    @classmethod
    def from_refs(cls, version: int, refs: Sequence[FragmentRef]) -> Columns:
        return cls(np.fromiter((f.offset for f in refs), np.int64, len(refs)),
                   np.fromiter((f.rows for f in refs), np.int64, len(refs)),
                   np.fromiter((f.size for f in refs), np.int64, len(refs)),
                   np.full(len(refs), version, np.int64),
                   np.fromiter((f.crc32 for f in refs), np.int64, len(refs)),
                   pa.array([f.path for f in refs], pa.string()))

    @classmethod
    def from_fragments(cls, fragments: Sequence[Fragment]) -> Columns:
        n = len(fragments)
        return cls.of([np.fromiter((getattr(f, k) for f in fragments), np.int64, n)
                       for k in _INTS], pa.array([f.path for f in fragments], pa.string()))

    @classmethod
    def concat(cls, parts: Sequence[Columns]) -> Columns:
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.from_fragments([])
        return cls.of([np.concatenate([getattr(p, n) for p in parts]) for n in _INTS],
                      pa.concat_arrays([p.paths for p in parts]))


def encode_segment(cols: Columns) -> bytes:
    buf = io.BytesIO()
    pq.write_table(cols.table(), buf, compression="zstd", write_page_checksum=True)
    return buf.getvalue()


def decode_segment(data: bytes) -> Columns:
    """Raises ValueError, OSError or an ArrowException when the bytes are damaged."""
    return Columns.from_table(pq.read_table(io.BytesIO(data), page_checksum_verification=True))


@dataclass(frozen=True)
class Removal:
    """A reclaim: the files it removed, all of them below ``below`` (log version
    ``version``)."""

    version: int
    below: int
    paths: frozenset[str]

    def apply(self, cols: Columns, where: str) -> Columns:
        if not len(cols) or not self.paths:
            return cols
        gone = np.fromiter((p in self.paths for p in cols.paths.to_pylist()), bool, len(cols))
        if not gone.any():
            return cols
        past = gone & (cols.offset + cols.rows > self.below)
        if past.any():
            path = cols.paths[int(np.argmax(past))].as_py()
            raise CorruptLogError(f"log version {self.version} removes {path}, which holds "
                                  f"offsets past {self.below} ({where})")
        return cols.keep(~gone)


class Refs:
    """One append's fragments as its log entry holds them; their columns are made on first
    use. Replay makes one per append, and most are never looked up before a snapshot turns
    them into a segment: building numpy columns for each cost a contended producer a fifth
    of its throughput."""

    __slots__ = ("version", "refs", "_cols")

    def __init__(self, version: int, refs: Sequence[FragmentRef]) -> None:
        self.version, self.refs = version, refs
        self._cols: Columns | None = None

    def columns(self) -> Columns:
        if self._cols is None:  # idempotent: a race builds the same columns twice
            self._cols = Columns.from_refs(self.version, self.refs)
        return self._cols


class Part(NamedTuple):
    """A run of fragments committed at versions ``(lo, hi]``, offsets ``[start, end)``.

    In memory (``cols``), in the store as segment ``key`` (with ``crc`` and ``count``), or
    both. ``pending`` are reclaims that may remove some of the stored segment's fragments,
    applied when it is loaded; ``fragments`` and ``start`` are then upper and lower
    bounds. A
    tuple, not a dataclass: opening makes one per manifest row, and that is most of its time
    at a million fragments.
    """

    lo: int
    hi: int
    start: int
    end: int
    fragments: int
    key: str | None = None
    crc: int = 0
    cols: Columns | Refs | None = None
    pending: tuple[Removal, ...] = ()

    @property
    def exact(self) -> bool:
        """Whether ``key`` holds exactly this part's fragments."""
        return self.key is not None and not self.pending



Fetch = Callable[[str], bytes]


class _Cache:
    """Decoded segments by key, shared by an index and its copies; bounded, LRU."""

    def __init__(self, size: int = CACHED_SEGMENTS) -> None:
        self._size = size
        self._items: OrderedDict[str, Columns] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Columns | None:
        with self._lock:
            cols = self._items.get(key)
            if cols is not None:
                self._items.move_to_end(key)
            return cols

    def put(self, key: str, cols: Columns) -> None:
        with self._lock:
            self._items[key] = cols
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


class FragmentIndex:
    """The live fragments, in offset order, in parts. Lookups fetch (with ``fetch``) the
    stored parts they touch and nothing else."""

    def __init__(self, parts: Iterable[Part] = (), fetch: Fetch | None = None,
                 cache: _Cache | None = None) -> None:
        self.parts: list[Part] = list(parts)
        self._starts = [p.start for p in self.parts]
        self.fetch = fetch
        self._cache = cache or _Cache()
        self.removals: list[Removal] = []
        """Reclaims applied since the parts' segments were written (for ``rebase``)."""

    def copy(self) -> FragmentIndex:
        other = FragmentIndex(self.parts, self.fetch, self._cache)
        other.removals = list(self.removals)
        return other

    def remember(self, key: str, cols: Columns) -> None:
        """Caches a segment's columns (its writer has them: no need to fetch them back)."""
        self._cache.put(key, cols)

    # -- changes -----------------------------------------------------------------------

    def append(self, version: int, refs: Sequence[FragmentRef]) -> None:
        live = refs if all(f.rows for f in refs) else [f for f in refs if f.rows]
        if live:
            end = live[-1].offset + live[-1].rows
            self.parts.append(Part(version - 1, version, live[0].offset, end, len(live),
                                   cols=Refs(version, live)))
            self._starts.append(live[0].offset)

    def remove(self, removal: Removal) -> None:
        """Applies a reclaim to the parts that start below its point (no fragment at or past
        it can be removed: replay checks the entry's own offsets): in-memory parts at once,
        stored ones when loaded. Parts left empty are dropped.

        Raises:
            CorruptLogError: an in-memory fragment it removes holds offsets past the point
                (nothing is changed).
        """
        if not removal.paths:
            return
        cut = bisect.bisect_left(self._starts, removal.below)
        parts = []
        for p in self.parts[:cut]:
            if p.cols is not None:
                cols = removal.apply(self.load(p),
                                     f"fragments committed at versions ({p.lo}, {p.hi}]")
                if len(cols) == p.fragments:
                    parts.append(p)
                elif len(cols):
                    parts.append(Part(p.lo, p.hi, cols.start, cols.end, len(cols), cols=cols))
            else:
                parts.append(p._replace(pending=(*p.pending, removal)))
        self.parts = parts + self.parts[cut:]
        self._starts = [p.start for p in self.parts]
        self.removals.append(removal)

    def replace_parts(self, parts: Sequence[Part]) -> None:
        self.parts = list(parts)
        self._starts = [p.start for p in self.parts]

    # -- lookups -----------------------------------------------------------------------

    def load(self, part: Part) -> Columns:
        """The part's fragments, fetching its segment if it is not in memory.

        Raises:
            CorruptLogError: the segment is missing, damaged, or disagrees with the manifest.
            StoreError: the store failed.
        """
        if isinstance(part.cols, Columns):
            return part.cols
        if part.cols is not None:
            return part.cols.columns()
        assert part.key is not None
        cols = self._cache.get(part.key)
        if cols is None:
            cols = self._fetch(part)
            self._cache.put(part.key, cols)
        for removal in part.pending:
            cols = removal.apply(cols, f"segment {part.key}")
        return cols

    def _fetch(self, part: Part) -> Columns:
        assert part.key is not None
        if self.fetch is None:
            raise SegmentError(f"index segment {part.key} is not in memory and this index "
                               "has no store to fetch it from", part.key)
        cols = fetch_segment(self.fetch, part.key, part.crc)
        check_part(part, cols)
        return cols

    def between(self, lo: int, hi: int) -> list[Fragment]:
        """Live fragments overlapping offsets ``[lo, hi)``, in offset order."""
        out: list[Fragment] = []
        i = max(0, bisect.bisect_right(self._starts, lo) - 1)
        while i < len(self.parts) and self.parts[i].start < hi:
            part = self.parts[i]
            i += 1
            if part.end <= lo:
                continue
            cols = self.load(part)
            a = max(0, int(np.searchsorted(cols.offset, lo, side="right")) - 1)
            b = int(np.searchsorted(cols.offset, hi, side="left"))
            out.extend(cols.fragment(k) for k in range(a, b)
                       if cols.offset[k] + cols.rows[k] > lo)
        return out

    def below(self, offset: int) -> list[Fragment]:
        """Live fragments wholly below ``offset``, in offset order."""
        out: list[Fragment] = []
        for part in self.parts:
            if part.start >= offset:
                break
            cols = self.load(part)
            n = int(np.searchsorted(cols.offset + cols.rows, offset, side="right"))
            out.extend(cols.slice(0, n).fragments())
        return out

    def columns(self) -> Iterator[Columns]:
        """Every part's fragments, in offset order (fetching every stored part)."""
        for part in self.parts:
            yield self.load(part)

    def all(self) -> list[Fragment]:
        """Every live fragment, in offset order (fetching every stored part)."""
        return [f for cols in self.columns() for f in cols.fragments()]

    def count(self) -> int:
        """How many fragments are live (fetching only parts a reclaim may have shrunk)."""
        return sum(len(self.load(p)) if p.pending else p.fragments for p in self.parts)

    @property
    def in_memory(self) -> int:
        """Fragments held in memory only (not yet in a segment)."""
        return sum(p.fragments for p in self.parts if p.key is None)


def fetch_segment(fetch: Fetch, key: str, crc: int) -> Columns:
    """Segment ``key``, fetched and checked against the CRC-32 its manifest recorded.

    Raises:
        SegmentError: it is missing, damaged or unreadable.
        StoreError: the store failed.
    """
    try:
        data = fetch(key)
    except NotFoundError:
        raise SegmentError(f"index segment {key} is missing", key) from None
    found = zlib_ng.crc32(data)
    if found != crc:
        raise SegmentError(f"index segment {key} has CRC-32 {found}, the manifest recorded "
                           f"{crc}: it is damaged", key)
    try:
        return decode_segment(data)
    except (ValueError, OSError, pa.ArrowException) as e:
        raise SegmentError(f"index segment {key} cannot be read: {e}", key) from None


def check_part(part: Part, cols: Columns) -> None:
    """Raises CorruptLogError if a segment's content disagrees with what names it."""
    where = f"index segment {part.key}"
    if len(cols) != part.fragments:
        raise SegmentError(f"{where} holds {len(cols)} fragments, the manifest says "
                           f"{part.fragments}", part.key)
    if len(cols) and not (part.lo < int(cols.version.min()) and
                          int(cols.version.max()) <= part.hi):
        raise SegmentError(f"{where} holds fragments outside versions "
                           f"({part.lo}, {part.hi}]", part.key)
    if len(cols) and (cols.start != part.start or cols.end != part.end):
        raise SegmentError(f"{where} holds offsets [{cols.start}, {cols.end}), the "
                           f"manifest says [{part.start}, {part.end})", part.key)
    check_order(cols, where)


def check_order(cols: Columns, where: str) -> None:
    """Raises CorruptLogError unless fragments follow each other without overlap."""
    if len(cols) > 1 and bool(np.any(cols.offset[1:] < cols.offset[:-1] + cols.rows[:-1])):
        k = int(np.argmax(cols.offset[1:] < cols.offset[:-1] + cols.rows[:-1]))
        raise CorruptLogError(f"{where}: fragments {cols.paths[k].as_py()} and "
                              f"{cols.paths[k + 1].as_py()} overlap")
