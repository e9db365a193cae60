"""Step lineage: where each sample of a global batch came from, and which checkpoint markers
replay it, from the log alone (docs/design.md §10)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lakestream.checks import check_int
from lakestream.errors import StepNotAvailableError
from lakestream.log.keys import key_writer
from lakestream.log.replay import Marker, ReplayState
from lakestream.log.segments import Fragment

POLICY_COLUMNS = ("policy_version", "policy_version_min", "policy_version_max")
"""The columns a sample's policy version is read from, those of them the stream has."""

ReadColumns = Callable[[Sequence[tuple[int, int]], list[str]], pa.Table]
"""Reads the given columns of the samples at offsets ``[lo, hi)`` of each span, in order."""


@dataclass(frozen=True)
class SampleLineage:
    """One sample of a step: the fragment and writer it came from, and its policy version.

    ``producer``, ``epoch`` and ``seq`` are parsed from the fragment's path,
    ``data/<producer>/<epoch>-<seq>-<uuid>.parquet``. A sample of ``Stream.append`` has
    producer None and the epoch and seq of its path (0 and 0); a path of another shape
    (not written by Lakestream) gives None for all three. The policy fields are the values
    of the columns of those names, None where the stream has no such column.
    """

    offset: int
    producer: str | None
    epoch: int | None
    seq: int | None
    path: str
    version: int
    """The log version that committed the fragment."""
    policy_version: Any = None
    policy_version_min: Any = None
    policy_version_max: Any = None

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "producer": self.producer, "epoch": self.epoch,
                "seq": self.seq, "path": self.path, "version": self.version,
                "policy_version": self.policy_version,
                "policy_version_min": self.policy_version_min,
                "policy_version_max": self.policy_version_max}


@dataclass(frozen=True)
class StepLineage:
    """What went into global batch ``step`` (offsets ``[step*B, (step+1)*B)``) as of log
    ``version``, and the markers a trainer can resume from to replay it.

    ``reclaimed``: retention removed the step's data; ``samples`` and ``markers`` are then
    empty. ``markers`` are those of every consumer group whose resume step is at or below
    ``step`` and still readable, ordered by group, then commit: resuming from any of them
    replays this step. A marker whose own step was reclaimed is left out (resuming from it
    fails).
    """

    uri: str
    step: int
    global_batch_size: int
    version: int
    reclaimed: bool
    samples: tuple[SampleLineage, ...]
    markers: tuple[Marker, ...]

    @property
    def offsets(self) -> tuple[int, int]:
        """The step's offsets ``[lo, hi)``."""
        b = self.global_batch_size
        return self.step * b, (self.step + 1) * b

    def to_json(self) -> dict[str, Any]:
        lo, hi = self.offsets
        return {"uri": self.uri, "step": self.step, "offsets": [lo, hi],
                "version": self.version, "reclaimed": self.reclaimed,
                "samples": [x.to_json() for x in self.samples],
                "markers": [{"group": m.group, "step": m.step,
                             "checkpoint_id": m.checkpoint_id, "version": m.version}
                            for m in self.markers]}


def step_lineage(state: ReplayState, step: int, read: ReadColumns, *, uri: str) -> StepLineage:
    """The lineage of ``step`` in ``state``. Reads nothing but the policy-version columns
    of the step's samples, through ``read``, and only if the stream has such columns.

    Raises:
        ValueError: ``step`` is negative or not an int.
        StepNotAvailableError: the step is not committed in ``state``.
    """
    step = check_int("step", step)
    meta = state.stream_meta
    lo, hi = meta.offset(step), meta.offset(step + 1)
    if hi > state.next_offset:
        raise StepNotAvailableError(
            f"step {step} of {uri} is not committed yet: {state.num_steps} steps are "
            f"committed (version {state.version}); ask for a step below {state.num_steps}")
    if lo < state.reclaimed_below:
        return StepLineage(uri, step, meta.global_batch_size, state.version, True, (), ())
    markers = tuple(m for g in sorted(state.markers) for m in state.markers[g]
                    if meta.offset(m.step) >= state.reclaimed_below and m.step <= step)
    columns = [c for c in POLICY_COLUMNS if c in state.stream_meta.schema.names]
    values = read([(lo, hi)], columns).to_pydict() if columns else {}
    samples = []
    for f in state.fragments_between(lo, hi):
        producer, epoch, seq = fragment_writer(f)
        for offset in range(max(lo, f.offset), min(hi, f.end)):
            policy = {c: values[c][offset - lo] for c in columns}
            samples.append(SampleLineage(offset, producer, epoch, seq, f.path, f.version,
                                         **policy))
    return StepLineage(uri, step, meta.global_batch_size, state.version, False,
                       tuple(samples), markers)


def fragment_writer(fragment: Fragment) -> tuple[str | None, int | None, int | None]:
    """``(producer, epoch, seq)`` of a fragment, from its path (see ``SampleLineage``)."""
    writer = key_writer(fragment.path)
    return (None, None, None) if writer is None else writer
