"""The entries a stream commits: appends (a producer's fragments, or a table appended as one
fragment by the handle), a producer's fence, a checkpoint marker, a consumer group's
registration and removal, the seal.

Each entry is made by a ``Build`` that runs on the state it would commit on, so its
precondition is checked on exactly that state (a ``retain`` landing first makes a marker
fail, never point at reclaimed data); see ``lakestream.log.transaction``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from zlib_ng import zlib_ng

from lakestream.checks import check_int
from lakestream.errors import LakestreamError, ProducerFencedError, StepNotAvailableError
from lakestream.log.actions import dump_line
from lakestream.log.entries import (
    MAX_INFO_BYTES,
    Append,
    Checkpoint,
    Entry,
    Fence,
    FragmentRef,
    Register,
    RemoveGroup,
    Seal,
    SharedAppend,
)
from lakestream.log.fragments import check_rows, encode_fragment, put_fragment
from lakestream.log.keys import ANONYMOUS, check_group, fragment_key
from lakestream.log.outcomes import Build, CommitOptions, unwrap
from lakestream.log.replay import ReplayState, refuse_if_sealed
from lakestream.log.view import LogView
from lakestream.schema.conform import conform

log = logging.getLogger("lakestream")


class Uploaded(Protocol):
    """A fragment in the store, waiting for the append that commits it."""

    @property
    def key(self) -> str: ...
    @property
    def rows(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def crc32(self) -> int: ...
    @property
    def state(self) -> Any: ...


class Stored(NamedTuple):
    """An ``Uploaded`` fragment as plain values."""

    key: str
    rows: int
    size: int
    seq: int
    crc32: int
    state: Any


def fencing(producer: str) -> Build:
    """The fence of a producer's next instance: the epoch after the log's, which voids the
    later commits of every older instance."""

    def build(state: ReplayState, commit_id: str) -> Entry:
        current = state.producers.get(producer)
        return Fence(producer, (current.epoch if current else 0) + 1, commit_id)

    return build


def appending(uri: str, producer: str | None, epoch: int,
              fragments: Sequence[Uploaded]) -> Build:
    """The append of ``fragments`` (in the store, in seq order) by ``producer`` at ``epoch``
    (None: a plain append, of no producer), made on the state it commits on: refused on a
    sealed stream, and for a producer a newer instance fenced; the seqs the log holds from
    this producer already dropped (a commit whose answer was lost, sent again), nothing if
    that is all of them; offsets from the state's next one; the last fragment's ``state``
    committed with them.

    Raises:
        StreamSealedError: the stream is sealed. ProducerFencedError: a newer epoch of
            ``producer`` is in the log.
    """

    def build(state: ReplayState, commit_id: str) -> Entry | None:
        refuse_if_sealed(state, uri)
        if producer is not None:
            refuse_if_fenced(state, uri, producer, epoch)
        return _part(state, producer, epoch, fragments, state.next_offset, commit_id)

    return build


def refuse_if_fenced(state: ReplayState, uri: str, producer: str, epoch: int) -> None:
    """Raises ProducerFencedError if ``state`` holds a newer epoch of ``producer`` than
    ``epoch``: a newer instance of it is running."""
    mine = state.producers.get(producer)
    if mine is not None and mine.epoch > epoch:
        raise ProducerFencedError(
            f"producer {producer} epoch {epoch} was fenced by epoch {mine.epoch} at or before "
            f"version {state.version} of {uri}: a newer instance is running; stop this one")


class Run(NamedTuple):
    """One producer's uploaded fragments, in seq order, for a shared append."""

    producer: str
    epoch: int
    fragments: Sequence[Uploaded]


SHARED_INFO_BYTES = MAX_INFO_BYTES - (8 << 10)
"""What the parts of a shared append may take of its first line (``MAX_INFO_BYTES``), the
rest left for the entry's own fields."""
PART_INFO_BYTES = 320
"""What a part takes of the first line besides its state: its producer id (at most 128
characters), epoch, seqs and count."""


def sharing(uri: str, host: str, runs: Sequence[Run]) -> Build:
    """The shared append (``SharedAppend``) by ``host`` of ``runs`` (in order of priority),
    made on the state it commits on: refused on a sealed stream; left out, a producer's runs
    of an older epoch than its newest (here or in the log: fenced), the seqs the log holds
    already, any past a gap in a producer's seqs (what it uploaded before them is not here
    yet), a run holding a fragment no writer writes (rows not a positive multiple of the
    group size: it would void the entry), and parts past what the entry's first line holds
    of states (``SHARED_INFO_BYTES``: the next commit takes them); nothing if no run has
    anything left.

    Raises:
        StreamSealedError: the stream is sealed.
    """
    newest: dict[str, int] = {}
    for run in runs:
        newest[run.producer] = max(newest.get(run.producer, run.epoch), run.epoch)

    def build(state: ReplayState, commit_id: str) -> Entry | None:
        refuse_if_sealed(state, uri)
        group = state.stream_meta.group_size
        parts, offset, info_bytes, taken = [], state.next_offset, 0, set()
        for run in runs:
            mine = state.producers.get(run.producer)
            if run.epoch < newest[run.producer] or run.producer in taken or \
                    mine is not None and mine.epoch > run.epoch or \
                    any(u.rows <= 0 or u.rows % group for u in run.fragments):
                continue
            committed = mine.seq if mine is not None else -1
            part = _part(state, run.producer, run.epoch,
                         _contiguous(run.fragments, committed), offset, commit_id)
            if part is None:
                continue
            cost = len(dump_line({"state": part.state})) + PART_INFO_BYTES
            if info_bytes + cost > SHARED_INFO_BYTES:
                continue
            info_bytes += cost
            taken.add(run.producer)
            parts.append(part)
            offset += part.rows
        return SharedAppend(host, tuple(parts), commit_id) if parts else None

    return build


