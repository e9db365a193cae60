"""StreamDataset: every rank's slice of the same global batches, as a PyTorch IterableDataset.

Over 400 lines for a reason: the class is the loaders' entry point, and its docstring is the
user's manual. What it delegates lives beside it: saved states and the cases in which they
resume (``loaders/resume.py``), progress (``loaders/publisher.py``), prefetching
(``loaders/reader.py``), the steps themselves (``lakestream.read``)."""

from __future__ import annotations

import contextlib
import json
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from lakestream.errors import LakestreamError, PermissionDeniedError
from lakestream.loaders.collate import Batch, Collate, ColumnArrays, collate_table
from lakestream.loaders.device import Delivery, check_delivery
from lakestream.loaders.host import (
    default_prefetch,
    default_read_threads,
    quick_gil_handoff,
    read_slots,
)
from lakestream.loaders.planning import resolve_rank, worker_steps
from lakestream.loaders.publisher import JobProgress, MixProgress, ProgressPublisher, job_id
from lakestream.loaders.reader import StepReader, Stop
from lakestream.loaders.resume import (
    STATE_VERSION,
    Base,
    Resume,
    changed_mix_starts,
    check_batch_size,
    check_named,
    check_streams,
    dataset_states,
    refuse_worker_state,
    worker_next,
)
from lakestream.loaders.watchdog import watch_parent
from lakestream.reading import (
    COUNTS_KEY,
    Accept,
    DiskCache,
    ReadPolicy,
    SelectedSteps,
    Source,
    Steps,
    check_columns,
    check_group,
    check_int,
    cpu_slots,
    direct_columns,
    is_remote,
    mix_steps,
    stream_steps,
    tensor_spec,
)
from lakestream.stream import Stream

log = logging.getLogger("lakestream")


def _distributed() -> tuple[int, int] | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


