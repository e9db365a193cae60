"""Creating a stream's log (version 0, once), and opening it: hint -> newest snapshot -> the
tail, in a number of requests that does not grow with the log (docs/design.md §4,
"Opening"); and the log alone, when a snapshot's index is damaged."""

from __future__ import annotations

import logging
from dataclasses import replace

from lakestream.errors import (
    AlreadyExistsError,
    CorruptLogError,
    LogCompactedError,
    NotFoundError,
    StoreError,
)
from lakestream.log.codec import encode_entry, entry_digest
from lakestream.log.entries import Create, Link, StreamMeta
from lakestream.log.keys import log_key
from lakestream.log.manifest import (
    HINT_KEY,
    SNAPSHOT_DIR,
    read_manifest,
    snapshot_key,
    snapshot_version,
)
from lakestream.log.put import put_log_entry
from lakestream.log.replay import ReplayState
from lakestream.log.segments import segment_fetcher
from lakestream.log.snapshot import decode_snapshot, write_snapshot
from lakestream.log.tail import read_tail
from lakestream.store.base import ObjectStore
from lakestream.store.parse import count, loads

log = logging.getLogger("lakestream")
MAX_POINTER_BYTES = 4096

def create_log(store: ObjectStore, uri: str, meta: StreamMeta) -> ReplayState:
    """Puts version 0, the stream's creation, and the snapshot after it; returns the state.
    A put whose reply was lost, retried onto its own object, counts as done.

    Raises:
        AlreadyExistsError: a stream already exists at ``uri``.
        StoreError: the store failed (and version 0 is not ours).
    """
    entry = Create(meta)
    data = encode_entry(entry)
    put = put_log_entry(store, 0, data, entry.commit_id)
    if not put.landed:
        if put.holder is None and put.failure is not None:
            raise put.failure  # version 0 may be ours or not: nothing to say more
        raise AlreadyExistsError(
            f"a stream already exists at {uri}; open it with lakestream.open") from None
    state = ReplayState()
    state.apply(0, replace(entry, link=Link(entry_digest(data), None, True)))
    write_snapshot(store, state)
    return state


def _exists(store: ObjectStore, key: str) -> bool:
    try:
        store.head(key)
        return True
    except NotFoundError:
        return False


def read_version_pointer(store: ObjectStore, key: str) -> int | None:
    """The version a pointer object (``{"version": v, ...}``, overwritten in place) names, or
    None if it is missing, torn, foreign or unreadable: a pointer is a hint, and whoever
    reads one does without it (the opener probes; gc keeps what it cannot prove it may
    delete). A store that fails here fails the next request too."""
    try:
        return count(loads(store.get(key, max_bytes=MAX_POINTER_BYTES))["version"], "version")
    except (NotFoundError, StoreError, ValueError, KeyError, TypeError):
        return None


def read_hint(store: ObjectStore) -> int | None:
    """The version the hint names, or None if it is unusable (a hint is only a hint: the
    opener probes instead)."""
    return read_version_pointer(store, HINT_KEY)


def _latest_snapshot(store: ObjectStore, known: int, interval: int) -> int:
    """The newest snapshot version at or after ``known`` (which exists), by exponential then
    binary search over multiples of ``interval`` with HEAD requests."""
    step, lo = interval, known
    while _exists(store, snapshot_key(lo + step)):
        lo, step = lo + step, step * 2
    hi = lo + step  # absent
    while hi - lo > interval:
        mid = lo + ((hi - lo) // interval // 2) * interval
        if _exists(store, snapshot_key(mid)):
            lo = mid
        else:
            hi = mid
    return lo


def load_state(store: ObjectStore, uri: str, *, start: int | None = None) -> ReplayState:
    """Opens the stream's state: hint -> newest snapshot -> the tail of the log.

    A missing or stale hint costs a few HEADs (exponential, then binary search over snapshot
    versions); a corrupt snapshot falls back to an older one plus replay. ``start`` names a
    snapshot to probe from instead of the hint's (a tombstone's: the hint may be older). A
    tail that runs into gc's tombstones (the snapshot found was older than the retained log)
    is read again from the snapshot the tombstone names, or else from the newest listed.

    Raises:
        NotFoundError: no stream exists at ``uri``.
        CorruptLogError: a log entry, or every snapshot and the log itself, is unreadable.
    """
    errors: list[str] = []
    listed = False
    for _ in range(3):
        state = _newest_snapshot(store, errors, start, listed)
        if state is None:
            if not _exists(store, log_key(0)):
                if errors:
                    raise CorruptLogError(f"no readable snapshot of {uri}: {errors}")
                raise NotFoundError(f"no Lakestream stream at {uri} (no {log_key(0)}); "
                                    "create it")
            state = ReplayState()
        try:
            return read_tail(store, state)
        except LogCompactedError as e:
            errors.append(str(e))
            if start is not None and e.snapshot <= start:
                listed = True  # the tombstone's snapshot is no newer: list the snapshots
            start = e.snapshot
    raise CorruptLogError(f"{uri}: every snapshot found is older than the retained log: "
                          f"{errors}")


def replay_log(store: ObjectStore, damage: CorruptLogError) -> ReplayState:
    """The state from the log alone, no snapshot or segment read: what a reader falls back
    on when an index segment it needs is damaged (``damage``).

    Raises:
        CorruptLogError: ``damage``, if gc has compacted the log's start away.
    """
    if not _exists(store, log_key(0)):
        raise damage
    log.warning("%s; replaying the log of %s instead", damage, store.uri)
    try:
        return read_tail(store, ReplayState())
    except LogCompactedError:
        raise damage from None


def _newest_snapshot(store: ObjectStore, errors: list[str], start: int | None = None,
                     listed: bool = False) -> ReplayState | None:
    if not listed:
        start = read_hint(store) if start is None else max(start, read_hint(store) or 0)
        if start is None and _exists(store, snapshot_key(0)):
            start = 0
        if start is not None:
            try:
                known = decode_snapshot(start, read_manifest(store, start),
                                        segment_fetcher(store))
            except (NotFoundError, CorruptLogError) as e:
                errors.append(str(e))
            else:
                latest = _latest_snapshot(store, start, known.stream_meta.snapshot_interval)
                if latest == start:
                    return known
                try:
                    return decode_snapshot(latest, read_manifest(store, latest),
                                           segment_fetcher(store))
                except (NotFoundError, CorruptLogError) as e:
                    errors.append(str(e))
                    return known
    # The hint and its snapshot are unusable: list the (few, retained) snapshots instead.
    for key in sorted((m.key for m in store.list(SNAPSHOT_DIR)), reverse=True):
        try:
            version = snapshot_version(key)
            return decode_snapshot(version, read_manifest(store, version),
                                   segment_fetcher(store))
        except (ValueError, NotFoundError, CorruptLogError) as e:
            errors.append(str(e))
    return None
