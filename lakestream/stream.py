"""The Stream handle: create, open, append, read steps, mark checkpoints."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from zlib_ng import zlib_ng

from lakestream.errors import (
    AlreadyExistsError,
    LakestreamError,
    LogCompactedError,
    StepNotAvailableError,
    StoreError,
)
from lakestream.fragment import (
    ANONYMOUS,
    FragmentCache,
    FragmentReader,
    encode_fragment,
    fragment_key,
    put_fragment,
    read_spans,
)
from lakestream.head import shared_head
from lakestream.index import Fragment, SegmentError
from lakestream.lineage import StepLineage, step_lineage
from lakestream.log import (
    REOPEN_IDLE_S,
    Append,
    Checkpoint,
    Create,
    Entry,
    FragmentRef,
    Register,
    RemoveGroup,
    Seal,
    StreamMeta,
    check_group,
    encode_entry,
    log_key,
)
from lakestream.plan import check_world, slice_offsets
from lakestream.replay import Marker, ReplayState, refuse_if_sealed
from lakestream.retention import (
    GcReport,
    RetentionPoint,
    collect,
    group_holds,
    reclaim_entry,
    retention_point,
    store_now,
)
from lakestream.schema import conform, validate_schema
from lakestream.snapshot import load_state, rebase, replay_log, write_snapshot
from lakestream.store import ObjectStore, open_store
from lakestream.tail import ReadEntry, catch_up, entry_or_none
from lakestream.transaction import (
    DEFAULT_POST_COMMIT,
    Build,
    CommitOptions,
    CommitResult,
    Landed,
    Outcome,
    PostCommit,
    Transaction,
    unwrap,
)

log = logging.getLogger("lakestream")


class Stream:
    """A handle on one stream. Thread-safe; its view advances on ``refresh`` and commits.

    Guarantees: every handle derives the same offsets and steps from the same log (replay
    is deterministic); a step is visible to all readers once committed offsets reach its
    end; commits are atomic (an entry is put-if-absent as one object).

    The handle's view is an immutable replay state that refreshes and commits replace,
    newest version wins, under a lock held only for the swap: no call on a handle waits
    behind another's I/O, backoff or sleep.
    """

    def __init__(self, uri: str, store: ObjectStore, state: ReplayState, *,
                 storage_options: dict[str, str] | None = None) -> None:
        self.uri = uri
        self.store = store
        self.storage_options = storage_options
        self._state = state
        self._rebase_at = (state.version // state.stream_meta.snapshot_interval + 1) * \
            state.stream_meta.snapshot_interval
        self._damaged_index = False
        self._lock = threading.Lock()
        self._reader = FragmentReader(store, schema=state.stream_meta.schema)
        self._confirmed = time.monotonic()
        """When a read last found the log's head (monotonic): a view not confirmed for
        ``REOPEN_IDLE_S`` is reopened before it is used again (docs/design.md §7)."""

    # -- opening -----------------------------------------------------------------------

    @classmethod
    def create(cls, uri: str, schema: pa.Schema, *, global_batch_size: int, group_size: int = 1,
               snapshot_interval: int = 100,
               storage_options: dict[str, str] | None = None) -> Stream:
        """Creates a stream at ``uri`` (version 0) and returns a handle on it.

        Raises:
            AlreadyExistsError: a stream already exists at ``uri``.
            ValueError: the schema, batch size, group size or interval are not valid.
        """
        meta = StreamMeta(validate_schema(schema), global_batch_size, group_size,
                          snapshot_interval)
        store = open_store(uri, storage_options)
        entry = Create(meta)
        try:
            store.put(log_key(0), encode_entry(entry), mode="create")
        except (AlreadyExistsError, StoreError) as e:
            # A lost reply, or a retried PUT meeting its own object: read what is there.
            existing = entry_or_none(store, 0)
            if existing is None or existing.commit_id != entry.commit_id:
                if isinstance(e, StoreError):
                    raise
                raise AlreadyExistsError(
                    f"a stream already exists at {uri}; open it with lakestream.open"
                ) from None
        state = ReplayState()
        state.apply(0, entry)
        write_snapshot(store, state)
        return cls(uri, store, state, storage_options=storage_options)

    @classmethod
    def open(cls, uri: str, *, storage_options: dict[str, str] | None = None) -> Stream:
        """Opens the stream at ``uri``.

        Reads the hint, the newest snapshot's manifest and the entries after it: requests,
        bytes and memory that grow neither with the log's length nor with the number of
        live fragments (``read_step`` fetches the index segments it needs).

        Raises:
            NotFoundError: no stream exists there.
            CorruptLogError: the log cannot be replayed.
            StoreError: the store failed.
        """
        store = open_store(uri, storage_options)
        return cls(uri, store, load_state(store, uri), storage_options=storage_options)

    def _publish(self, state: ReplayState, *, replace: bool = False) -> None:
        """Makes ``state`` (private to the caller until now) the view, unless a newer one
        is (or, with ``replace``, one as new). First, once per snapshot interval, swaps what
        it holds in memory for the newest snapshot's segments, so memory does not grow with
        what others commit."""
        interval = state.stream_meta.snapshot_interval
        if state.version >= self._rebase_at and not self._damaged_index:
            try:
                done = rebase(self.store, state)
            except StoreError:
                done = False  # only memory and stale names: try again soon
            # The manifest may not be written yet (its writer is racing this handle): try
            # again a tenth of an interval on, and after a success, at the next snapshot.
            self._rebase_at = (state.version // interval + 1) * interval if done else \
                state.version + max(1, interval // 10)
        with self._lock:
            if state.version > self._state.version or \
                    replace and state.version == self._state.version:
                self._state = state

    def refresh(self) -> int:
        """Reads entries committed since the last look; returns the version now seen.

        At the head this is one request that finds nothing, and the view is not copied.
        Behind it, entries are read in parallel rounds (``lakestream.tail``). A view older
        than the retained log (gc compacted what follows it) is reopened from the newest
        snapshot.
        """
        return self._catch_up(None)

    def poll(self) -> int:
        """``refresh`` for readers waiting at the head: entries come through this process's
        ``SharedHead``, so the process sends one GET per new version and one per backoff
        round however many handles of the stream poll (``lakestream/head.py``); behind the
        head the same parallel rounds as ``refresh``. Returns the version now seen.
        Committers refresh instead: they must see every rival at once.
        """
        head = shared_head(self.store, self._state.stream_meta.created_ms)
        return self._catch_up(head.reader(self.store))

    def poll_wait_s(self) -> float:
        """Seconds until ``poll`` can see a version past this handle's view: the pause of
        the process's shared head (0: poll now)."""
        return shared_head(self.store, self._state.stream_meta.created_ms).wait_s()

    def _catch_up(self, read: ReadEntry | None) -> int:
        """The one catch-up of the handle's view: ``read`` reads a version (None: a GET)."""
        seen = self._state
        if time.monotonic() - self._confirmed > REOPEN_IDLE_S:
            return self._reopen(None)
        t0 = time.monotonic()
        try:
            entry = entry_or_none(self.store, seen.version + 1) if read is None \
                else read(seen.version + 1)
            if entry is None:
                self._confirmed = max(self._confirmed, t0)
                return seen.version
            state = seen.copy()
            state.apply(seen.version + 1, entry)
            t = catch_up(self.store, state, read)
        except LogCompactedError as e:
            return self._reopen(e)
        self._publish(state)
        self._confirmed = max(self._confirmed, t)
        return self._state.version

    def _reopen(self, compacted: LogCompactedError | None) -> int:
        """Replaces a view that may be older than the retained log by the stream opened from
        its newest snapshot (``compacted``: the tombstone met says which, at least)."""
        t0 = time.monotonic()
        if compacted is not None:
            log.info("%s; reopening %s", compacted, self.uri)
        state = load_state(self.store, self.uri,
                           start=None if compacted is None else compacted.snapshot)
        self._publish(state)
        self._confirmed = max(self._confirmed, t0)
        return self._state.version

    # -- what the stream holds -----------------------------------------------------------

    @property
    def state(self) -> ReplayState:
        """The replay state seen now. Never modified once published: copy it to experiment."""
        return self._state

    @property
    def meta(self) -> StreamMeta:
        return self._state.stream_meta

    @property
    def version(self) -> int:
        return self._state.version

    @property
    def num_samples(self) -> int:
        return self._state.next_offset

    @property
    def num_steps(self) -> int:
        return self._state.num_steps

    @property
    def schema(self) -> pa.Schema:
        return self.meta.schema

    @property
    def global_batch_size(self) -> int:
        return self.meta.global_batch_size

    @property
    def group_size(self) -> int:
        return self.meta.group_size

    @property
    def producers(self) -> dict[str, tuple[int, int, Any]]:
        """``{producer_id: (epoch, seq, state)}``: the last committed seq and user state."""
        return {k: (p.epoch, p.seq, p.state) for k, p in self._state.producers.items()}

    def checkpoints(self, group: str) -> list[Marker]:
        """The checkpoint markers of ``group``, oldest first."""
        return list(self._state.markers.get(group, []))

    # -- writing ---------------------------------------------------------------------------

    def transact(self, build: Build, options: CommitOptions | None = None, *,
                 catch_up: bool = False,
                 post_commit: tuple[PostCommit, ...] = DEFAULT_POST_COMMIT) -> Outcome:
        """Runs one ``Transaction`` on this handle's view and publishes the state it ends
        with, whatever the outcome; returns the outcome for the caller to branch on.

        Raises:
            Only what is not an outcome (a bug in ``build``, KeyboardInterrupt): the entry
            may or may not have landed.
        """
        if time.monotonic() - self._confirmed > REOPEN_IDLE_S:
            self._reopen(None)
        t0 = time.monotonic()
        outcome = Transaction(self.store, self._state, build, options, catch_up=catch_up,
                              post_commit=post_commit).commit()
        self._publish(outcome.state)
        if isinstance(outcome, Landed):
            self._confirmed = max(self._confirmed, t0)
        return outcome

    def commit(self, build: Build, options: CommitOptions | None = None, *,
               catch_up: bool = False) -> CommitResult | None:
        """Commits the entry ``build`` makes (see ``transact``); None if there was nothing.

        Raises:
            The precondition's error from ``build`` (e.g. ProducerFencedError),
            CommitConflictError or CommitStateUnknownError.
        """
        return unwrap(self.transact(build, options, catch_up=catch_up))

    def append(self, data: Any, *, commit_options: CommitOptions | None = None) -> int:
        """Writes ``data`` as one fragment and commits it; returns the version.

        Atomic: all rows get consecutive offsets, or none is committed.

        The uploaded file is deleted only when nothing was committed for certain; after an
        unknown outcome or an interruption it stays (gc removes it if it is an orphan).

        Raises:
            SchemaMismatchError: ``data`` does not fit the schema (nothing is uploaded).
            ValueError: the row count is not a multiple of the group size, or is zero.
            CommitConflictError: the commit lost every race (nothing was committed).
            CommitStateUnknownError: the commit may have landed; reopen to learn it.
            CorruptLogError: the log cannot be replayed up to the head (nothing committed).
            StreamSealedError: the stream is sealed (nothing is committed).
        """
        refuse_if_sealed(self._state, self.uri)
        table = conform(data, self.schema, where=f"append to {self.uri}")
        rows, g = table.num_rows, self.group_size
        if rows == 0 or rows % g:
            raise ValueError(
                f"append to {self.uri}: {rows} rows is not a positive multiple of the group "
                f"size {g}"
            )
        key = fragment_key(ANONYMOUS, 0, 0)
        body = encode_fragment(table, g)
        crc = zlib_ng.crc32(body)
        put_fragment(self.store, key, body)

        def build(state: ReplayState, commit_id: str) -> Entry:
            refuse_if_sealed(state, self.uri)
            ref = FragmentRef(key, rows, len(body), state.next_offset, 0, crc)
            return Append(None, 0, (ref,), None, commit_id)

        outcome = self.transact(build, commit_options)
        if outcome.definite_failure:
            try:
                self.store.delete(key)  # a definite failure: nothing can name the file
            except LakestreamError as e:  # gc removes the orphan; the outcome is the news
                log.warning("could not delete the uncommitted fragment %s: %s", key, e)
        result = unwrap(outcome)
        assert result is not None
        return result.version

    def _check_group_step(self, group: str, step: int, what: str) -> None:
        """A valid group name and a step already visible (refreshing once to see it).

        Raises:
            ValueError: naming what is wrong; ``what`` says where such a step must lie.
        """
        check_group(group)
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if step > self.num_steps:
            self.refresh()
        if step > self.num_steps:
            raise ValueError(f"step {step} of group {group!r} is past the {self.num_steps} steps "
                             f"visible in {self.uri}: {what} a step already readable")

    def mark_checkpoint(self, group: str, step: int, checkpoint_id: str | None = None) -> int:
        """Records that ``group`` has a durable checkpoint resuming at ``step``; returns the
        version. Call it after the training checkpoint is saved.

        The marker is committed only on a state whose reclaimed offset is at or below the
        step's data: a ``retain`` that lands first makes it fail, never leaves a marker
        pointing at reclaimed data.

        Raises:
            ValueError: ``group`` is not a valid group name, or ``step`` is negative or past
                the visible steps.
            StepNotAvailableError: the step's data is already reclaimed (nothing committed).
        """
        self._check_group_step(group, step, "a checkpoint resumes at")
        b = self.global_batch_size

        def build(state: ReplayState, commit_id: str) -> Entry:
            if step * b < state.reclaimed_below:
                raise StepNotAvailableError(
                    f"checkpoint step {step} of group {group!r} is below the retention point "
                    f"of {self.uri} (offset {state.reclaimed_below} at version "
                    f"{state.version}): its data is reclaimed; checkpoint a later step"
                )
            return Checkpoint(group, step, checkpoint_id, commit_id)

        result = self.commit(build)
        assert result is not None
        return result.version

    @property
    def groups(self) -> list[str]:
        """The consumer groups the log knows (with markers, or registered), sorted."""
        return self._state.groups

    def registered_step(self, group: str) -> int | None:
        """The step ``group`` registered at, or None if it never registered."""
        return self._state.registered.get(group)

    def register_group(self, group: str, step: int = 0) -> int | None:
        """Makes ``group`` a consumer group that holds retention from ``step`` until its own
        markers take over. Idempotent: a group the log knows already (registered, or with
        markers) is left as it is and None returned; else the registration's version.

        Raises:
            ValueError: ``group`` is not a valid group name, or ``step`` is negative or past
                the visible steps (a group registers where it starts reading).
            StepNotAvailableError: ``step``'s data is already reclaimed (nothing committed).
        """
        self._check_group_step(group, step, "a group registers at")
        b = self.global_batch_size

        def build(state: ReplayState, commit_id: str) -> Entry | None:
            if group in state.registered or group in state.markers:
                return None
            if step * b < state.reclaimed_below:
                raise StepNotAvailableError(
                    f"group {group!r} cannot register at step {step} of {self.uri}: its data "
                    f"is reclaimed (below offset {state.reclaimed_below}); register a later "
                    "step")
            return Register(group, step, commit_id)

        result = self.commit(build)
        return None if result is None else result.version

    @property
    def sealed_at(self) -> int | None:
        """The stream's size in samples when it was sealed, or None if it is not (as of
        this handle's last refresh)."""
        return self._state.sealed_at

    def seal(self) -> int | None:
        """Commits "no more appends": every later append fails with StreamSealedError and
        commits nothing, and readers know the stream's final size (a dataset over it can
        run epochs; a mix ends where it runs out). Idempotent: returns the seal's version,
        or None if the stream was sealed already.

        A producer that committed nothing since it last saw the log learns of the seal when
        it commits: its write fails then, and its uploaded files are left to gc.
        """

        def build(state: ReplayState, commit_id: str) -> Entry | None:
            return None if state.sealed_at is not None else Seal(commit_id)

        result = self.commit(build)
        return None if result is None else result.version

    def remove_group(self, group: str) -> int:
        """Removes ``group``: its markers and registration stop holding data (the next
        ``retain`` may reclaim what only it held). Returns the removal's version.

        Raises:
            ValueError: the log knows no such group (nothing committed).
        """
        check_group(group)

        def build(state: ReplayState, commit_id: str) -> Entry:
            if group not in state.registered and group not in state.markers:
                raise ValueError(f"{self.uri} has no consumer group {group!r}; its groups: "
                                 f"{state.groups or 'none'}")
            return RemoveGroup(group, commit_id)

        result = self.commit(build)
        assert result is not None
        return result.version

    # -- retention ---------------------------------------------------------------------

    def retention_point(self, keep_last: int = 2) -> RetentionPoint:
        """What ``retain(keep_last)`` would reclaim now."""
        return retention_point(self._state, keep_last)

    def group_holds(self, keep_last: int = 2) -> dict[str, int]:
        """The step from which each consumer group holds data under ``retain(keep_last)``."""
        return group_holds(self._state, keep_last)

    def retain(self, keep_last: int = 2) -> int | None:
        """Reclaims data no retained checkpoint needs: for every consumer group keep its last
        ``keep_last`` markers; fragments wholly below the smallest of their resume steps are
        removed from the table (Delta ``remove``). Files are deleted later by ``gc``.

        Safe beside producers, readers and other retainers: the point is recomputed on the
        latest log at every commit attempt. A registered group with no marker holds from its
        registration step; a stream with no group holds everything; progress objects hold
        nothing. Returns the reclaim's version, or None if nothing was reclaimable.
        """
        result = self.commit(lambda state, cid: reclaim_entry(state, keep_last, cid))
        return None if result is None else result.version

    def gc(self, grace_seconds: float = 3600.0, *, delta_checkpoint: bool = True) -> GcReport:
        """Deletes, once ``grace_seconds`` have passed by the store's own clock, the files of
        reclaimed fragments and of uploads never committed, and log entries and snapshots
        older than the newest snapshot and Delta checkpoint.

        With ``delta_checkpoint`` (and deltalake installed) it first writes a Delta checkpoint
        so other engines open the table fast and old entries can go; without one the log is
        kept whole. Killing gc at any point leaves a readable stream; run it again.
        """
        seen_at = store_now(self.store)  # before the state gc works from is read
        self.refresh()
        version = self._write_delta_checkpoint() if delta_checkpoint else None
        return collect(self.store, self._state, grace_seconds, version, seen_at=seen_at)

    def _write_delta_checkpoint(self) -> int | None:
        try:
            import deltalake
        except ImportError:
            return None
        table = deltalake.DeltaTable(self.uri, storage_options=self.storage_options)
        table.create_checkpoint()
        return int(table.version())

    # -- reading ---------------------------------------------------------------------------

    def read_step(self, step: int, rank: int = 0, world_size: int = 1,
                  columns: list[str] | None = None) -> pa.Table:
        """Rank ``rank`` of ``world_size``'s slice of global batch ``step``.

        Every rank of every reader gets the same rows for the same (step, rank, world_size);
        the slices of all ranks partition the step.

        Raises:
            StepNotAvailableError: the step is not committed yet, or was reclaimed.
            ValueError: world_size does not divide B, or splits a group.
        """
        b = self.global_batch_size
        check_world(b, self.group_size, world_size)
        span = slice_offsets(step, b, rank, world_size)
        return self.read_offsets([(span.start, span.stop)], columns, what=f"step {step}")

    def read_offsets(self, spans: Sequence[tuple[int, int]], columns: list[str] | None = None,
                     *, what: str | None = None,
                     cache: FragmentCache | None = None) -> pa.Table:
        """The samples at offsets ``[lo, hi)`` of each span, in the order given (a mixed or
        shuffled step's rows). A fragment that several spans touch is read once; with a
        ``cache``, each fragment is read whole, once while the cache keeps it (a shuffled
        window's steps share their fragments).

        Raises:
            StepNotAvailableError: an offset is not committed yet, or was reclaimed.
            ValueError: an unknown column, or an empty or reversed span.
        """
        if not spans or any(lo >= hi or lo < 0 for lo, hi in spans):
            raise ValueError(f"spans must be non-empty [lo, hi) ranges, got {list(spans)[:4]}")
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        what = what or f"offsets [{lo}, {hi})"
        if hi > self._state.next_offset:
            self.refresh()
        try:
            fragments = self._visible(self._state, what, lo, hi)
        except SegmentError as e:
            fragments = self._visible(self._recover(e), what, lo, hi)
        if columns is not None:
            unknown = [c for c in columns if c not in self.schema.names]
            if unknown:
                raise ValueError(f"unknown columns {unknown}; the stream has {self.schema.names}")
        parts = read_spans(self._reader, fragments, spans, columns, cache)
        schema = self.schema if columns is None else pa.schema(
            [self.schema.field(c) for c in columns])
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def lineage(self, step: int) -> StepLineage:
        """Where each sample of global batch ``step`` came from (producer, epoch, seq,
        fragment, committing version, policy version) and the checkpoint markers, of every
        consumer group, that replay it; see ``lakestream.lineage``. Reads only the
        ``policy_version``, ``policy_version_min`` and ``policy_version_max`` columns the
        stream has, never whole samples. Samples of ``Stream.append`` have producer None,
        epoch 0 and seq 0. A step not visible yet is looked for once more after a refresh.

        Raises:
            ValueError: ``step`` is negative or not an int.
            StepNotAvailableError: the step is not committed yet. A reclaimed step raises
                nothing: its lineage says ``reclaimed``.
        """
        if isinstance(step, int) and step >= self.num_steps:
            self.refresh()

        def read(spans: Sequence[tuple[int, int]], columns: list[str]) -> pa.Table:
            return self.read_offsets(spans, columns, what=f"step {step}")

        try:
            return step_lineage(self._state, step, read, uri=self.uri)
        except SegmentError as e:
            return step_lineage(self._recover(e), step, read, uri=self.uri)

    def _recover(self, damage: SegmentError) -> ReplayState:
        """A state without the segment ``damage`` names: reopened from the newest snapshot
        (the segment may have been superseded, and gc deleted it, while this handle held an
        older manifest's names), or else replayed from the log alone."""
        log.warning("%s; reopening %s", damage, self.uri)
        state = load_state(self.store, self.uri)
        if any(part.key == damage.key for part in state.index.parts):
            self._damaged_index = True  # rebasing would name the damaged segment again
            state = replay_log(self.store, damage)
        self._publish(state, replace=True)
        return state

    def _visible(self, s: ReplayState, what: str, lo: int, hi: int) -> list[Fragment]:
        b = self.global_batch_size
        if lo < s.reclaimed_below:
            raise StepNotAvailableError(
                f"{what} of {self.uri} was reclaimed by retention: data below step "
                f"{-(-s.reclaimed_below // b)} is gone; resume from a retained checkpoint"
            )
        if hi > s.next_offset:
            raise StepNotAvailableError(
                f"{what} of {self.uri} is not visible yet: {s.num_steps} steps are "
                f"committed (version {s.version})"
            )
        return s.fragments_between(lo, hi)


def create(uri: str, schema: pa.Schema, global_batch_size: int, group_size: int = 1, *,
           storage_options: dict[str, str] | None = None,
           snapshot_interval: int = 100) -> Stream:
    """Creates a stream; see ``Stream.create``."""
    return Stream.create(uri, schema, global_batch_size=global_batch_size,
                         group_size=group_size, snapshot_interval=snapshot_interval,
                         storage_options=storage_options)


def open(uri: str, *, storage_options: dict[str, str] | None = None) -> Stream:  # noqa: A001
    """Opens a stream; see ``Stream.open``."""
    return Stream.open(uri, storage_options=storage_options)

