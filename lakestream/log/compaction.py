"""Compacting the log (docs/design.md §7): entries nothing needs any more become tombstones,
tombstones past their TTL go, and so do snapshots, Delta checkpoints and index segments below
what readers start from; gc's report of what it did."""

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
from lakestream.log.entries import MAX_ENTRY_BYTES, TOMBSTONE_TTL_S, Compacted
from lakestream.log.keys import LOG_DIR, is_delta_checkpoint_key, log_key, log_version
from lakestream.log.manifest import SNAPSHOT_DIR, read_manifest, snapshot_key, snapshot_version
from lakestream.log.opening import read_version_pointer
from lakestream.log.replay import ReplayState
from lakestream.log.segments import INDEX_DIR, segment_fetcher
from lakestream.log.snapshot import decode_snapshot, snapshot_segments
from lakestream.log.tail import read_entry
from lakestream.store.base import ObjectMeta, ObjectStore

T = TypeVar("T")
COMPACTED_KEY = "_lakestream/_compacted"
"""``{"version": F}``: every log version below F is a tombstone (or, after its TTL, gone)."""
LAST_CHECKPOINT_KEY = "_delta_log/_last_checkpoint"


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
    forged: list[str] = field(default_factory=list)
    """Objects in the log's folder that no writer writes, deleted (one line each): a log
    entry past a gap (it was written when the version before it did not exist), a Delta
    checkpoint that is not Parquet or is of a version not committed yet. Other Delta
    readers refuse a table holding one."""
    skipped: list[str] = field(default_factory=list)
    """What gc could not handle and left (a key the store refuses, a folder that is a
    link, a failed listing, a Delta checkpoint deltalake failed to write), one line each:
    the rest was collected, and the log compacted where that was safe."""


def progress(items: list[T], label: str) -> Iterable[T]:
    """``items``, with a progress bar on a terminal (none in logs and pipes)."""
    return tqdm(items, desc=label, unit="file", disable=not sys.stderr.isatty(), leave=False)


def delete_or_skip(store: ObjectStore, key: str, report: GcReport) -> bool:
    """Deletes ``key``; a key the store refuses (a name it cannot address, a link on the
    way) is reported and skipped, so one odd file never stops gc."""
    try:
        store.delete(key)
        return True
    except (ValueError, StoreError, PermissionDeniedError) as e:
        report.skipped.append(f"{key!r}: {e}")
        return False


def compact(store: ObjectStore, state: ReplayState, now: float, cutoff: float,
             delta_checkpoint_version: int | None,
             report: GcReport) -> None:
    """Compacts log entries nothing needs any more into tombstones, deletes tombstones past
    their TTL, and deletes old snapshots, Delta checkpoints and index segments.

    A compacted entry is overwritten by a tombstone, never deleted: its version stays taken,
    so a handle whose view is older than the retained log cannot commit there (its
    put-if-absent fails and the tombstone tells it to reopen), and a reader there learns the
    same rather than taking the missing version for the head (docs/design.md §7).
    """
    sound = _sound_snapshots(store, state, cutoff, report)
    if not sound:
        return  # no snapshot a reader could open from: keep the whole log
    newest = sound[0]
    kept = _kept_from(store, state, sound, cutoff, delta_checkpoint_version)
    if kept is None:
        return
    keep_from, floor, pointer = kept
    live, expired, checkpoints = _listed(store, now, keep_from, floor)
    # In version order, up to the first entry still in its grace: the tombstones are then
    # every version below the new floor.
    compacted = floor
    for v, meta in progress(sorted(live), "gc log"):
        if meta.last_modified > cutoff:
            break
        failpoint("during_gc")
        if _tombstone(store, v, newest):
            report.log_entries += 1
        compacted = v + 1
    if compacted and compacted != pointer:
        try:
            store.put(COMPACTED_KEY, json.dumps({"version": compacted}).encode(),
                      mode="overwrite")
        except StoreError as e:  # a note for the next gc, which checks it all the same
            report.skipped.append(f"{COMPACTED_KEY}: {e}")
    for meta in expired:
        # Below the floor, only tombstones past their TTL go; an entry there that is none
        # (the floor was planted) is compacted now, never deleted unread.
        v = log_version(meta.key)
        if _read_commit_id(store, v) is _ALREADY:
            if delete_or_skip(store, meta.key, report):
                report.tombstones += 1
        elif meta.last_modified <= cutoff and _tombstone(store, v, newest):
            report.log_entries += 1
    _delete_older(store, keep_from, cutoff, checkpoints, report)


def _kept_from(store: ObjectStore, state: ReplayState, sound: list[int], cutoff: float,
               delta_checkpoint_version: int | None) -> tuple[int, int, int | None] | None:
    """The first version the log keeps whole, the floor below which an earlier gc left only
    tombstones, and the floor's pointer as stored (None if none); None where nothing may be
    compacted (no Delta checkpoint, or none that ``_last_checkpoint`` names).

    The newest sound snapshot is kept, and the one before it as a fallback should the newest
    be damaged; so is every entry from the Delta checkpoint readers start from, and every
    reclaim still in its grace (readers may still use it)."""
    keep_from = sound[1] if len(sound) > 1 else sound[0]
    if delta_checkpoint_version is None:
        return None  # without a Delta checkpoint, Delta readers need every entry
    # Delta readers start from the checkpoint _last_checkpoint names, which another gc or
    # another engine may have rewritten since ours: keep everything from it on.
    pointed = read_version_pointer(store, LAST_CHECKPOINT_KEY)
    if pointed is None:
        return None
    keep_from = min(keep_from, delta_checkpoint_version, pointed)
    # The floor is only a note of what an earlier gc compacted: never above what this one
    # keeps, and nothing below it is deleted unless it is read as a tombstone.
    pointer = read_version_pointer(store, COMPACTED_KEY)
    floor = min(pointer or 0, keep_from)
    for v in [v for v in state.reclaim_versions if floor <= v < keep_from]:
        try:
            if store.head(log_key(v)).last_modified > cutoff:
                keep_from = min(keep_from, v)  # a recent reclaim: readers may still use it
        except NotFoundError:
            continue
    return keep_from, floor, pointer


