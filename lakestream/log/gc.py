"""Garbage collection (docs/design.md §7): after a grace period, delete the files retention
reclaimed and uploads never committed, and compact old log entries into tombstones, old
snapshots and index segments away."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from tqdm import tqdm

from lakestream.errors import (
    CorruptLogError,
    NotFoundError,
    PermissionDeniedError,
    StoreError,
    TooLargeError,
)
from lakestream.failpoints import failpoint
from lakestream.log.codec import encode_entry
from lakestream.log.entries import (
    LOG_DIR,
    MAX_ENTRY_BYTES,
    TOMBSTONE_TTL_S,
    Compacted,
    Reclaim,
    is_delta_checkpoint_key,
    log_key,
    log_version,
)
from lakestream.log.fragments import key_writer
from lakestream.log.inventory import unreferenced
from lakestream.log.opening import read_version_pointer
from lakestream.log.replay import ReplayState
from lakestream.log.segments import INDEX_DIR
from lakestream.log.snapshot import SNAPSHOT_DIR, snapshot_key, snapshot_segments, snapshot_version
from lakestream.log.tail import read_entry
from lakestream.log.view import LogView
from lakestream.store.base import ObjectMeta, ObjectStore

T = TypeVar("T")
IN_FLIGHT_MIN_AGE_S = 86_400.0
"""Uploads a live producer may still commit (``_in_flight``) are kept at least this long
whatever the grace: a grace shorter than a commit takes must not delete what the commit is
about to name. A producer instance that crashed with such uploads leaves them until it
restarts (its new epoch makes them deletable after the grace) or this age passes."""
CLOCK_KEY = "_lakestream/_clock"
COMPACTED_KEY = "_lakestream/_compacted"
"""``{"version": F}``: every log version below F is a tombstone (or, after its TTL, gone)."""
LAST_CHECKPOINT_KEY = "_delta_log/_last_checkpoint"


def store_now(store: ObjectStore) -> float:
    """The store's own clock: the timestamp it gives an object written now."""
    store.put(CLOCK_KEY, b"", mode="overwrite")
    return store.head(CLOCK_KEY).last_modified


@dataclass
class GcReport:
    """What one gc run deleted (and what it kept for the grace period)."""

    data_files: int = 0
    data_bytes: int = 0
    log_entries: int = 0
    """Log entries compacted: replaced by tombstones."""
    tombstones: int = 0
    """Tombstones deleted once older than ``TOMBSTONE_TTL_S``."""
    delta_checkpoints: int = 0
    snapshots: int = 0
    index_segments: int = 0
    temp_files: int = 0
    kept_in_grace: int = 0
    skipped: list[str] = field(default_factory=list)
    """What gc could not handle and left (a key the store refuses, a folder that is a
    link, a failed listing), one line each: the rest was collected, the log compacted."""


def _protected_by_recent_reclaims(store: ObjectStore, state: ReplayState,
                                  cutoff: float) -> set[str]:
    """Paths removed by reclaim entries committed after ``cutoff`` (store time): readers
    with an older view may still read them during the grace period."""
    paths: set[str] = set()
    for v in reversed(state.reclaim_versions):
        try:
            if store.head(log_key(v)).last_modified <= cutoff:
                break
            entry = read_entry(store, v)
        except NotFoundError:
            break
        if isinstance(entry, Reclaim):
            paths |= {f.path for f in entry.removed}
    return paths


def _progress(items: list[T], label: str) -> Iterable[T]:
    """``items``, with a progress bar on a terminal (none in logs and pipes)."""
    return tqdm(items, desc=label, unit="file", disable=not sys.stderr.isatty(), leave=False)


