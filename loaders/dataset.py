"""StreamDataset: every rank's slice of the same global batches, as a PyTorch IterableDataset.

A thin iterable over the parts beside it: its options (``loaders/options.py``), the steps it
reads and the state that resumes them (``loaders/planned.py``, ``loaders/resume.py``), its
place in a consumer group (``loaders/membership.py``: registration, progress, markers,
retention), and the read pipeline (``loaders/pipeline.py``, ``loaders/reader.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from lakestream.loaders.collate import Batch
from lakestream.loaders.device import Delivery
from lakestream.loaders.host import quick_gil_handoff
from lakestream.loaders.membership import Membership
from lakestream.loaders.options import ReadOptions
from lakestream.loaders.pipeline import open_reader
from lakestream.loaders.planned import PlannedSteps, sources_of
from lakestream.loaders.planning import resolve_rank, worker_steps
from lakestream.loaders.reader import StepReader, Stop
from lakestream.loaders.watchdog import watch_parent
from lakestream.reading import (
    Source,
    Steps,
    check_columns,
    check_group,
    check_int,
    stream_steps,
)
from lakestream.stream import Stream


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
        uri: the stream, or the sources of a mix (a list of ``Source``).
        group: the consumer group, or None to read without one.
        options: a ``ReadOptions`` (``loaders/options.py``, which says what each does);
            keyword arguments of the same names override its fields
            (``StreamDataset(uri, read_threads=4, transform=decode)``).

    Raises:
        TypeError: an option that does not exist, or of the wrong type. ValueError: an
            option out of range, a bad read-time policy (``accept`` a lambda, nested
            function or other callable its module and name do not find again), or one with
            a mix.
    """

    def __init__(self, uri: str | Sequence[Source], group: str | None = "train",
                 options: ReadOptions | None = None, **settings: Any) -> None:
        super().__init__()
        self.options = options = ReadOptions.of(options, settings)
        self.group = None if group is None else check_group(group)
        self.planned = PlannedSteps(sources_of(uri, options), options)
        self.rank, self.world_size = resolve_rank(options.rank, options.world_size,
                                                  distributed=_distributed())
        self.membership = Membership(self.group, self.rank,
                                     progress_interval_s=options.progress_interval_s,
                                     keep_last=options.keep_last)
        self.policy_version: int | None = None
        """Set by the trainer; published with progress so producers can stamp samples."""
        self.last_reader: StepReader | None = None
        self.stop: Stop | None = None
        """Set by ``StreamLoader`` for its workers: once the event is set, a worker waiting
        for a step that is not committed yet ends its iteration instead."""
        self.mix.check_world(self.world_size)
        for stream in self.streams:
            if options.step_key in stream.schema.names:
                raise ValueError(f"{stream.uri} has a column {options.step_key!r}, where each "
                                 "batch carries its step number: pass step_key= another "
                                 "name (e.g. 'lakestream_step')")
        check_columns(self.streams, options.columns)

    @property
    def sources(self) -> list[Source]:
        return self.planned.sources

    @property
    def uri(self) -> str:
        """The stream's URI (a mix's: its sources', joined by " + ")."""
        return self.planned.uri

    @property
    def mix(self) -> Steps:
        """This process's plan over the sources (opened lazily, again in each worker)."""
        return self.planned.mix

    @property
    def streams(self) -> list[Stream]:
        """The handles on the sources' streams, in order (opened with ``mix``)."""
        return self.planned.streams

    @property
    def stream(self) -> Stream:
        """The handle on the (first) source's stream."""
        return self.streams[0]

    @property
    def global_batch_size(self) -> int:
        """Samples per step, over all ranks (the sum of the sources' takes)."""
        return self.planned.global_batch_size

    @property
    def start_step(self) -> int:
        """The next step to read: where ``state_dict()`` resumes."""
        return self.planned.start_step

    @start_step.setter
    def start_step(self, step: int) -> None:
        self.planned.start_step = check_int("start_step", step)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "last_reader": None}

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
        reader, delivery = open_reader(self.mix, self.streams, self.options, self.rank,
                                       self.world_size, workers=None if in_process
                                       else workers, stop=self.stop)
        self.last_reader = reader
        if worker == 0 and self.membership.leads:
            self.membership.register(self.streams, self.planned.source_steps(self.start_step))
        planned = self.planned
        first = planned.worker_next if not in_process and planned.worker_next is not None \
            else self.start_step + worker
        steps = worker_steps(first - worker, self.options.max_steps, worker, workers)
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
                self.planned.start_step, self.planned.worker_next = step + 1, step + workers
            yield Batch(item) if type(item) is dict else item

    # -- the group and the state --------------------------------------------------------

    def record_step(self, step: int) -> None:
        """Notes that ``step`` was consumed: the state now resumes at ``step + 1``, and rank 0
        publishes progress (at most every ``progress_interval_s``, and always the latest)."""
        self.planned.start_step = step + 1
        if self.membership.leads:  # only then are the plan and its streams needed here
            self.membership.record(step + 1, self.policy_version, self.mix, self.streams)

    @property
    def progress_conflicts(self) -> int:
        """Publishes that found another job's progress in this group (see ``JobProgress``)."""
        return self.membership.conflicts

    @property
    def publish_errors(self) -> int:
        """Progress publishes that failed (each was retried; see the ``lakestream`` log)."""
        return self.membership.publish_errors

    def close(self) -> None:
        """Publishes the last progress and stops the publisher thread. Iteration ending
        calls it; the next iteration starts the thread again."""
        self.membership.close()

    def publish_progress(self) -> None:
        """Publishes ``{step, policy_version}`` for the group now (rank 0 only; nothing
        without a group)."""
        if self.membership.leads:
            self.membership.publish(self.start_step, self.policy_version, self.mix,
                                    self.streams)

    def state_dict(self) -> dict[str, Any]:
        """The resume point: the next step to read (torchdata/DCP ``Stateful``), the streams
        read (URI and creation id, as JSON under ``"streams"``), and for a mix its sources,
        their positions and the shuffle, as JSON under ``"mix"``. In a DataLoader worker it
        also holds the worker's own next step."""
        return self.planned.state_dict(self.group)

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
        self.planned.load_state_dict(state)
        if self.membership.publishing:
            self.membership.follow(self.mix)

    def load_loader_state(self, state: Any) -> list[int] | None:
        """Loads the ``StreamDataset`` state inside a DataLoader's state that resumes
        furthest (steps are consumed in order, so that is the resume point) and returns, per
        source, the lowest offset any of its workers' states resumes from under a read
        policy (each worker plans from its own step and cursor, a lagging one from further
        back), or None without a policy or without a state (a loader not started yet)."""
        held = self.planned.load_loader_state(state)
        if self.membership.publishing:
            self.membership.follow(self.mix)
        return held

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
        steps = self.planned.source_steps(self.start_step if step is None else step)
        if hold_offsets is not None:
            steps = [min(s, held) for s, held in zip(
                steps, stream_steps(hold_offsets, self.streams), strict=True)]
        version = self.membership.mark(self.streams, steps, checkpoint_id)
        self.publish_progress()
        self.membership.retain(self.streams)
        return version
