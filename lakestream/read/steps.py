"""The steps of a mix over open streams: whether a step is readable yet, whether the mix has
ended before it, and a rank's rows of it (``lakestream.plan.mix`` plans; this reads)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from lakestream.plan.mix import MixPlan, SourcePlan, source_key
from lakestream.read.cache import FragmentCache
from lakestream.read.offsets import Readable
from lakestream.read.tensors import Alloc, ColumnSink, Direct, direct_columns


@dataclass(frozen=True)
class Source:
    """One stream of a mix: ``take`` samples of it go into every step (None: the stream's
    global batch size); ``cycle`` wraps a sealed stream around for up-sampling."""

    uri: str
    take: int | None = None
    cycle: bool = False
    storage_options: dict[str, str] | None = field(default=None, compare=False, hash=False,
                                                   repr=False)

    def describe(self) -> dict[str, object]:
        """What identifies the source in a saved state."""
        return {"uri": self.uri, "take": self.take, "cycle": self.cycle}


def mix_steps(sources: Sequence[Source], streams: Sequence[Readable], *,
              shuffle_window: int | None = None, seed: int = 0, epochs: int | None = None,
              base_step: int = 0, starts: Sequence[int] | None = None,
              keyed: bool = True) -> MixSteps:
    """The mix of ``sources`` over their open ``streams`` (one each, in order; see
    ``lakestream.plan.mix``). ``keyed``: each source's permutations are keyed by its
    stream's identity (False: by its index, as plans were before).

    Raises:
        ValueError: the plan is invalid (named), e.g. ``cycle`` on a stream not sealed.
    """
    for s, st in zip(sources, streams, strict=True):
        trimmed = st.state.reclaimed_below
        if trimmed and (s.cycle or epochs is not None):
            raise ValueError(f"{s.uri}: retention reclaimed its samples below offset "
                             f"{trimmed}, and cycle or epochs read a source from its start")
    starts = list(starts) if starts is not None else [0] * len(sources)
    plans = [SourcePlan(s.take if s.take is not None else st.global_batch_size,
                        st.group_size, cycle=s.cycle, sealed=st.sealed_at, start=start,
                        key=source_key(st.meta.table_id) if keyed else None)
             for s, st, start in zip(sources, streams, starts, strict=True)]
    try:
        plan = MixPlan(plans, shuffle_window=shuffle_window, seed=seed, epochs=epochs,
                       base_step=base_step)
    except ValueError as e:
        names = {f"source {i}": s.uri for i, s in enumerate(sources)}
        message = str(e)
        for name, uri in names.items():
            message = message.replace(name, f"{name} ({uri})")
        raise ValueError(message) from None
    return MixSteps(streams, plan)


def stream_steps(offsets: Sequence[int], streams: Sequence[Readable]) -> list[int]:
    """Each source's offset as a step of its own stream: the step that holds it
    (``StreamMeta.step_of``). How a mix's positions become what each stream's consumer
    group holds and publishes (its registration, markers and progress are in its own
    steps)."""
    return [stream.meta.step_of(offset) for offset, stream in zip(offsets, streams, strict=True)]


def check_columns(streams: Sequence[Readable], columns: list[str] | None) -> None:
    """Checks that every source has ``columns`` (all of the first's if None), of the same
    types: a mix's step concatenates its sources' rows.

    Raises:
        ValueError: naming the column and the sources that disagree.
    """
    first = streams[0]
    for stream in streams:
        if columns is not None:
            unknown = [c for c in columns if c not in stream.schema.names]
            if unknown:
                raise ValueError(f"unknown columns {unknown}; {stream.uri} has "
                                 f"{stream.schema.names}")
        for name in columns if columns is not None else first.schema.names:
            theirs = stream.schema.field(name).type if name in stream.schema.names else None
            if theirs != first.schema.field(name).type:
                raise ValueError(
                    f"sources disagree on column {name!r}: {first.uri} has "
                    f"{first.schema.field(name).type}, {stream.uri} has {theirs}; pass "
                    "columns= the ones they share")


class Steps(Protocol):
    """What readers and datasets ask of a sequence of steps: a mix (``MixSteps``) or one
    stream under a read-time policy (``lakestream.read.selected``)."""

    streams: list[Readable]

    @property
    def uri(self) -> str: ...
    @property
    def global_batch_size(self) -> int: ...
    def check_world(self, world_size: int) -> None: ...
    def ready(self, step: int) -> bool: ...
    def ended(self, step: int) -> bool: ...
    def poll(self) -> float:
        """Reads what was committed since; returns the seconds until polling again can see
        more (the pacing of the process's shared heads: ``lakestream.log.head``)."""
    def committed(self) -> str: ...
    def read(self, step: int, rank: int, world_size: int,
             columns: list[str] | None = None, *, alloc: Alloc | None = None) -> pa.Table:
        """Rank ``rank``'s rows of ``step``; with ``alloc``, the tensor columns go into the
        arrays it makes (``MixSteps.read``), where the steps can put them there."""
    def cursors(self, step: int) -> list[int]:
        """Per source, the position a run resuming at ``step`` continues from."""
    def hold_from(self, step: int) -> list[int]:
        """Per source, the lowest offset a run resuming at ``step`` may read."""
    def progress_offsets(self, step: int) -> list[int]:
        """Per source, the offset the reader is taken to have reached at ``step`` (what its
        producers' ``max_lag_steps`` follows)."""
    def counts(self, step: int) -> dict[str, int] | None:
        """Samples a read-time policy dropped or masked at ``step`` (None: it has none)."""
    def expect_overtaking(self, steps: int) -> None:
        """A reader keeps up to ``steps`` steps in flight: what a step shares with later
        ones is kept until that many have begun after it."""


CACHE_BYTES = 512 << 20
"""What a shuffled mix may keep decoded per process: a window's fragments, so that its steps
fetch and decode each fragment once rather than once per step."""
SEAM_CACHE_BYTES = 64 << 20
"""What a mix in log order may keep: the fragments a step shares with the next ones (a
fragment may hold several steps' samples, and a take need not end on a fragment's end)."""


@dataclass(frozen=True)
class StepPass:
    """What a read of ``step`` fetches of source ``source``: kept until the last step that
    may read it (``MixPlan.last_step``), and ``final`` where no later pass of the plan reads
    it again (``MixPlan.reads_again``)."""

    plan: MixPlan
    source: int
    step: int

    def __call__(self, lo: int, hi: int) -> int:
        return self.plan.last_step(self.source, self.step, lo, hi)

    @property
    def final(self) -> bool:
        return not self.plan.reads_again(self.source, self.step)


class MixSteps:
    """``plan`` over ``streams`` (one per source, in order). A plan made before a source
    was sealed takes its seal into account as soon as a handle sees it."""

    def __init__(self, streams: Sequence[Readable], plan: MixPlan) -> None:
        if len(streams) != len(plan.sources):
            raise ValueError(f"{len(streams)} streams for {len(plan.sources)} sources")
        self.streams = list(streams)
        self._plan = plan
        self.cache = FragmentCache(CACHE_BYTES if plan.shuffle_window is not None
                                   else SEAM_CACHE_BYTES)
        """What this process's reads of the steps share of the sources' fragments, each kept
        until the last step that may read it (``MixPlan.last_step``)."""
        self._direct: dict[tuple[str, ...] | None, dict[str, Direct]] = {}
        """Per set of columns read, those read directly (``direct_columns``)."""

    def _sink(self, spans: list[list[tuple[int, int]]], columns: list[str] | None,
              alloc: Alloc) -> ColumnSink | None:
        """Arrays, made by ``alloc``, for the columns of a step of these spans that are read
        directly (``direct_columns``)."""
        key = None if columns is None else tuple(columns)
        specs = self._direct.get(key)
        if specs is None:
            specs = self._direct[key] = direct_columns(self.streams[0].schema, columns)
        if not specs:
            return None
        rows = sum(hi - lo for s in spans for lo, hi in s)
        return ColumnSink(specs, {name: alloc(name, rows) for name in specs})

    @classmethod
    def single(cls, stream: Readable) -> MixSteps:
        """A stream's own steps, in log order."""
        return cls([stream], MixPlan([SourcePlan(stream.global_batch_size, stream.group_size,
                                                 sealed=stream.sealed_at)]))

    @property
    def uri(self) -> str:
        return " + ".join(s.uri for s in self.streams)

    @property
    def plan(self) -> MixPlan:
        """The plan with every seal the handles have seen."""
        self._plan = self._plan.with_sealed([s.sealed_at for s in self.streams])
        return self._plan

    @property
    def global_batch_size(self) -> int:
        return self._plan.global_batch_size

    def check_world(self, world_size: int) -> None:
        self._plan.check_world(world_size)

    def cursors(self, step: int) -> list[int]:
        return self.plan.cursor(step)

    def hold_from(self, step: int) -> list[int]:
        return self.plan.hold_from(step)

    def progress_offsets(self, step: int) -> list[int]:
        plan = self.plan
        # A shuffled step waits for its whole window: progress counts the window as taken,
        # or producers held to max_lag_steps behind it could never complete it.
        ahead = plan.needed(step) if plan.shuffle_window is not None \
            and not plan.ended(step) else [0] * len(self.streams)
        # What the steps before ``step`` read: with epochs a position wraps to the start of
        # the next epoch, and at the mix's end that read as nothing read at all.
        reached = [plan.position(i, step - 1) + src.take if step > plan.base_step
                   else plan.position(i, step) for i, src in enumerate(plan.sources)]
        return [max(r, a) for r, a in zip(reached, ahead, strict=True)]

    def counts(self, step: int) -> dict[str, int] | None:
        return None

    def expect_overtaking(self, steps: int) -> None:
        self.cache.expect_overtaking(steps)

    def ended(self, step: int) -> bool:
        """Whether the mix ends before ``step`` (a sealed, non-cycling source ran out)."""
        return self.plan.ended(step)

    def ready(self, step: int) -> bool:
        """Whether every source has committed what ``step`` reads (so every rank may)."""
        if self.ended(step):
            return False
        plan = self.plan
        return all(n <= s.num_samples for n, s in zip(plan.needed(step), self.streams,
                                                      strict=True))

    def poll(self) -> float:
        for s in self.streams:
            s.poll()
        return min(s.poll_wait_s() for s in self.streams)

    def committed(self) -> str:
        """What the sources hold, for messages."""
        return ", ".join(f"{s.num_samples} samples in {s.uri}" for s in self.streams)

    def read(self, step: int, rank: int, world_size: int,
             columns: list[str] | None = None, *, alloc: Alloc | None = None) -> pa.Table:
        """Rank ``rank`` of ``world_size``'s rows of ``step``: each source's share, in
        source order. With ``alloc``, each column of the first source's schema among
        ``columns`` that is read directly (``direct_columns``: tensor columns, and 32- and
        64-bit numbers where every column read is one of these) goes into the
        ``[rows, nbytes]`` uint8 array ``alloc(name, rows)`` makes (copied from the
        fragments' bytes: ``lakestream.read.tensors``), not into the table.

        Raises:
            StepNotAvailableError: a source has not committed them yet, or reclaimed them.
        """
        plan = self.plan
        what = f"step {step}" if len(self.streams) == 1 else f"step {step} of the mix"
        spans = plan.rank_spans(step, rank, world_size)
        sink = self._sink(spans, columns, alloc) if alloc is not None else None
        self.cache.begin(step)
        try:
            parts, at = [], 0
            for i, (stream, s) in enumerate(zip(self.streams, spans, strict=True)):
                if not s:
                    continue
                rows = sum(hi - lo for lo, hi in s)
                parts.append(stream.read_offsets(
                    s, columns, what=what, cache=self.cache,
                    last_step=StepPass(plan, i, step),
                    sink=None if sink is None else sink.part(at, rows)))
                at += rows
        finally:
            self.cache.end(step)
        if len(parts) == 1:
            return parts[0]
        # Sources agree on the columns' types (``check_columns``); nullability or metadata
        # may differ.
        schema = parts[0].schema
        return pa.concat_tables([p if p.schema == schema else p.cast(schema) for p in parts])