def _contiguous(fragments: Sequence[Uploaded], committed: int) -> list[Uploaded]:
    """The fragments past seq ``committed`` up to the first gap in their seqs (seqs start
    at 0, so a producer the log does not know starts there)."""
    run: list[Uploaded] = []
    for u in fragments:
        if u.seq == (run[-1].seq if run else committed) + 1:
            run.append(u)
        elif run or u.seq > committed + 1:
            break
    return run


def _part(state: ReplayState, producer: str | None, epoch: int, fragments: Sequence[Uploaded],
          offset: int, commit_id: str) -> Append | None:
    """The append of the ``fragments`` the log does not hold yet from ``producer``, placed
    from ``offset``; None if it holds them all."""
    fresh = list(fragments)
    if producer is not None:
        mine = state.producers.get(producer)
        committed = mine.seq if mine is not None else -1
        fresh = [u for u in fresh if u.seq > committed]
    if not fresh:
        return None
    refs = []
    for u in fresh:
        refs.append(FragmentRef(u.key, u.rows, u.size, offset, u.seq, u.crc32))
        offset += u.rows
    return Append(producer, epoch, tuple(refs), fresh[-1].state, commit_id)


def append_table(view: LogView, data: Any, options: CommitOptions | None = None) -> int:
    """Writes ``data`` as one fragment and commits it; returns the version (see
    ``Stream.append``). The uploaded file is deleted only after a definite failure.

    Raises:
        SchemaMismatchError, ValueError: before anything is uploaded.
        CommitConflictError, CommitStateUnknownError, CorruptLogError, StreamSealedError.
    """
    uri = view.uri
    refuse_if_sealed(view.state, uri)
    meta = view.state.stream_meta
    table = conform(data, meta.schema, where=f"append to {uri}")
    rows = check_rows(table.num_rows, meta.group_size, f"append to {uri}")
    key = fragment_key(ANONYMOUS, 0, 0)
    body = encode_fragment(table, meta.group_size)
    crc = zlib_ng.crc32(body)
    put_fragment(view.store, key, body)

    outcome = view.transact(appending(uri, None, 0, [Stored(key, rows, len(body), 0, crc, None)]),
                            options)
    if outcome.definite_failure:
        try:
            view.store.delete(key)  # a definite failure: nothing can name the file
        except LakestreamError as e:  # gc removes the orphan; the outcome is the news
            log.warning("could not delete the uncommitted fragment %s: %s", key, e)
    result = unwrap(outcome)
    if result is None:  # the build always makes an entry; kept under python -O too
        raise LakestreamError(f"the append of {key} committed no entry")
    return result.version


def check_group_step(view: LogView, group: str, step: int, what: str) -> int:
    """``step``, an int, if ``group`` is a valid name and the step already visible
    (refreshing once to see it).

    Raises:
        ValueError: naming what is wrong; ``what`` says where such a step must lie.
    """
    check_group(group)
    step = check_int("step", step)
    if step > view.state.num_steps:
        view.refresh()
    steps = view.state.num_steps
    if step > steps:
        raise ValueError(f"step {step} of group {group!r} is past the {steps} steps visible "
                         f"in {view.uri}: {what} a step already readable")
    return step


def checkpoint(uri: str, group: str, step: int, checkpoint_id: str | None) -> Build:
    """The marker "``group`` has a durable checkpoint resuming at ``step``", refused on a
    state whose reclaimed offset is past the step's data (``StepNotAvailableError``)."""

    def build(state: ReplayState, commit_id: str) -> Entry:
        if state.stream_meta.offset(step) < state.reclaimed_below:
            raise StepNotAvailableError(
                f"checkpoint step {step} of group {group!r} is below the retention point "
                f"of {uri} (offset {state.reclaimed_below} at version "
                f"{state.version}): its data is reclaimed; checkpoint a later step"
            )
        return Checkpoint(group, step, checkpoint_id, commit_id)

    return build


def registration(uri: str, group: str, step: int) -> Build:
    """``group``'s registration at ``step``; nothing if the log knows the group already (by
    its markers, or a registration at or below ``step``: a group holds from its earliest),
    and refused if the step's data is reclaimed (``StepNotAvailableError``)."""

    def build(state: ReplayState, commit_id: str) -> Entry | None:
        held = state.registered.get(group)
        if group in state.markers or held is not None and held <= step:
            return None
        if state.stream_meta.offset(step) < state.reclaimed_below:
            raise StepNotAvailableError(
                f"group {group!r} cannot register at step {step} of {uri}: its data "
                f"is reclaimed (below offset {state.reclaimed_below}); register a later "
                "step")
        return Register(group, step, commit_id)

    return build


def removal(uri: str, group: str) -> Build:
    """``group``'s removal, refused if the log knows no such group.

    Raises:
        ValueError: ``group`` is not a valid group name (at once); the log knows no such
            group (when the entry is built).
    """
    check_group(group)

    def build(state: ReplayState, commit_id: str) -> Entry:
        if group not in state.registered and group not in state.markers:
            raise ValueError(f"{uri} has no consumer group {group!r}; its groups: "
                             f"{state.groups or 'none'}")
        return RemoveGroup(group, commit_id)

    return build


def seal(state: ReplayState, commit_id: str) -> Entry | None:
    """The seal; nothing if the stream is sealed already."""
    return None if state.sealed_at is not None else Seal(commit_id)
