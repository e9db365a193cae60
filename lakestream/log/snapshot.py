"""Snapshots of the replay state: writing one, decoding one, and rebasing a state on the
newest (docs/design.md §4); opening from them is ``lakestream.log.opening``.

A snapshot is a small JSON manifest (the producers, markers and counters, and a CRC-32) that
names the index segments holding its live fragments, each with its version range, offset
range, fragment count and checksum. Opening reads the manifest and no segment: a lookup
fetches the segments it needs (``lakestream.log.index``).

Segments are immutable Parquet files of at most ``SEGMENT_FRAGMENTS`` fragments, and a
segment's content is a function of its key, so any writer may write it:

- ``<lo>-<hi>-<reclaim>-<n>.parquet``: the fragments committed at versions ``(lo, hi]``,
  less those removed by reclaims up to version ``reclaim``, cut into runs of
  ``SEGMENT_FRAGMENTS``: run ``n``. A snapshot writes these for what was committed since
  the snapshot its writer's state came from, so writing one costs what was added since.
- ``<stem>~<reclaim>.parquet``: segment ``<stem>.parquet`` less the fragments removed by
  reclaims up to version ``reclaim``: a reclaim rewrites only the segments it shrank.

Format 2 manifests (segments without offset ranges) are still read: their segments are
fetched on open, as format 2 did, and the next snapshot rewrites them as format 3 segments.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from zlib_ng import zlib_ng

from lakestream.errors import (
    AlreadyExistsError,
    CorruptLogError,
    NotFoundError,
)
from lakestream.failpoints import failpoint
from lakestream.log.index import FragmentIndex, Part, check_part
from lakestream.log.manifest import (
    HINT_KEY,
    PARSE_ERRORS,
    SEGMENT_NAME,
    encode_manifest,
    manifest_json,
    manifest_row,
    overlaps,
    parse_manifest,
    read_manifest,
    snapshot_key,
    stored_parts,
)
from lakestream.log.replay import ReplayState
from lakestream.log.segments import (
    INDEX_DIR,
    SEGMENT_FRAGMENTS,
    Columns,
    SegmentError,
    encode_segment,
    fetch_segment,
    segment_fetcher,
    segment_key,
    shrunk_key,
)
from lakestream.log.threads import shared_pool
from lakestream.store.base import ObjectStore


def decode_snapshot(version: int, manifest: bytes, fetch: Callable[[str], bytes]) -> ReplayState:
    """Parses a snapshot from its manifest. The state's index fetches segments with
    ``fetch`` when a lookup needs them (a format 2 manifest's are fetched now).

    Raises:
        CorruptLogError: the manifest (or a format 2 segment) is missing, unreadable or
            inconsistent.
        StoreError: the store failed while fetching a segment (an outage, not damage).
    """
    key = snapshot_key(version)
    try:
        state, rows, fmt = parse_manifest(version, manifest)
        parts = stored_parts(rows) if fmt >= 3 else []
    except PARSE_ERRORS as e:
        raise CorruptLogError(f"snapshot {key} cannot be read: {e}") from None
    if fmt == 2:
        parts = _fetch_format2(key, rows, fetch)
        for a, b in zip(parts, parts[1:], strict=False):
            if overlaps(a.lo, a.hi, a.end, b.lo, b.hi, b.start):
                raise CorruptLogError(f"snapshot {key}: segments {a.key} and {b.key} overlap")
    if parts and (parts[-1].end > state.next_offset or parts[-1].hi > version):
        raise CorruptLogError(f"snapshot {key}: segment {parts[-1].key} reaches past the "
                              "snapshot")
    state.index = FragmentIndex(parts, fetch)
    return state


def _fetch_format2(key: str, rows: list[list[Any]], fetch: Callable[[str], bytes]) -> list[Part]:
    """A format 2 snapshot's segments, fetched (in parallel when there are several)."""

    def load(row: list[Any]) -> Part:
        seg_key, lo, hi, count, crc = str(row[0]), int(row[1]), int(row[2]), int(row[3]), \
            int(row[4])
        if not (seg_key.startswith(INDEX_DIR)
                and SEGMENT_NAME.fullmatch(seg_key[len(INDEX_DIR):])):
            raise CorruptLogError(f"snapshot {key} names segment {ascii(seg_key)[:200]}, "
                                  "which is not a segment's name")
        cols = fetch_segment(fetch, seg_key, crc)
        check_part(Part(lo, hi, cols.start, cols.end, count, seg_key, crc), cols)
        # Held in memory, unnamed: the next snapshot cuts it into format 3 segments (a
        # format 2 block could hold half the stream).
        return Part(lo, hi, cols.start, cols.end, count, cols=cols)

    try:
        rows = [list(r) for r in rows]
    except PARSE_ERRORS as e:
        raise CorruptLogError(f"snapshot {key} cannot be read: {e}") from None
    parts = list(shared_pool().map(load, rows)) if len(rows) > 1 else [load(r) for r in rows]
    return [p for p in parts if p.fragments]


def write_snapshot(store: ObjectStore, state: ReplayState) -> None:
    """Writes the snapshot of ``state``: segments for what the state holds only in memory
    and for stored segments a reclaim shrank (each only if absent), then the manifest, then
    points the hint at it. The state's index then names the new segments in place of what
    it held in memory (it keeps them in its cache)."""
    index = state.index
    newest_reclaim = state.reclaim_versions[-1] if state.reclaim_versions else 0
    parts: list[Part] = []
    run: list[Part] = []
    written: set[str] = set()

    def flush() -> None:
        if run:
            cols = Columns.concat([index.load(p) for p in run])
            lo, hi = run[0].lo, run[-1].hi
            reclaim = newest_reclaim if newest_reclaim > lo else 0
            for n, a in enumerate(range(0, len(cols), SEGMENT_FRAGMENTS)):
                piece = cols.slice(a, a + SEGMENT_FRAGMENTS)
                parts.append(_put_segment(store, index, segment_key(lo, hi, reclaim, n), lo, hi,
                                          piece))
                written.add(parts[-1].key or "")
            run.clear()

    for p in index.parts:
        if p.exact:
            flush()
            parts.append(p)
        elif p.key is None:
            run.append(p)
        else:  # stored, and a reclaim may have shrunk it
            flush()
            cols = index.load(p)
            if len(cols) == p.fragments:
                parts.append(p._replace(pending=()))  # it did not
            elif len(cols):
                parts.append(_put_segment(store, index, shrunk_key(p.key, p.pending[-1].version),
                                          p.lo, p.hi, cols))
                written.add(parts[-1].key or "")
    flush()
    parts = _still_stored(store, index, parts, written)
    try:
        store.put(snapshot_key(state.version),
                  encode_manifest(state, [manifest_row(p) for p in parts]), mode="create")
        ours = True
    except AlreadyExistsError:
        ours = False  # another writer's: name its segments, which gc keeps, not ours
    failpoint("during_snapshot")
    store.put(HINT_KEY, json.dumps({"version": state.version}).encode(), mode="overwrite")
    if ours:
        # What it held in memory is in the store now.
        index.fetch = index.fetch or segment_fetcher(store)
        index.replace_parts(parts)
        index.removals = [r for r in index.removals if r.version > state.version]
    else:
        rebase(store, state)


def _still_stored(store: ObjectStore, index: FragmentIndex, parts: list[Part],
                  written: set[str]) -> list[Part]:
    """``parts``, each stored segment this writer did not just write checked to be there
    still (a HEAD each): a state names the segments of the manifest it was last rebased on,
    and gc deletes segments no remaining manifest names, so a writer idle across a gc would
    name one that is gone. One that is gone is put again from the columns the index holds;
    without them no manifest is written (readers open from an older one).

    Raises:
        SegmentError: a segment is gone and this writer does not hold its fragments.
    """
    named = [p for p in parts if p.key is not None and p.key not in written]

    def there(p: Part) -> bool:
        try:
            store.head(p.key or "")
            return True
        except NotFoundError:
            return False

    found = list(shared_pool().map(there, named)) if len(named) > 1 else \
        [there(p) for p in named]
    gone = {p.key for p, ok in zip(named, found, strict=True) if not ok}
    if not gone:
        return parts
    out = []
    for p in parts:
        if p.key in gone:
            cols = index.cached(p.key or "")
            if cols is None:
                raise SegmentError(f"index segment {p.key} this snapshot would name is gone "
                                   "(collected while this writer held its name): the snapshot "
                                   "is not written", p.key or "")
            p = _put_segment(store, index, p.key or "", p.lo, p.hi, cols)
        out.append(p)
    return out


def _put_segment(store: ObjectStore, index: FragmentIndex, key: str, lo: int, hi: int,
                 cols: Columns) -> Part:
    """Puts a segment if absent; returns it as a stored part, its columns cached."""
    data = encode_segment(cols)
    try:
        store.put(key, data, mode="create")
    except AlreadyExistsError:
        # Another writer's bytes (maybe another pyarrow's). Put them back as they are: a
        # fresh timestamp keeps gc from deleting them as unnamed before our manifest lands.
        try:
            data = segment_fetcher(store)(key)
            store.put(key, data, mode="overwrite")
        except NotFoundError:
            store.put(key, data, mode="create")
    index.remember(key, cols)
    return Part(lo, hi, cols.start, cols.end, len(cols), key, zlib_ng.crc32(data))


def rebase(store: ObjectStore, state: ReplayState) -> bool:
    """Swaps what ``state`` holds only in memory, and stored parts a reclaim shrank since,
    for the segments of the newest snapshot at or before its version: one GET of a manifest,
    no segment. Returns False if that manifest is not there (yet) to rebase on.

    Raises:
        StoreError: the store failed.
    """
    index = state.index
    interval = state.stream_meta.snapshot_interval
    version = state.version // interval * interval
    memory = [p for p in index.parts if p.key is None]
    stale = any(r.version <= version for p in index.parts for r in p.pending)
    if not (memory and version > memory[0].lo or stale):
        return True  # nothing a newer manifest would change
    try:
        _, rows, fmt = parse_manifest(version, read_manifest(store, version))
        stored = stored_parts(rows) if fmt >= 3 else None
    except NotFoundError:
        return False  # not written yet: its writer may still be at it
    except PARSE_ERRORS:
        return True  # damaged: keep what is in memory (opening falls back the same way)
    if stored is None:
        return True  # format 2: nothing to gain
    later = [r for r in index.removals if r.version > version]
    parts = []
    for p in stored:
        pending = tuple(r for r in later if r.paths and p.start < r.below)
        parts.append(p._replace(pending=pending) if pending else p)
    parts += [p for p in index.parts if p.lo >= version]
    index.fetch = index.fetch or segment_fetcher(store)
    index.replace_parts(parts)
    index.removals = later
    return True


def snapshot_segments(store: ObjectStore, version: int) -> list[str]:
    """The segment keys the snapshot of ``version`` names.

    Raises:
        NotFoundError: there is no such snapshot.
        CorruptLogError: its manifest cannot be read.
        StoreError: the store failed.
    """
    data = read_manifest(store, version)
    try:
        info = manifest_json(data)
        prefix = "" if info["format"] == 2 else INDEX_DIR  # format 2 rows hold whole keys
        return [prefix + str(s[0]) for s in info["segments"]]
    except PARSE_ERRORS as e:
        raise CorruptLogError(f"snapshot {snapshot_key(version)} cannot be read: {e}") from None