class StreamDataset(IterableDataset[dict[str, Any]]):
    """Yields, for each step from ``start_step`` on, this rank's slice of the global batch as
    a dict of tensors plus its step number (under ``"step"``, or ``step_key``).

    Every rank of every run derives the same steps from the log: the slices of all ranks
    partition each global batch, a step is yielded only once it is committed (all ranks see
    it at once), and resuming from ``state_dict()`` re-reads exactly the same steps, also
    with another world size (W must divide B; B/W must hold whole groups).

    With ``DataLoader(ds, batch_size=None, num_workers=n)`` the steps are dealt to workers
    round-robin, so the loader yields them in order. The dataset tracks the steps it yields
    when it iterates in this process. With workers, each worker's copy tracks its own
    position, which torchdata's ``StatefulDataLoader`` saves and restores per worker (exact
    with prefetching; another world size is fine, another ``num_workers`` is refused by
    torchdata); or iterate through ``StreamLoader``, which notes each step in the trainer
    process, so that this dataset's own ``state_dict()`` knows what was consumed and rank 0
    publishes progress (for producers' ``max_lag_steps``). Under a loader that does neither,
    call ``record_step(batch["step"])``.

    A dataset with a consumer ``group`` joins it: rank 0 registers the group at its first
    step (once; the group then holds retention from there until its own checkpoint markers
    take over), publishes its progress and commits its markers. ``group=None`` reads
    without one: it publishes nothing, registers nothing and holds nothing (an eval or
    analysis job beside training).

    Mixing, shuffling, epochs (``lakestream.plan.mix``): pass a list of ``Source(uri, take,
    cycle)`` instead of one URI and every step takes ``take`` samples from each source, in
    that source's order, so a step holds the sum of the takes; each rank gets its share of
    every source. ``shuffle_window=w`` permutes each window of ``w`` steps' samples of each
    source (groups stay whole; a window is read once all of it is committed), by ``seed``.
    ``epochs=n`` runs over sealed sources n times, each epoch in a fresh order. A mix ends
    when a sealed source that does not cycle runs out; every rank and every restart reads
    the same samples at the same step.

    Read-time policies (``lakestream.read.selected``; one stream in log order): with
    ``max_staleness=k``, a group whose oldest policy version (``policy_version_min``, else
    ``policy_version``) is below ``step - k`` is skipped and the step refilled from later
    samples (``on_stale="drop"``), or kept with a per-sample ``stale`` mask
    (``on_stale="mask"``). ``accept`` (a pure function of a group's rows, as a
    ``pyarrow.Table`` of ``accept_columns``, all if None; defined at the top level of a
    module, since checkpoints record it by name) skips the groups it rejects, e.g. those
    whose rewards are all equal. ``balance`` (a list column, whose lengths count, or
    an integer one) deals each step's groups to ranks so that the largest rank's total is
    as small as it can be made (equal group counts per rank). Every rank and every restart
    makes the same choices: they are functions of the log, the step and the cursor the
    state saves. Each batch then carries ``read_policy``: the samples the step dropped
    (``stale_dropped``, ``filtered``) and masked (``stale_masked``).

    Args:
        uri: the stream, or the sources of a mix. group: the consumer group, or None to read
            without one.
        batch_size: samples per step over all ranks, chosen at read time (None: the
            stream's global batch size): the stream's samples in log order, cut into
            batches of this many, groups whole (a multiple of the group size; W must divide
            it into whole groups). Resumes, markers and retention work as with the stream's
            own steps; a checkpoint may resume with another batch size.
        rank, world_size: default to torch.distributed, then RANK/WORLD_SIZE, then 0/1.
        start_step: the first step to read. max_steps: iteration stops before this step.
        columns: the columns to read (all if None). timeout: seconds to wait for a step
            (None waits forever). collate: "padded", "packed" or a callable on the table.
        transform: a function of each collated batch (decoding images, resizing,
            augmenting) whose result is yielded instead; it runs in the read threads (in
            each DataLoader worker's, with workers), beside decoding, never in the
            training loop's thread. Defined at a module's top level if workers are used.
        read_threads: threads reading, collating and transforming steps; None: this rank's
            share of the host's cores less one (``loaders/host.py``: ``LOCAL_WORLD_SIZE``
            ranks share the cores, a DataLoader's workers share the rank's), at least 1,
            and 4 more where reads wait on S3 or a ``disk_cache``.
            However many there are, per-byte work runs in at most that many at once
            (``lakestream.store.slots``): threads past it only wait for a remote store.
        prefetch: steps read ahead, in those threads; None: one per thread and two more.
        pin_memory: deliver batches in pinned memory, pinned in the read threads (needs
            CUDA). device: e.g. "cuda": deliver batches there, copied in the read threads on
            their own CUDA streams ahead of use (the batch is ready for the consumer's
            current stream without a host wait). Both apply when the dataset is iterated in
            the trainer process; with DataLoader workers, pass ``pin_memory=True`` to the
            loader instead.
        progress_interval_s: how often rank 0 publishes progress (for producers'
            ``max_lag_steps``), from a background thread that stops when iteration ends or
            on ``close``; 0 disables it.
        keep_last: if set, each ``commit_checkpoint`` also runs retention keeping the last
            ``keep_last`` markers of every group, and ``save_checkpoint`` deletes the older
            checkpoints it saved under its root in this process (off by default).
        step_key: the key under which each batch carries its step number; a stream with a
            column of that name needs another (``ValueError`` otherwise).
        shuffle_window, seed, epochs: see above (default: log order, once, no end).
        max_staleness, on_stale, accept, accept_columns, balance: the read-time policy
            (default: none).
        disk_cache: a ``DiskCache(folder, limit)`` that whole fragments are fetched through,
            shared by every process on the host that names the same folder (ranks, their
            DataLoader workers): each fragment is then fetched from the store once while
            the cache holds it (``lakestream.store.diskcache``). Off by default.

    Raises:
        ValueError: a bad read-time policy (``accept`` a lambda, nested function or other
            callable its module and name do not find again), or one with a mix.
    """

    def __init__(self, uri: str | Sequence[Source], group: str | None = "train",
                 rank: int | None = None,
                 world_size: int | None = None, start_step: int = 0,
                 columns: list[str] | None = None, timeout: float | None = None,
                 collate: str | Collate = "padded", *,
                 storage_options: dict[str, str] | None = None,
                 max_steps: int | None = None, prefetch: int | None = None,
                 read_threads: int | None = None, transform: Callable[[Any], Any] | None = None,
                 pin_memory: bool = False, device: str | None = None,
                 progress_interval_s: float = 1.0, keep_last: int | None = None,
                 step_key: str = "step", shuffle_window: int | None = None, seed: int = 0,
                 epochs: int | None = None, max_staleness: int | None = None,
                 on_stale: str = "drop", accept: Accept | None = None,
                 accept_columns: Sequence[str] | None = None,
                 balance: str | None = None, disk_cache: DiskCache | None = None,
                 batch_size: int | None = None) -> None:
        super().__init__()
        if disk_cache is not None and not isinstance(disk_cache, DiskCache):
            raise TypeError(f"disk_cache must be a lakestream DiskCache(folder, limit), got "
                            f"{disk_cache!r}")
        self.disk_cache = disk_cache
        batch_size = check_int("batch_size", batch_size, least=1, optional=True)
        if isinstance(uri, str):
            # A batch size chosen at read time is a one-source mix taking that many samples
            # a step: same order, same resume, same markers in the stream's own steps.
            self.sources = [Source(uri, batch_size, storage_options=storage_options)]
        elif batch_size is not None:
            raise ValueError("batch_size= reads one stream: a mix's step is the sum of its "
                             "sources' takes (Source(uri, take=n))")
        else:
            self.sources = [s if s.storage_options is not None or storage_options is None
                            else Source(s.uri, s.take, s.cycle, storage_options) for s in uri]
            if not self.sources or not all(isinstance(s, Source) for s in self.sources):
                raise TypeError("uri must be a stream URI or a non-empty list of Source")
        self.batch_size = batch_size
        self.uri = " + ".join(s.uri for s in self.sources)
        self.shuffle_window, self.seed, self.epochs = shuffle_window, seed, epochs
        if isinstance(accept_columns, str):
            raise TypeError(f"accept_columns must be a list of column names, got "
                            f"{accept_columns!r}")
        if accept is not None:
            check_named(accept)
        self.policy = ReadPolicy(max_staleness, on_stale, accept,
                                 None if accept_columns is None else tuple(accept_columns),
                                 balance)
        if self.policy.active and (len(self.sources) > 1 or self.sources[0].take is not None
                                   or self.sources[0].cycle or shuffle_window is not None
                                   or epochs is not None):
            raise ValueError("read-time policies (max_staleness, accept, balance) read one "
                             "stream's own steps in log order: they do not combine with "
                             "mixing, batch_size, shuffle_window or epochs")
        self._base: Base = (0, [0] * len(self.sources))
        self._keyed = True
        """Whether the plan keys each source's permutations by its stream's identity; a
        state saved before they were (its mix JSON has no "keyed") resumes keyed by index."""
        """The mix's (base step, source positions there): where a changed mix began."""
        self.group = None if group is None else check_group(group)
        self.job = job_id()
        """This job's identity in its group's progress (``JobProgress``)."""
        self.storage_options = storage_options
        self.rank, self.world_size = resolve_rank(rank, world_size, distributed=_distributed())
        start_step = check_int("start_step", start_step)
        self.start_step = start_step
        self.max_steps = max_steps
        self.columns, self.timeout = columns, timeout
        if not callable(collate) and collate not in ("padded", "packed"):
            raise ValueError(f"collate must be 'padded', 'packed' or a callable, got {collate!r}")
        self.collate = collate
        read_threads = check_int("read_threads", read_threads, least=1, optional=True)
        prefetch = check_int("prefetch", prefetch, optional=True)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be a callable on a batch, got {transform!r}")
        self.prefetch, self.read_threads = prefetch, read_threads
        self.transform = transform
        self.pin_memory, self.device = pin_memory, device
        check_delivery(pin_memory, device)
        self.progress_interval_s = progress_interval_s
        keep_last = check_int("keep_last", keep_last, least=1, optional=True)
        self.keep_last = keep_last
        self.policy_version: int | None = None
        """Set by the trainer; published with progress so producers can stamp samples."""
        self._mix: Steps | None = None
        self._streams: list[Stream] | None = None
        self._publisher: ProgressPublisher | None = None
        self._progress: MixProgress | None = None
        self.last_reader: StepReader | None = None
        self.stop: Stop | None = None
        """Set by ``StreamLoader`` for its workers: once the event is set, a worker waiting
        for a step that is not committed yet ends its iteration instead."""
        self._worker_next: int | None = None
        """In a DataLoader worker, the next step this worker reads (set by iterating it or by
        loading its state); None: ``start_step`` plus the worker's index."""
        self.mix.check_world(self.world_size)
        if self.policy.active and start_step:  # planned from here, not from step 0
            self._base, self._mix = (start_step, [start_step * self.global_batch_size]), None
        self.step_key = step_key
        for stream in self.streams:
            if step_key in stream.schema.names:
                raise ValueError(f"{stream.uri} has a column {step_key!r}, where each batch "
                                 "carries its step number: pass step_key= another name "
                                 "(e.g. 'lakestream_step')")
        check_columns(self.streams, columns)

    @property
    def mix(self) -> Steps:
        """This process's handles on the sources and their plan (opened lazily, again in
        each worker)."""
        if self._mix is None:
            base_step, starts = self._base
            streams = [Stream.open(s.uri, storage_options=s.storage_options,
                                   disk_cache=self.disk_cache) for s in self.sources]
            take = self.batch_size
            if take is not None and take % streams[0].group_size:
                raise ValueError(f"batch_size={take} splits the groups of {streams[0].uri} "
                                 f"(group size {streams[0].group_size}): pass a multiple "
                                 "of the group size")
            if self.policy.active:
                self._mix = SelectedSteps(streams[0], self.policy, base_step, starts[0])
            else:
                self._mix = mix_steps(self.sources, streams, shuffle_window=self.shuffle_window,
                                      seed=self.seed, epochs=self.epochs,
                                      base_step=base_step, starts=starts, keyed=self._keyed)
            self._streams = streams
            if self._progress is not None:
                self._progress.steps = self._mix
        return self._mix

    @property
    def streams(self) -> list[Stream]:
        """The handles on the sources' streams, in order (opened with ``mix``)."""
        self.mix  # noqa: B018 - opens them, with the plan over them
        assert self._streams is not None
        return self._streams

    @property
    def stream(self) -> Stream:
        """The handle on the (first) source's stream."""
        return self.streams[0]

    @property
    def global_batch_size(self) -> int:
        """Samples per step, over all ranks (the sum of the sources' takes)."""
        return self.mix.global_batch_size

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_mix"] = state["_streams"] = None  # a worker opens its own handles
        state["_publisher"] = None
        state["_progress"] = None
        state["last_reader"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        watch_parent()  # a spawned DataLoader worker gets the dataset first of all

    # -- iteration --------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        in_process = info is None
        if not in_process:
            watch_parent()
        waiting = self.disk_cache is not None or any(is_remote(s.uri) for s in self.sources)
        threads = self.read_threads or default_read_threads(workers if info else 0, waiting)
        cpu_slots().resize(read_slots(workers if info else 0))
        delivery = Delivery(self.pin_memory and in_process, self.device if in_process else None)
        reader = StepReader(self.mix, self.rank, self.world_size, columns=self.columns,
                            prefetch=default_prefetch(threads) if self.prefetch is None
                            else self.prefetch, threads=threads,
                            timeout=self.timeout, stop=self.stop,
                            finish=self._finisher(not in_process, delivery),
                            arrays=self._arrays(not in_process, delivery))
        self.last_reader = reader
        if self.group is not None and self.rank == 0 and worker == 0:
            self._register()
        first = self._worker_next if not in_process and self._worker_next is not None \
            else self.start_step + worker
        steps = worker_steps(first - worker, self.max_steps, worker, workers)
        try:
            with quick_gil_handoff() if in_process else contextlib.nullcontext():
                yield from self._items(reader, steps, delivery, in_process, workers)
        finally:
            if in_process:
                self.close()

    def _items(self, reader: StepReader, steps: Iterable[int], delivery: Delivery,
               in_process: bool, workers: int) -> Iterator[Any]:
        """The batches ``reader`` makes of ``steps``, each noted as it is yielded."""
        for step, item in reader.read(steps):
            item = delivery.hand_over(item)
            if in_process:
                self.record_step(step)
            else:  # this worker's copy: what a StatefulDataLoader saves per worker
                self.start_step, self._worker_next = step + 1, step + workers
            yield Batch(item) if type(item) is dict else item

    def _finisher(self, shared: bool, delivery: Delivery
                  ) -> Callable[[int, Any, dict[str, Any]], Any]:
        """What a read thread makes of a step's slice: the batch, collated (in shared memory
        in a worker), with its step and counts, transformed, delivered."""
        collate, transform, step_key, steps = self.collate, self.transform, self.step_key, \
            self.mix

        def finish(step: int, table: Any, tensors: dict[str, Any]) -> Any:
            item = collate(table) if callable(collate) else collate_table(table, collate,
                                                                          shared=shared)
            if tensors:
                item.update(tensors)
            if isinstance(item, dict):
                item[step_key] = step
                counts = steps.counts(step)
                if counts is not None:
                    item[COUNTS_KEY] = counts
            if transform is not None:
                item = transform(item)
            return delivery.prepare(item)

        return finish

    def _arrays(self, shared: bool, delivery: Delivery) -> Callable[[], ColumnArrays] | None:
        """What makes a step's arrays for the columns it reads directly (tensor columns, and
        columns of one number a row where every column read is one of these), read straight
        into them (in shared memory in a
        worker, pinned where the batch is delivered pinned or to a GPU); None where the
        dataset's own collation does not make the batch (a callable ``collate`` takes the
        table whole) or there is no such column."""
        if callable(self.collate):
            return None
        schema = self.stream.schema
        direct = direct_columns(schema, self.columns)
        if not direct:
            return None
        columns = {n: (d, tensor_spec(schema.field(n)) if d.prefixed else None)
                   for n, d in direct.items()}
        return partial(ColumnArrays, columns, shared=shared, pinned=delivery.pin)

    def _register(self) -> None:
        """Registers the group, on each source the log of which does not know it yet, where
        this job starts reading (at most the visible steps: holding from an earlier step is
        safe, from a later one would not be)."""
        assert self.group is not None
        for stream, step in zip(self.streams, self._source_steps(self.start_step), strict=True):
            if self.group in stream.groups:
                continue
            step = min(step, stream.num_steps)
            try:
                stream.register_group(self.group, step)
            except PermissionDeniedError as e:
                log.warning("could not register consumer group %r at step %d of %s (%s): it "
                            "holds no data until it commits a checkpoint marker; a job that "
                            "only reads passes group=None", self.group, step, stream.uri, e)

    def _source_steps(self, step: int) -> list[int]:
        """Each source's own step from which a run resuming at mix step ``step`` may read:
        what its registration and markers hold."""
        return stream_steps(self.mix.hold_from(step), self.streams)

    # -- state ------------------------------------------------------------------------

    def record_step(self, step: int) -> None:
        """Notes that ``step`` was consumed: the state now resumes at ``step + 1``, and rank 0
        publishes progress (at most every ``progress_interval_s``, and always the latest)."""
        self.start_step = step + 1
        if self.rank != 0 or self.progress_interval_s <= 0 or self.group is None:
            return
        if self._publisher is None:
            self._publisher = ProgressPublisher(self._job_progress(), self.progress_interval_s)
            # A dataset dropped without close() still stops its thread.
            weakref.finalize(self, self._publisher.stop)
        self._publisher.update(self.start_step, self.policy_version)

    def _job_progress(self) -> MixProgress:
        assert self.group is not None
        if self._progress is None:
            # The steps, not the dataset: the publisher thread must not keep the dataset alive
            # (a dataset dropped without close() stops it through a finalizer).
            self._progress = MixProgress(self.mix, [JobProgress(s.store, self.group, self.job)
                                                    for s in self.streams])
        return self._progress

    @property
    def progress_conflicts(self) -> int:
        """Publishes that found another job's progress in this group (see ``JobProgress``)."""
        return sum(p.conflicts for p in self._progress.parts) if self._progress is not None \
            else 0

    @property
    def publish_errors(self) -> int:
        """Progress publishes that failed (each was retried; see the ``lakestream`` log)."""
        return self._publisher.errors if self._publisher is not None else 0

    def close(self) -> None:
        """Publishes the last progress and stops the publisher thread. Iteration ending
        calls it; the next iteration starts the thread again."""
        if self._publisher is not None:
            self._publisher.stop()

    def publish_progress(self) -> None:
        """Publishes ``{step, policy_version}`` for the group now (rank 0 only; nothing
        without a group)."""
        if self.rank == 0 and self.group is not None:
            self._job_progress()(self.start_step, self.policy_version)

    @property
    def _plain(self) -> bool:
        """One stream, whole steps, log order: the states of earlier versions."""
        return len(self.sources) == 1 and self.sources[0].take is None \
            and not self.sources[0].cycle and self.shuffle_window is None \
            and self.epochs is None and self._base == (0, [0]) and not self.policy.active

    def _describe(self) -> dict[str, Any]:
        # "policy" is null without one, as in states saved before read policies existed.
        return {"sources": [s.describe() for s in self.sources],
                "shuffle_window": self.shuffle_window, "seed": self.seed,
                "epochs": self.epochs,
                "policy": self.policy.describe() if self.policy.active else None}

    def _identities(self) -> list[tuple[str, str]]:
        """Each source's URI and the id of the stream there: a state resumes only the streams
        that saved it, not another one with the same batch size or URI."""
        return [(source.uri, stream.meta.table_id)
                for source, stream in zip(self.sources, self.streams, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        """The resume point: the next step to read (torchdata/DCP ``Stateful``), the streams
        read (URI and creation id, as JSON under ``"streams"``), and for a mix its sources,
        their positions and the shuffle, as JSON under ``"mix"``. In a DataLoader worker it
        also holds the worker's own next step."""
        state: dict[str, Any] = {"version": STATE_VERSION, "next_step": self.start_step,
                                 "group": self.group,
                                 "global_batch_size": self.global_batch_size}
        # Always present (null for one stream in log order): DCP loads into the keys the
        # fresh dataset's state has, and requires each of them in the checkpoint.
        state["mix"] = json.dumps(None)
        state["streams"] = json.dumps([{"uri": uri, "id": table_id}
                                       for uri, table_id in self._identities()])
        if not self._plain:
            base_step, starts = self._base
            cursors = self.mix.cursors(self.start_step)
            if self.policy.active:  # planned one step after another: resume from here
                base_step, starts = self.start_step, cursors
            state["mix"] = json.dumps({**self._describe(), "base_step": base_step,
                                       "starts": starts, "cursors": cursors,
                                       "keyed": self._keyed})
        info = get_worker_info()
        if info is not None:
            state.update(worker=info.id, num_workers=info.num_workers,
                         worker_next_step=self._worker_next if self._worker_next is not None
                         else self.start_step + info.id)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes at the saved step; the world size may differ from the saving run's. A
        worker's state loaded into the same worker resumes that worker where it stopped.

        A mix resumes exactly when its sources, shuffle and epochs are those saved. If the
        sources changed (one added, removed, or given another take), each source found in
        the state resumes at its saved position (the start of its shuffle window: samples
        read from that window before are read again), a new one at its start.

        Raises:
            StreamMismatchError: the state was saved reading another stream than a source
                of the same URI (or, for one stream, than that stream) is: one created anew,
                or another altogether. States saved before identities were kept are not
                checked.
            LakestreamError: the state cannot resume here: a batch size or mix it does not
                fit, or a mix with epochs changed.
        """
        check_streams(state, self._identities(), self.global_batch_size)
        step = int(state["next_step"])
        saved = json.loads(state["mix"]) if "mix" in state else None
        if saved is None:
            check_batch_size(state, self.global_batch_size, self.uri)
        case = Resume.of(saved, self._describe(), policy=self.policy.active, plain=self._plain)
        if case.plans_again and "worker_next_step" in state:
            raise refuse_worker_state(saved)
        base, keyed = self._resumed(case, saved, step)
        if (base, keyed) != (self._base, self._keyed):
            self._mix = None  # planned again from the loaded base
        self._base, self._keyed = base, keyed
        self.start_step = step
        info = get_worker_info()
        self._worker_next = worker_next(state, None if info is None
                                        else (info.id, info.num_workers))

    def _resumed(self, case: Resume, saved: dict[str, Any] | None,
                 step: int) -> tuple[Base, bool]:
        """Where the steps are planned from after resuming at ``step`` in ``case``, and
        whether the plan keys permutations by the streams' identities.

        Raises:
            LakestreamError: the case cannot resume (a mix from a state in log order, a mix
                with epochs changed).
        """
        if case is Resume.LOG_ORDER:
            return self._base, self._keyed
        if case is Resume.POLICY_FROM_LOG_ORDER:  # planned one step after another from here
            return (step, [step * self.global_batch_size]), self._keyed
        if case is Resume.MIX_FROM_LOG_ORDER:
            raise LakestreamError(
                f"state was saved by a StreamDataset over one stream in log order, and "
                f"{self.uri} mixes, shuffles or repeats: start it at that step with "
                f"start_step={step} instead")
        assert saved is not None
        if case is Resume.SAME:
            return (int(saved["base_step"]), [int(x) for x in saved["starts"]]), \
                bool(saved.get("keyed", False))
        starts = changed_mix_starts(saved, self.sources, [s.sealed_at for s in self.streams],
                                    shuffle_window=self.shuffle_window, seed=self.seed,
                                    epochs=self.epochs)
        return (step, starts), True

    def load_loader_state(self, state: Any) -> list[int] | None:
        """Loads the ``StreamDataset`` state inside a DataLoader's state that resumes
        furthest (steps are consumed in order, so that is the resume point) and returns, per
        source, the lowest offset any of its workers' states resumes from under a read
        policy (each worker plans from its own step and cursor, a lagging one from further
        back), or None without a policy or without a state (a loader not started yet)."""
        found = dataset_states(state)
        if not found:
            return None
        self.load_state_dict(max(found, key=lambda s: int(s["next_step"])))
        if not self.policy.active:
            return None
        cursors = [json.loads(s["mix"])["cursors"] for s in found]
        return [min(int(c[i]) for c in cursors) for i in range(len(self.sources))]

    def commit_checkpoint(self, step: int | None = None,
                          checkpoint_id: str | None = None, *,
                          hold_offsets: Sequence[int] | None = None) -> int | None:
        """Commits the marker "this group has a durable checkpoint resuming at ``step``"
        (default: the next step to read) on every source's stream, each at the first step
        of that stream the resumed run may read. Call it on every rank after the
        distributed checkpoint is saved; rank 0 commits, the others return None. With
        ``keep_last`` set on the dataset, rank 0 then runs retention (``Stream.retain``) on
        each source. ``hold_offsets`` (per source) holds each from no later than that offset
        (what ``load_loader_state`` returns).

        Returns:
            The log version of the (first source's) marker (rank 0).

        Raises:
            ValueError: the dataset reads without a group (``group=None``).
        """
        if self.group is None:
            raise ValueError(f"a StreamDataset of {self.uri} with group=None commits nothing: "
                             "pass group= to checkpoint as a consumer group")
        if self.rank != 0:
            return None
        step = self.start_step if step is None else step
        steps = self._source_steps(step)
        if hold_offsets is not None:
            steps = [min(s, held) for s, held in zip(
                steps, stream_steps(hold_offsets, self.streams), strict=True)]
        versions = [stream.mark_checkpoint(self.group, s, checkpoint_id)
                    for stream, s in zip(self.streams, steps, strict=True)]
        self.publish_progress()
        if self.keep_last is not None:
            for stream in self.streams:
                stream.retain(keep_last=self.keep_last)
        return versions[0]