def collect(store: ObjectStore, state: ReplayState, grace_seconds: float,
            delta_checkpoint_version: int | None, *, seen_at: float | None = None) -> GcReport:
    """Deletes, after ``grace_seconds`` by the store's clock: data files no live fragment
    references (reclaimed, void, or uploaded and never committed), temp files of killed
    local writers, and log entries and snapshots older than both the newest snapshot and
    the newest Delta checkpoint (so Lakestream and Delta readers still open the table).

    Uploads a live producer may still commit are kept for ``IN_FLIGHT_MIN_AGE_S`` at least.
    ``seen_at`` is the store's time before ``state`` was read (default: now).

    Idempotent and safe to kill at any point: it only deletes what nothing needs.
    """
    if grace_seconds < 0:
        raise ValueError(f"grace_seconds must be >= 0, got {grace_seconds}")
    report = GcReport()
    now = store_now(store)
    cutoff = now - grace_seconds
    protected = _protected_by_recent_reclaims(store, state, cutoff)
    doomed = []
    in_flight_cutoff = now - max(grace_seconds, IN_FLIGHT_MIN_AGE_S)
    try:
        for meta in unreferenced(store, state):
            in_flight = _in_flight(state, meta, now if seen_at is None else seen_at)
            old = meta.last_modified <= (in_flight_cutoff if in_flight else cutoff)
            if old and meta.key not in protected:
                doomed.append(meta)
            else:
                report.kept_in_grace += 1
    except StoreError as e:  # e.g. data/ made a link out of the stream: compact all the same
        report.skipped.append(f"data files: {e}")
    for meta in _progress(doomed, "gc data"):
        failpoint("during_gc")
        if _delete(store, meta.key, report):
            report.data_files += 1
            report.data_bytes += meta.size
    list_temp = getattr(store, "list_temp", None)
    if list_temp is not None:
        try:
            for meta in list_temp(""):
                if meta.last_modified <= cutoff and _delete(store, meta.key, report):
                    report.temp_files += 1
        except StoreError as e:
            report.skipped.append(f"temp files: {e}")
    _compact(store, state, now, cutoff, delta_checkpoint_version, report)
    return report


def gc_stream(view: LogView, grace_seconds: float, *, delta_checkpoint: bool = True,
              storage_options: dict[str, str] | None = None) -> GcReport:
    """What ``Stream.gc`` does: reads the store's clock, then the log's head, writes a Delta
    checkpoint (with ``delta_checkpoint`` and deltalake installed: other engines open the
    table fast, and old entries may go), then ``collect``s on the state read."""
    seen_at = store_now(view.store)  # before the state gc works from is read
    view.refresh()
    version = _write_delta_checkpoint(view.uri, storage_options) if delta_checkpoint else None
    return collect(view.store, view.state, grace_seconds, version, seen_at=seen_at)


def _write_delta_checkpoint(uri: str, storage_options: dict[str, str] | None) -> int | None:
    try:
        import deltalake
    except ImportError:
        return None
    table = deltalake.DeltaTable(uri, storage_options=storage_options)
    table.create_checkpoint()
    return int(table.version())


def _in_flight(state: ReplayState, meta: ObjectMeta, seen_at: float) -> bool:
    """Whether ``meta`` may be an upload its producer has yet to commit: the producer's
    current (or a newer) epoch, a seq past the last it committed. Files of a fenced epoch,
    or with a seq already committed, can never be committed (replay voids them), so only
    the grace protects them; ``Stream.append`` commits in the call that uploads. A producer
    the state does not know fenced after ``seen_at`` (store time, before the state was
    read): its files are in flight unless they are older than that (foreign files)."""
    writer = key_writer(meta.key)
    if writer is None:
        return False
    producer, epoch, seq = writer
    if producer is None:
        return False
    p = state.producers.get(producer)
    if p is None:
        return meta.last_modified > seen_at
    return epoch >= p.epoch and seq > p.seq


def _delete(store: ObjectStore, key: str, report: GcReport) -> bool:
    """Deletes ``key``; a key the store refuses (a name it cannot address, a link on the
    way) is reported and skipped, so one odd file never stops gc."""
    try:
        store.delete(key)
        return True
    except (ValueError, StoreError, PermissionDeniedError) as e:
        report.skipped.append(f"{key!r}: {e}")
        return False


