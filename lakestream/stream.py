"""The Stream handle: create, open, append, read steps, mark checkpoints. A façade: each call
is made by a piece of the log wing (``lakestream.log``: the view, the commits, retention, gc)
or of the read side (``lakestream.read.offsets``); the consumer groups and retention are its
namespaces ``s.groups`` and ``s.retention`` (``lakestream.groups``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from lakestream.groups import Groups, Retention
from lakestream.log import commits
from lakestream.log.compaction import GcReport
from lakestream.log.entries import StreamMeta
from lakestream.log.opening import create_log, load_state
from lakestream.log.outcomes import Build, CommitOptions, CommitResult, Outcome, PostCommit, unwrap
from lakestream.log.replay import Marker, ReplayState
from lakestream.log.retention import RetentionPoint
from lakestream.log.transaction import DEFAULT_POST_COMMIT
from lakestream.log.view import LogView
from lakestream.read.cache import FragmentCache
from lakestream.read.fragments import LastStep
from lakestream.read.lineage import StepLineage
from lakestream.read.offsets import OffsetReader
from lakestream.read.tensors import ColumnSink
from lakestream.schema.conform import validate_schema
from lakestream.store import ObjectStore, open_store
from lakestream.store.diskcache import DiskCache

log = logging.getLogger("lakestream")


class Stream:
    """A handle on one stream. Thread-safe; its view advances on ``refresh`` and commits.

    Guarantees: every handle derives the same offsets and steps from the same log (replay
    is deterministic); a step is visible to all readers once committed offsets reach its
    end; commits are atomic (an entry is put-if-absent as one object).

    The handle's view is an immutable replay state that refreshes and commits replace,
    newest version wins, under a lock held only for the swap: no call on a handle waits
    behind another's I/O, backoff or sleep (``lakestream.log.view``).
    """

    def __init__(self, uri: str, store: ObjectStore, state: ReplayState, *,
                 storage_options: dict[str, str] | None = None,
                 disk_cache: DiskCache | None = None) -> None:
        self.uri = uri
        self.store = store
        self.storage_options = storage_options
        self._view = LogView(uri, store, state)
        self._reader = OffsetReader(self._view, disk_cache)

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
        return cls(uri, store, create_log(store, uri, meta), storage_options=storage_options)

    @classmethod
    def open(cls, uri: str, *, storage_options: dict[str, str] | None = None,
             disk_cache: DiskCache | None = None) -> Stream:
        """Opens the stream at ``uri``; its reads fetch fragments through ``disk_cache``, a
        host's cache of them on local disk, if given (``lakestream.store.diskcache``).

        Reads the hint, the newest snapshot's manifest and the entries after it: requests,
        bytes and memory that grow neither with the log's length nor with the number of
        live fragments (``read_step`` fetches the index segments it needs).

        Raises:
            NotFoundError: no stream exists there.
            CorruptLogError: the log cannot be replayed.
            StoreError: the store failed.
        """
        store = open_store(uri, storage_options)
        return cls(uri, store, load_state(store, uri), storage_options=storage_options,
                   disk_cache=disk_cache)

    def refresh(self) -> int:
        """Reads entries committed since the last look; returns the version now seen.

        At the head this is one request that finds nothing, and the view is not copied.
        Behind it, entries are read in parallel rounds (``lakestream.log.tail``). A view
        older than the retained log (gc compacted what follows it) is reopened from the
        newest snapshot.
        """
        return self._view.refresh()

    def poll(self) -> int:
        """``refresh`` for readers waiting at the head: entries come through this process's
        ``SharedHead``, so the process sends one GET per new version and one per backoff
        round however many handles of the stream poll (``lakestream/log/head.py``), and on a
        remote store the host's processes share it (``lakestream/log/hosthead.py``); behind
        the head the same parallel rounds as ``refresh``. Returns the version now seen.
        Committers refresh instead: they must see every rival at once.
        """
        return self._view.poll()

    def poll_wait_s(self) -> float:
        """Seconds until ``poll`` can see a version past this handle's view: the pause of
        the process's shared head (0: poll now)."""
        return self._view.poll_wait_s()

    # -- what the stream holds -----------------------------------------------------------

    @property
    def state(self) -> ReplayState:
        """The replay state seen now. Never modified once published: copy it to experiment."""
        return self._view.state

    @property
    def meta(self) -> StreamMeta:
        return self.state.stream_meta

    @property
    def version(self) -> int:
        return self.state.version

    @property
    def num_samples(self) -> int:
        return self.state.next_offset

    @property
    def num_steps(self) -> int:
        return self.state.num_steps

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
        return {k: (p.epoch, p.seq, p.state) for k, p in self.state.producers.items()}

    def checkpoints(self, group: str) -> list[Marker]:
        """The checkpoint markers of ``group``, oldest first (``groups.checkpoints``)."""
        return self.groups.checkpoints(group)

    @property
    def groups(self) -> Groups:
        """The consumer groups the log knows (with markers, or registered), sorted: equal
        to a list of their names, and the namespace of what is done to one
        (``s.groups.register``, ``s.groups.remove``, ``s.groups.mark_checkpoint``)."""
        return Groups(self._view)

    @property
    def retention(self) -> Retention:
        """What the groups hold and the reclaiming of the rest (``s.retention.point``,
        ``s.retention.retain``, ``s.retention.gc``)."""
        return Retention(self._view, self.storage_options)

    def registered_step(self, group: str) -> int | None:
        """The step ``group`` registered at, or None if it never registered."""
        return self.groups.registered_step(group)

    @property
    def sealed_at(self) -> int | None:
        """The stream's size in samples when it was sealed, or None if it is not (as of
        this handle's last refresh)."""
        return self.state.sealed_at

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
        return self._view.transact(build, options, catch_up=catch_up, post_commit=post_commit)

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
        return commits.append_table(self._view, data, commit_options)

    def mark_checkpoint(self, group: str, step: int, checkpoint_id: str | None = None) -> int:
        """Records that ``group`` has a durable checkpoint resuming at ``step``; returns the
        version. Call it after the training checkpoint is saved. See
        ``Groups.mark_checkpoint``."""
        return self.groups.mark_checkpoint(group, step, checkpoint_id)

    def register_group(self, group: str, step: int = 0) -> int | None:
        """Makes ``group`` a consumer group holding data from ``step``; see
        ``Groups.register``."""
        return self.groups.register(group, step)

    def seal(self) -> int | None:
        """Commits "no more appends": every later append fails with StreamSealedError and
        commits nothing, and readers know the stream's final size (a dataset over it can
        run epochs; a mix ends where it runs out). Idempotent: returns the seal's version,
        or None if the stream was sealed already.

        A producer that committed nothing since it last saw the log learns of the seal when
        it commits: its write fails then, and its uploaded files are left to gc.

        Samples past the last whole step (fewer than ``global_batch_size``) are never
        delivered, as a DataLoader's ``drop_last``: a warning says how many, and ``status``
        shows them (``undelivered_samples``).
        """
        result = self.commit(commits.seal)
        left = self.undelivered_samples
        if result is not None and left:
            log.warning("%s sealed at %d samples (a step is %d): the last %d fill no whole "
                        "step and are never delivered (append %d more before sealing to make "
                        "a last step)", self.uri, self.num_samples, self.global_batch_size,
                        left, self.global_batch_size - left)
        return None if result is None else result.version

    @property
    def undelivered_samples(self) -> int:
        """Samples committed past the last whole step (as of this handle's last refresh):
        delivered once a step fills, never once the stream is sealed."""
        return self.num_samples - self.state.stream_meta.offset(self.num_steps)

    def remove_group(self, group: str) -> int:
        """Removes ``group`` (its markers and registration stop holding data); see
        ``Groups.remove``."""
        return self.groups.remove(group)

    # -- retention: the flat names of ``s.retention`` ----------------------------------

    def retention_point(self, keep_last: int = 2) -> RetentionPoint:
        """What ``retain(keep_last)`` would reclaim now."""
        return self.retention.point(keep_last)

    def group_holds(self, keep_last: int = 2) -> dict[str, int]:
        """The step from which each consumer group holds data under ``retain(keep_last)``."""
        return self.retention.holds(keep_last)

    def retain(self, keep_last: int = 2) -> int | None:
        """Reclaims data no retained checkpoint needs; see ``Retention.retain``."""
        return self.retention.retain(keep_last)

    def gc(self, grace_seconds: float = 3600.0, *, delta_checkpoint: bool = True) -> GcReport:
        """Deletes reclaimed and orphaned files after a grace period; see ``Retention.gc``."""
        return self.retention.gc(grace_seconds, delta_checkpoint=delta_checkpoint)

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
        return self._reader.read_step(step, rank, world_size, columns)

    def read_offsets(self, spans: Sequence[tuple[int, int]], columns: list[str] | None = None,
                     *, what: str | None = None, cache: FragmentCache | None = None,
                     last_step: LastStep | None = None,
                     sink: ColumnSink | None = None) -> pa.Table:
        """The samples at offsets ``[lo, hi)`` of each span, in the order given (a mixed or
        shuffled step's rows). A fragment that several spans touch is read once; with a
        ``cache``, each row group once, and a file read whole fetched once, while the cache
        keeps them: until ``last_step(lo, hi)``, the last step that may read offsets
        ``[lo, hi)`` (the steps of a mix share their fragments: ``MixSteps``). With a
        ``sink``, its tensor columns go into its arrays, copied from the fragments' bytes,
        and not into the table (``lakestream.read.tensors``).

        Raises:
            StepNotAvailableError: an offset is not committed yet, or was reclaimed.
            ValueError: an unknown column, or an empty or reversed span.
        """
        return self._reader.read(spans, columns, what=what, cache=cache, last_step=last_step,
                                 sink=sink)

    def lineage(self, step: int) -> StepLineage:
        """Where each sample of global batch ``step`` came from (producer, epoch, seq,
        fragment, committing version, policy version) and the checkpoint markers, of every
        consumer group, that replay it; see ``lakestream.read.lineage``. Reads only the
        ``policy_version``, ``policy_version_min`` and ``policy_version_max`` columns the
        stream has, never whole samples. Samples of ``Stream.append`` have producer None,
        epoch 0 and seq 0. A step not visible yet is looked for once more after a refresh.

        Raises:
            ValueError: ``step`` is negative or not an int.
            StepNotAvailableError: the step is not committed yet. A reclaimed step raises
                nothing: its lineage says ``reclaimed``.
        """
        return self._reader.lineage(step)