def _listed(store: ObjectStore, now: float, keep_from: int, floor: int
            ) -> tuple[list[tuple[int, ObjectMeta]], list[ObjectMeta], list[ObjectMeta]]:
    """The log folder sorted: the entries from the floor below ``keep_from`` (with their
    versions), the entries below the floor past the tombstones' TTL, and the Delta
    checkpoints below ``keep_from``."""
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
    return live, expired, checkpoints


def _delete_older(store: ObjectStore, keep_from: int, cutoff: float,
                  checkpoints: list[ObjectMeta], report: GcReport) -> None:
    """Deletes the Delta checkpoints and snapshots below ``keep_from`` past the grace, and
    the index segments no snapshot names."""
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


def _sound_snapshots(store: ObjectStore, state: ReplayState, cutoff: float,
                     report: GcReport) -> list[int]:
    """The newest two snapshots at or below the head that gc has decoded whole, manifest and
    segments, each of the log gc read (the digest it pins is that of the entry at its
    version), newest first. A manifest that is damaged (or of another log) and past the
    grace is deleted: nothing could open from it, and its version would stay taken.

    Raises:
        StoreError: listing the snapshots failed.
    """
    sound: list[int] = []
    versions = []
    for meta in store.list(SNAPSHOT_DIR):
        try:
            versions.append((snapshot_version(meta.key), meta))
        except ValueError:
            continue
    for version, meta in sorted(versions, key=lambda vm: vm[0], reverse=True):
        if len(sound) == 2:
            break
        if version > state.version:
            continue  # planted ahead of the log: no committer has reached it
        try:
            snapshot = decode_snapshot(version, read_manifest(store, version),
                                       segment_fetcher(store))
            for _cols in snapshot.index.columns():
                pass  # fetch and check every segment it names
            _check_pinned(store, snapshot)
        except NotFoundError:
            continue
        except CorruptLogError as e:
            if meta.last_modified <= cutoff and delete_or_skip(store, meta.key, report):
                report.forged.append(f"{meta.key}: {e}")
            continue
        except StoreError as e:  # a segment gc cannot read: nor could a reader
            report.skipped.append(f"{meta.key}: {e}")
            continue
        sound.append(version)
    return sound


def _check_pinned(store: ObjectStore, snapshot: ReplayState) -> None:
    """Raises CorruptLogError if the snapshot pins a digest that is not that of the entry at
    its version (a manifest from before the chain pins none)."""
    if snapshot.digest is None:
        return
    entry = read_entry(store, snapshot.version)
    if entry.link is not None and entry.link.digest != snapshot.digest:
        raise CorruptLogError(f"snapshot {snapshot_key(snapshot.version)} pins digest "
                              f"{snapshot.digest}, the entry at its version is "
                              f"{entry.link.digest}: it is not a snapshot of this log")


def _tombstone(store: ObjectStore, version: int, snapshot: int) -> bool:
    """Overwrites the entry at ``version`` with a tombstone naming ``snapshot`` and the
    replaced entry's commit id; False if a tombstone is there already (another gc's)."""
    replaced = _read_commit_id(store, version)
    if replaced is _ALREADY:
        return False
    store.put(log_key(version), encode_entry(Compacted(snapshot, replaced)), mode="overwrite")
    return True


_ALREADY = "\0tombstone"


def _read_commit_id(store: ObjectStore, version: int) -> str | None:
    """The commit id of the entry at ``version`` (``_commit_id``), None if there is none."""
    try:
        data = store.get(log_key(version), max_bytes=MAX_ENTRY_BYTES)
    except NotFoundError:
        data = b""  # deleted by a gc from before tombstones: take the version all the same
    except TooLargeError:
        data = b""  # not an entry this lakestream wrote: replaced all the same
    return _commit_id(data)


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


def _sweep_index(store: ObjectStore, cutoff: float, report: GcReport) -> None:
    """Deletes index segments that no remaining snapshot names (blocks merged into larger
    ones, or superseded after a reclaim). Unless every manifest is readable, keeps them all.
    The manifests are listed again after the segments, so a manifest that landed meanwhile
    (naming a segment its writer checked was there) keeps what it names."""
    named = _named_segments(store)
    if named is None:
        return
    candidates = [meta for meta in store.list(INDEX_DIR)
                  if meta.key not in named and meta.last_modified <= cutoff]
    if not candidates:
        return
    again = _named_segments(store)
    if again is None:
        return
    for meta in candidates:
        if meta.key not in again and delete_or_skip(store, meta.key, report):
            report.index_segments += 1


def _named_segments(store: ObjectStore) -> set[str] | None:
    """The segments the snapshots in the store name; None if a manifest is unreadable."""
    named: set[str] = set()
    for meta in store.list(SNAPSHOT_DIR):
        try:
            named.update(snapshot_segments(store, snapshot_version(meta.key)))
        except (ValueError, NotFoundError):
            continue
        except CorruptLogError:
            return None
    return named
