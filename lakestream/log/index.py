"""The fragment index: the live fragments in offset order, as columns, in parts that are
either in memory or an immutable index segment in the store (``lakestream.log.segments``),
fetched only when a lookup needs offsets in it (docs/design.md §4).

A stored or looked-up part is numpy columns and an Arrow array of paths, and a ``Fragment``
is made only for what a lookup returns; what an entry carried stays as its records until the
next snapshot or rebase. Parts are immutable, so copying an index (every commit forks the
replay state) copies a list of parts, not fragments.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from lakestream.errors import CorruptLogError
from lakestream.log.entries import FragmentRef
from lakestream.log.segments import (
    Columns,
    Fetch,
    Fragment,
    SegmentError,
    check_order,
    fetch_segment,
)

SMALL_REFS = 8
"""An in-memory part of at most this many fragments is searched as records (``between``)."""
CACHED_SEGMENTS = 32
"""Decoded segments an index (and its copies) keeps, least recently used dropped first."""


@dataclass(frozen=True)
class Removal:
    """A reclaim: the live fragments it removed, all of them below ``below`` (log version
    ``version``), by path and offset (``keys``), or by path alone (``paths``, a reclaim
    from before the split: ``keys`` None)."""

    version: int
    below: int
    paths: frozenset[str]
    keys: frozenset[tuple[str, int]] | None = None

    def apply(self, cols: Columns, where: str) -> Columns:
        if not len(cols) or not self.paths:
            return cols
        if self.keys is None:
            gone = np.fromiter((p in self.paths for p in cols.paths.to_pylist()), bool,
                               len(cols))
        else:
            keys = self.keys
            gone = np.fromiter(((p, o) in keys for p, o in zip(cols.paths.to_pylist(),
                                                                cols.offset.tolist(),
                                                                strict=True)),
                               bool, len(cols))
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

    def cached(self, key: str) -> Columns | None:
        """A segment's columns if this index holds them (fetched or written)."""
        return self._cache.get(key)

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
            if isinstance(part.cols, Refs) and len(part.cols.refs) <= SMALL_REFS:
                # An append's few fragments, in memory: read from its records rather than
                # made into columns (most appends are read once, by the step after them).
                out.extend(Fragment(f.offset, f.rows, f.path, f.size, part.cols.version,
                                    f.crc32) for f in part.cols.refs
                           if f.offset < hi and f.offset + f.rows > lo)
                continue
            cols = self.load(part)
            a = max(0, int(np.searchsorted(cols.offset, lo, side="right")) - 1)
            b = int(np.searchsorted(cols.offset, hi, side="left"))
            out.extend(cols.fragment(k) for k in range(a, b)
                       if cols.offset[k] + cols.rows[k] > lo)
        return out

    def below(self, offset: int, *, limit: int | None = None) -> list[Fragment]:
        """Live fragments wholly below ``offset``, in offset order (the first ``limit``)."""
        out: list[Fragment] = []
        for part in self.parts:
            if part.start >= offset or limit is not None and len(out) >= limit:
                break
            cols = self.load(part)
            n = int(np.searchsorted(cols.offset + cols.rows, offset, side="right"))
            if limit is not None:
                n = min(n, limit - len(out))
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
