"""Verifying a stream end to end: every log entry, snapshot and live fragment is read and
checked, as ``fsck`` does for a file system. Reading a stream checks what it reads; this
checks what nothing may read for a while (entries behind a snapshot, old snapshots)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from lakestream.errors import CorruptLogError, LogCompactedError, NotFoundError, TooLargeError
from lakestream.log.codec import decode_entry
from lakestream.log.entries import MAX_ENTRY_BYTES
from lakestream.log.keys import log_key
from lakestream.log.manifest import SNAPSHOT_DIR, read_manifest, snapshot_key, snapshot_version
from lakestream.log.replay import ReplayState
from lakestream.log.segments import segment_fetcher
from lakestream.log.snapshot import decode_snapshot
from lakestream.read.fragments import FragmentReader
from lakestream.store.base import ObjectStore


@dataclass
class VerifyReport:
    entries: int = 0
    snapshots: int = 0
    fragments: int = 0
    problems: list[str] = field(default_factory=list)
    """One line per damaged or inconsistent object, naming it. Empty: the stream is sound."""


def _snapshot_versions(store: ObjectStore) -> list[int]:
    out = []
    for meta in store.list(SNAPSHOT_DIR):
        try:
            out.append(snapshot_version(meta.key))
        except ValueError:
            continue
    return sorted(out)


def _oldest_snapshot(store: ObjectStore, snapshots: list[int], at_least: int,
                     report: VerifyReport) -> ReplayState | None:
    """The oldest readable snapshot at or after version ``at_least``; None if none is."""
    for v in snapshots:
        if v < at_least:
            continue
        try:
            return decode_snapshot(v, read_manifest(store, v), segment_fetcher(store))
        except (CorruptLogError, NotFoundError) as e:
            report.problems.append(str(e))
    report.problems.append(f"no readable snapshot at or after version {at_least} to start "
                           "replay from (the log before it is compacted)")
    return None


def _replay(store: ObjectStore, state: ReplayState, wanted: set[int],
            report: VerifyReport) -> bool:
    """Replays the log after ``state`` into it, comparing each snapshot in ``wanted``;
    False if it stopped at a damaged entry (nothing past it can be replayed).

    Raises:
        LogCompactedError: the log holds a tombstone after ``state``.
    """
    while True:
        v = state.version + 1
        try:
            data = store.get(log_key(v), max_bytes=MAX_ENTRY_BYTES)
            state.apply(v, decode_entry(v, data))
        except NotFoundError:
            return True
        except (CorruptLogError, TooLargeError) as e:
            report.problems.append(str(e) if isinstance(e, CorruptLogError)
                                   else f"log version {v} cannot be read: {e}")
            return False
        report.entries += 1
        if not strict_json(data):
            report.problems.append(
                f"log version {v} holds NaN or Infinity, which is not JSON: Delta readers "
                "(Spark, delta-rs, DuckDB) reject the entry; it was written before states "
                "were checked, and stays readable here")
        if v in wanted:
            report.snapshots += 1
            key = snapshot_key(v)
            try:
                snapshot = decode_snapshot(v, read_manifest(store, v), segment_fetcher(store))
                if _summary(snapshot) != _summary(state):
                    report.problems.append(f"snapshot {key} differs from the replay of the log")
            except (CorruptLogError, NotFoundError) as e:
                report.problems.append(str(e))


def strict_json(data: bytes) -> bool:
    """Whether every line of an entry is JSON (Python's json also reads NaN and Infinity)."""
    def refuse(token: str) -> None:
        raise ValueError(token)

    try:
        for line in data.split(b"\n"):
            if line.strip():
                json.loads(line, parse_constant=refuse)
    except ValueError:
        return False
    return True


def _summary(state: ReplayState) -> tuple[object, ...]:
    return (state.next_offset, state.reclaimed_below, state.all_fragments(),
            {k: (p.epoch, p.seq, p.state) for k, p in state.producers.items()},
            state.markers, state.registered, state.reclaim_versions, state.sealed_at)


def verify(store: ObjectStore) -> VerifyReport:
    """Replays the log from its oldest retained entry, checks every snapshot against that
    replay, and reads every live fragment whole against its recorded size and checksum.

    Raises:
        NotFoundError: there is no stream at all (no log version 0, no snapshot).
    """
    report = VerifyReport()
    snapshots = _snapshot_versions(store)
    state: ReplayState | None = ReplayState()
    try:
        store.head(log_key(0))
    except NotFoundError:
        if not snapshots:
            raise NotFoundError(f"no stream at {store.uri}: it has no log version 0 and no "
                                "snapshot") from None
        state = _oldest_snapshot(store, snapshots, 0, report)
    sound = False
    while state is not None:
        try:
            sound = _replay(store, state, {v for v in snapshots if v > state.version}, report)
            break
        except LogCompactedError as e:
            # gc compacted the log up to here: start again from a snapshot past it.
            state = _oldest_snapshot(store, snapshots, e.version, report)
            report.entries = report.snapshots = 0
    if state is None or not sound:
        return report
    reader = FragmentReader(store, cache_size=0, schema=state.stream_meta.schema)
    for f in state.all_fragments():
        report.fragments += 1
        try:
            reader.read(f.path, f.size, 0, f.rows, crc32=f.crc32, rows=f.rows)
        except (CorruptLogError, NotFoundError) as e:
            report.problems.append(str(e))
    return report
