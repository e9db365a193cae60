"""Garbage collection (docs/design.md §7): after a grace period, delete the files retention
reclaimed and uploads never committed, and what no writer writes from the log's folder, then
compact the log (``lakestream.log.compaction``)."""

from __future__ import annotations

import logging

from lakestream.errors import NotFoundError, StoreError
from lakestream.failpoints import failpoint
from lakestream.log.compaction import GcReport, compact, delete_or_skip, progress
from lakestream.log.entries import Reclaim
from lakestream.log.inventory import unreferenced
from lakestream.log.keys import LOG_DIR, is_delta_checkpoint_key, key_writer, log_key, log_version
from lakestream.log.replay import ReplayState
from lakestream.log.tail import read_entry
from lakestream.log.view import LogView
from lakestream.store.base import ObjectMeta, ObjectStore

log = logging.getLogger("lakestream")
IN_FLIGHT_MIN_AGE_S = 86_400.0
"""Uploads a live producer may still commit (``_in_flight``) are kept at least this long
whatever the grace: a grace shorter than a commit takes must not delete what the commit is
about to name. A producer instance that crashed with such uploads leaves them until it
restarts (its new epoch makes them deletable after the grace) or this age passes."""
CLOCK_KEY = "_lakestream/_clock"


def store_now(store: ObjectStore) -> float:
    """The store's own clock: the timestamp it gives an object written now."""
    store.put(CLOCK_KEY, b"", mode="overwrite")
    return store.head(CLOCK_KEY).last_modified


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


def collect(store: ObjectStore, state: ReplayState, grace_seconds: float,
            delta_checkpoint_version: int | None, *, seen_at: float | None = None,
            report: GcReport | None = None) -> GcReport:
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
    report = report if report is not None else GcReport()
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
    for meta in progress(doomed, "gc data"):
        failpoint("during_gc")
        if delete_or_skip(store, meta.key, report):
            report.data_files += 1
            report.data_bytes += meta.size
    try:
        for meta in store.list_temp(""):
            if meta.last_modified <= cutoff and delete_or_skip(store, meta.key, report):
                report.temp_files += 1
    except StoreError as e:
        report.skipped.append(f"temp files: {e}")
    compact(store, state, now, cutoff, delta_checkpoint_version, report)
    return report


def gc_stream(view: LogView, grace_seconds: float, *, delta_checkpoint: bool = True,
              storage_options: dict[str, str] | None = None) -> GcReport:
    """What ``Stream.gc`` does: reads the store's clock, then the log's head, deletes what no
    writer writes from the log's folder (``remove_forged``), writes a Delta checkpoint (with
    ``delta_checkpoint`` and deltalake installed: other engines open the table fast, and old
    entries may go), then ``collect``s on the state read."""
    seen_at = store_now(view.store)  # before the state gc works from is read
    view.refresh()
    report = GcReport()
    remove_forged(view, report)
    version = _write_delta_checkpoint(view.uri, storage_options, report) \
        if delta_checkpoint else None
    return collect(view.store, view.state, grace_seconds, version, seen_at=seen_at,
                   report=report)


def remove_forged(view: LogView, report: GcReport) -> None:
    """Deletes log entries past a gap and Delta checkpoints no engine wrote (not Parquet, or
    of a version not committed yet), naming each in ``report.forged``.

    An entry is past a gap if, after the folder was listed, the version after the head is
    absent while a later one was listed: committers put a version only once they have read
    the one before it, so that entry was put when the version before it did not exist.
    Delta readers refuse a table with a gap or a checkpoint they cannot read; replay never
    reaches such an entry, but a committer would meet it once the log grows to it.
    """
    store = view.store
    listed = list(store.list(LOG_DIR))
    head = view.refresh()  # the head after the listing: the version past it is absent now
    for meta in listed:
        checkpoint = is_delta_checkpoint_key(meta.key)
        try:
            version = log_version(meta.key) if checkpoint is None else checkpoint
        except ValueError:
            continue  # _last_checkpoint, and whatever else other engines keep there
        if checkpoint is None:
            forged = version > head + 1
            why = f"version {version} past the head {head}, with {head + 1} absent"
        else:
            forged = version > head or not _is_parquet(store, meta)
            why = f"a Delta checkpoint of version {version} that no engine wrote (the head " \
                f"is {head})"
        if forged and delete_or_skip(store, meta.key, report):
            report.forged.append(f"{meta.key}: {why}")
            log.warning("gc deleted %s: %s", meta.key, why)


def _is_parquet(store: ObjectStore, meta: ObjectMeta) -> bool:
    """Whether ``meta`` is a Parquet file whose footer reads (the first thing a Delta reader
    does with a checkpoint)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with store.open_input(meta.key, meta.size) as f:
            pq.read_metadata(f)
        return True
    except (OSError, ValueError, pa.ArrowException, NotFoundError):
        return False
    except StoreError:
        return True  # an outage, not damage: keep it


def _write_delta_checkpoint(uri: str, storage_options: dict[str, str] | None,
                            report: GcReport) -> int | None:
    """Writes a Delta checkpoint with deltalake; returns its version, or None (nothing of
    the Delta log may go then) if deltalake is not installed or fails, which is reported."""
    try:
        import deltalake
    except ImportError:
        return None
    try:
        table = deltalake.DeltaTable(uri, storage_options=storage_options)
        table.create_checkpoint()
        return int(table.version())
    except Exception as e:  # noqa: BLE001 - deltalake's errors: reported, gc goes on
        report.skipped.append(f"Delta checkpoint: deltalake failed ({type(e).__name__}: "
                              f"{str(e)[:300]}); the log is kept whole")
        return None


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