def _compact(store: ObjectStore, state: ReplayState, now: float, cutoff: float,
             delta_checkpoint_version: int | None,
             report: GcReport) -> None:
    """Compacts log entries nothing needs any more into tombstones, deletes tombstones past
    their TTL, and deletes old snapshots, Delta checkpoints and index segments.

    A compacted entry is overwritten by a tombstone, never deleted: its version stays taken,
    so a handle whose view is older than the retained log cannot commit there (its
    put-if-absent fails and the tombstone tells it to reopen), and a reader there learns the
    same rather than taking the missing version for the head (docs/design.md §7).
    """
    interval = state.stream_meta.snapshot_interval
    newest = (state.version // interval) * interval
    try:
        store.head(snapshot_key(newest))
    except NotFoundError:
        return  # the snapshot a reader would open from is missing: keep the whole log
    # Keep the previous snapshot too, as a fallback should the newest be damaged.
    keep_from = max(0, newest - interval)
    if delta_checkpoint_version is None:
        return  # without a Delta checkpoint, Delta readers need every entry
    # Delta readers start from the checkpoint _last_checkpoint names, which another gc or
    # another engine may have rewritten since ours: keep everything from it on.
    pointed = _last_delta_checkpoint(store)
    if pointed is None:
        return
    keep_from = min(keep_from, delta_checkpoint_version, pointed)
    floor = read_version_pointer(store, COMPACTED_KEY) or 0
    for v in [v for v in state.reclaim_versions if floor <= v < keep_from]:
        try:
            if store.head(log_key(v)).last_modified > cutoff:
                keep_from = min(keep_from, v)  # a recent reclaim: readers may still use it
        except NotFoundError:
            continue
    live: list[tuple[int, ObjectMeta]] = []
    expired: list[ObjectMeta] = []
    checkpoints: list[ObjectMeta] = []
    for meta in store.list(LOG_DIR):
        checkpoint = is_delta_checkpoint_key(meta.key)
        if checkpoint is not None:
            # Delta readers start from _last_checkpoint, which names one at or after
            # keep_from: older checkpoints only pile up (one per gc).
            if checkpoint < keep_from:
                checkpoints.append(meta)
            continue
        try:
            v = log_version(meta.key)
        except ValueError:
            continue  # _last_checkpoint and whatever else other engines keep there
        if v < floor:
            if meta.last_modified <= now - TOMBSTONE_TTL_S:
                expired.append(meta)
        elif v < keep_from:
            live.append((v, meta))
    # In version order, up to the first entry still in its grace: the tombstones are then
    # every version below the new floor.
    compacted = floor
    for v, meta in _progress(sorted(live), "gc log"):
        if meta.last_modified > cutoff:
            break
        failpoint("during_gc")
        if _tombstone(store, v, newest):
            report.log_entries += 1
        compacted = v + 1
    if compacted > floor and compacted > (read_version_pointer(store, COMPACTED_KEY) or 0):
        store.put(COMPACTED_KEY, json.dumps({"version": compacted}).encode(), mode="overwrite")
    for meta in expired:
        store.delete(meta.key)
        report.tombstones += 1
    for meta in checkpoints:
        if meta.last_modified <= cutoff:
            store.delete(meta.key)
            report.delta_checkpoints += 1
    for meta in store.list(SNAPSHOT_DIR):
        try:
            v = snapshot_version(meta.key)
        except ValueError:
            continue
        if v < keep_from and meta.last_modified <= cutoff:
            store.delete(meta.key)
            report.snapshots += 1
    try:
        _sweep_index(store, cutoff, report)
    except StoreError as e:  # e.g. the index folder made a link out of the stream
        report.skipped.append(f"index segments: {e}")


def _tombstone(store: ObjectStore, version: int, snapshot: int) -> bool:
    """Overwrites the entry at ``version`` with a tombstone naming ``snapshot`` and the
    replaced entry's commit id; False if a tombstone is there already (another gc's)."""
    try:
        data = store.get(log_key(version), max_bytes=MAX_ENTRY_BYTES)
    except NotFoundError:
        data = b""  # deleted by a gc from before tombstones: take the version all the same
    except TooLargeError:
        data = b""  # not an entry this lakestream wrote: replaced all the same
    replaced = _commit_id(data)
    if replaced is _ALREADY:
        return False
    store.put(log_key(version), encode_entry(Compacted(snapshot, replaced)), mode="overwrite")
    return True


_ALREADY = "\0tombstone"


def _commit_id(data: bytes) -> str | None:
    """The commit id in an entry's first line (its commitInfo), ``_ALREADY`` if it is a
    tombstone, None if it cannot be read: the rest of the entry is not parsed."""
    try:
        info = json.loads(data[:data.index(b"\n")])["commitInfo"]["lakestream"]
        if info.get("op") == "compacted":
            return _ALREADY
        cid = info["commit_id"]
        return cid if isinstance(cid, str) else None
    except (ValueError, KeyError, TypeError):
        return None


def _last_delta_checkpoint(store: ObjectStore) -> int | None:
    """The version ``_delta_log/_last_checkpoint`` names, or None if it is missing or
    unreadable (then nothing of the Delta log may go)."""
    try:
        return read_version_pointer(store, LAST_CHECKPOINT_KEY)
    except StoreError:
        return None


def _sweep_index(store: ObjectStore, cutoff: float, report: GcReport) -> None:
    """Deletes index segments that no remaining snapshot names (blocks merged into larger
    ones, or superseded after a reclaim). Unless every manifest is readable, keeps them all."""
    named: set[str] = set()
    for meta in store.list(SNAPSHOT_DIR):
        try:
            named.update(snapshot_segments(store, snapshot_version(meta.key)))
        except (ValueError, NotFoundError):
            continue
        except CorruptLogError:
            return
    for meta in store.list(INDEX_DIR):
        if meta.key not in named and meta.last_modified <= cutoff \
                and _delete(store, meta.key, report):
            report.index_segments += 1

