"""Reading samples by offset from a handle's view of the log: the offsets checked committed and
not reclaimed, their fragments looked up (recovering from a damaged index segment), their rows
read; a rank's slice of a step; a step's lineage. And ``Readable``: what the steps over open
streams ask of one (``lakestream.Stream`` is one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import pyarrow as pa

from lakestream.errors import StepNotAvailableError
from lakestream.log.entries import StreamMeta
from lakestream.log.replay import ReplayState
from lakestream.log.segments import Fragment, SegmentError
from lakestream.log.view import LogView
from lakestream.plan.slices import check_world, slice_offsets
from lakestream.read.cache import FragmentCache
from lakestream.read.fragments import FragmentReader, LastStep
from lakestream.read.lineage import StepLineage, step_lineage
from lakestream.read.spans import read_spans
from lakestream.read.tensors import ColumnSink
from lakestream.store.diskcache import DiskCache


class Readable(Protocol):
    """An open stream as the read side reads it: its shape, what is committed, its rows."""

    uri: str

    @property
    def meta(self) -> StreamMeta: ...
    @property
    def state(self) -> ReplayState: ...
    @property
    def schema(self) -> pa.Schema: ...
    @property
    def global_batch_size(self) -> int: ...
    @property
    def group_size(self) -> int: ...
    @property
    def num_samples(self) -> int: ...
    @property
    def sealed_at(self) -> int | None: ...
    def refresh(self) -> int: ...
    def poll(self) -> int: ...
    def poll_wait_s(self) -> float: ...
    def read_offsets(self, spans: Sequence[tuple[int, int]], columns: list[str] | None = None,
                     *, what: str | None = None, cache: FragmentCache | None = None,
                     last_step: LastStep | None = None,
                     sink: ColumnSink | None = None) -> pa.Table: ...


class OffsetReader:
    """Reads the samples of a view's stream by offset (see ``Stream.read_offsets``)."""

    def __init__(self, view: LogView, disk: DiskCache | None = None) -> None:
        self._view = view
        self._fragments = FragmentReader(view.store, schema=view.state.stream_meta.schema,
                                         disk=disk)

    def read(self, spans: Sequence[tuple[int, int]], columns: list[str] | None = None, *,
             what: str | None = None, cache: FragmentCache | None = None,
             last_step: LastStep | None = None, sink: ColumnSink | None = None) -> pa.Table:
        """The samples at offsets ``[lo, hi)`` of each span, in the order given (through
        ``cache``, kept until ``last_step``; the sink's tensor columns into its arrays, not
        the table: see ``read_spans``).

        Raises:
            StepNotAvailableError: an offset is not committed yet, or was reclaimed.
            ValueError: an unknown column, or an empty or reversed span.
        """
        if not spans or any(lo >= hi or lo < 0 for lo, hi in spans):
            raise ValueError(f"spans must be non-empty [lo, hi) ranges, got {list(spans)[:4]}")
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        what = what or f"offsets [{lo}, {hi})"
        view = self._view
        if hi > view.state.next_offset:
            view.refresh()
        try:
            fragments = self._visible(view.state, what, lo, hi)
        except SegmentError as e:
            fragments = self._visible(view.recover(e), what, lo, hi)
        schema = view.state.stream_meta.schema
        if columns is not None:
            unknown = [c for c in columns if c not in schema.names]
            if unknown:
                raise ValueError(f"unknown columns {unknown}; the stream has {schema.names}")
        parts = read_spans(self._fragments, fragments, spans, columns, cache, last_step, sink)
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        if sink is not None:
            schema = pa.schema([f for f in schema if f.name not in sink.columns])
        return pa.concat_tables(parts) if parts and parts[0].num_columns \
            else schema.empty_table()

    def read_step(self, step: int, rank: int, world_size: int,
                  columns: list[str] | None = None) -> pa.Table:
        """Rank ``rank`` of ``world_size``'s slice of global batch ``step``.

        Raises:
            StepNotAvailableError: the step is not committed yet, or was reclaimed.
            ValueError: the world cannot split the step (``lakestream.plan.slices``).
        """
        meta = self._view.state.stream_meta
        check_world(meta.global_batch_size, meta.group_size, world_size)
        span = slice_offsets(step, meta.global_batch_size, rank, world_size)
        return self.read([(span.start, span.stop)], columns, what=f"step {step}")

    def lineage(self, step: int) -> StepLineage:
        """The lineage of ``step`` (see ``Stream.lineage``), looked for once more after a
        refresh if it is not visible yet.

        Raises:
            ValueError: ``step`` is negative or not an int.
            StepNotAvailableError: the step is not committed yet.
        """
        view = self._view
        if isinstance(step, int) and step >= view.state.num_steps:
            view.refresh()

        def read(spans: Sequence[tuple[int, int]], columns: list[str]) -> pa.Table:
            return self.read(spans, columns, what=f"step {step}")

        try:
            return step_lineage(view.state, step, read, uri=view.uri)
        except SegmentError as e:
            return step_lineage(view.recover(e), step, read, uri=view.uri)

    def _visible(self, s: ReplayState, what: str, lo: int, hi: int) -> list[Fragment]:
        if lo < s.reclaimed_below:
            raise StepNotAvailableError(
                f"{what} of {self._view.uri} was reclaimed by retention: steps below "
                f"{s.first_retained_step} cannot be read; resume from a retained checkpoint"
            )
        if hi > s.next_offset:
            raise StepNotAvailableError(
                f"{what} of {self._view.uri} is not visible yet: {s.num_steps} steps are "
                f"committed (version {s.version})"
            )
        return s.fragments_between(lo, hi)
