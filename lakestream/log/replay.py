"""Replay: the deterministic fold of log entries into the stream's state (docs/design.md §3)."""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lakestream.errors import CorruptLogError, LogCompactedError, StreamSealedError
from lakestream.log.entries import (
    Append,
    Checkpoint,
    Compacted,
    Create,
    Entry,
    Fence,
    FragmentRef,
    Reclaim,
    Register,
    RemoveGroup,
    Seal,
    StreamMeta,
    valid_group,
)
from lakestream.log.index import FragmentIndex, Removal
from lakestream.log.segments import Fragment
from lakestream.store.parse import MAX_INT

RECENT_APPENDS = 256
"""Appends a state remembers the writers of (``ReplayState.recent``)."""


@dataclass
class ProducerState:
    epoch: int = 0
    seq: int = -1
    state: Any = None


@dataclass(frozen=True)
class Marker:
    """A checkpoint marker: ``group`` resumes at ``step``; committed at ``version``."""

    group: str
    step: int
    checkpoint_id: str | None
    version: int


class ReplayState:
    """The state after replaying versions ``0..version``. ``apply`` mutates; ``copy`` forks."""

    def __init__(self) -> None:
        self.version = -1
        self.meta: StreamMeta | None = None
        self.next_offset = 0
        self.index = FragmentIndex()
        """The live fragments (``docs/design.md`` §4): lookups fetch what they touch."""
        self.producers: dict[str, ProducerState] = {}
        self.markers: dict[str, list[Marker]] = {}
        self.registered: dict[str, int] = {}
        """Registered consumer groups and the step each holds from (``Register``)."""
        self.reclaimed_below = 0
        self.reclaim_versions: list[int] = []
        """Versions of reclaim entries (gc keeps their files for the grace period)."""
        self.voided: list[tuple[int, tuple[FragmentRef, ...]]] = []
        """Void appends (fenced zombies, duplicates) and their files, for maintenance."""
        self.sealed_at: int | None = None
        """The stream's size in samples when it was sealed; None while it takes appends."""
        self.recent: deque[tuple[int, str | None]] = deque(maxlen=RECENT_APPENDS)
        """``(version, producer)`` of the last appends folded in by this state (None:
        ``Stream.append``'s): who is writing now, for a committer's pacing. Not in
        snapshots: a state opened from one starts it empty."""


    def copy(self) -> ReplayState:
        other = copy.copy(self)
        other.index = self.index.copy()
        other.producers = {k: copy.copy(v) for k, v in self.producers.items()}
        other.markers = {k: list(v) for k, v in self.markers.items()}
        other.registered = dict(self.registered)
        other.voided = list(self.voided)
        other.reclaim_versions = list(self.reclaim_versions)
        other.recent = self.recent.copy()
        return other

    @property
    def stream_meta(self) -> StreamMeta:
        if self.meta is None:
            raise CorruptLogError("the log has no version 0 (create) entry")
        return self.meta

    @property
    def num_steps(self) -> int:
        return self.next_offset // self.stream_meta.global_batch_size

    @property
    def groups(self) -> list[str]:
        """Every consumer group the log knows: with markers or registered."""
        return sorted(set(self.markers) | set(self.registered))

    def holds(self, keep_last: int) -> dict[str, int]:
        """The step from which each consumer group holds data: the smallest resume step of
        its last ``keep_last`` markers, else (registered, no marker) its registration step.

        Raises:
            ValueError: ``keep_last`` is not a positive int.
        """
        if not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 1:
            raise ValueError(f"keep_last must be a positive int, got {keep_last!r}")
        holds = {g: min(m.step for m in ms[-keep_last:]) for g, ms in self.markers.items()
                 if ms}
        for g, step in self.registered.items():
            holds.setdefault(g, step)
        return holds

    def retention_point(self, keep_last: int) -> tuple[int, int]:
        """``(step, offset)`` below which ``retain(keep_last)`` may reclaim: the smallest
        step any group may still resume at, over its last ``keep_last`` markers and the
        registration of each group with none. A stream with no group holds everything:
        nothing says what is consumed. Progress objects never count."""
        holds = self.holds(keep_last)
        # Never past the stream's end: a reclaim there is corrupt (``_reclaim``).
        step = min(min(holds.values()), self.num_steps) if holds else 0
        below = max(step * self.stream_meta.global_batch_size, self.reclaimed_below) \
            if step else self.reclaimed_below
        return step, below

    def is_void(self, entry: Append) -> bool:
        """Whether an append would be void on top of this state (after a seal, fenced or
        duplicate)."""
        if self.sealed_at is not None:
            return True
        if entry.producer is None:
            return False
        p = self.producers.get(entry.producer)
        if p is None:
            return False
        return entry.epoch < p.epoch or entry.first_seq <= p.seq

    def apply(self, version: int, entry: Entry) -> bool:
        """Folds in the entry at ``version``; returns False if it was void. All or nothing:
        an entry that raises leaves the state unchanged.

        Raises:
            CorruptLogError: versions out of order, an entry before version 0, or offsets
                recorded in the entry that disagree with replay.
            LogCompactedError: the entry is gc's tombstone: this state is older than the
                log's retained start, and only a newer snapshot can take it further.
        """
        if isinstance(entry, Compacted):
            raise LogCompactedError(
                f"log version {version} was compacted by gc: a view at version {self.version} "
                f"is older than the retained log; reopen from snapshot {entry.snapshot} or "
                "later", version=version, snapshot=entry.snapshot)
        if version != self.version + 1:
            raise CorruptLogError(f"log version {version} replayed after {self.version}")
        if isinstance(entry, Create):
            if version != 0:
                raise CorruptLogError(f"log version {version} re-creates the stream")
            self.meta = entry.meta
        elif self.meta is None:
            raise CorruptLogError(f"log version {version} comes before the stream's creation")
        applied = True
        if isinstance(entry, Append):
            applied = self._append(version, entry)
        elif isinstance(entry, Fence):
            p = self.producers.setdefault(entry.producer, ProducerState())
            applied = entry.epoch > p.epoch
            if applied:
                p.epoch = entry.epoch
        elif isinstance(entry, Checkpoint | Register | RemoveGroup) \
                and not valid_group(entry.group):
            # Writers refuse such a name; one that does not (another tool) has its entry
            # void, so no name that could not be removed, or would print as terminal
            # control sequences, ever becomes a group.
            applied = False
        elif isinstance(entry, Checkpoint):
            self.markers.setdefault(entry.group, []).append(
                Marker(entry.group, entry.step, entry.checkpoint_id, version))
        elif isinstance(entry, Register):
            self.registered.setdefault(entry.group, entry.step)
        elif isinstance(entry, RemoveGroup):
            self.markers.pop(entry.group, None)
            self.registered.pop(entry.group, None)
        elif isinstance(entry, Seal):
            applied = self.sealed_at is None
            if applied:
                self.sealed_at = self.next_offset
        elif isinstance(entry, Reclaim):
            applied = self._reclaim(version, entry)
        self.version = version
        return applied

    def _append(self, version: int, entry: Append) -> bool:
        if self.is_void(entry):
            self.voided.append((version, entry.fragments))
            return False
        # Check every fragment before changing anything: a corrupt entry leaves the state
        # exactly as it was, at the version before it.
        offset = self.next_offset
        for f in entry.fragments:
            if f.offset != offset:
                raise CorruptLogError(
                    f"log version {version}: fragment {f.path} records offset {f.offset} but "
                    f"replay places it at {offset}; the log is corrupt"
                )
            offset += f.rows
        if offset > MAX_INT:
            raise CorruptLogError(f"log version {version} places samples past offset 2**63 - 1:"
                                  " the log is corrupt")
        self.index.append(version, entry.fragments)
        self.next_offset = offset
        self.recent.append((version, entry.producer))
        if entry.producer is not None:
            p = self.producers.setdefault(entry.producer, ProducerState())
            p.epoch = max(p.epoch, entry.epoch)
            p.seq = entry.last_seq
            p.state = entry.state
        return True

    def _reclaim(self, version: int, entry: Reclaim) -> bool:
        _, allowed = self.retention_point(1)
        if entry.below_offset > allowed:
            # Past what the groups' last markers hold: no retain writes that (it keeps at
            # least every group's last marker), so a writer that is not retain did (a
            # producer's identity may write the log). Void, as a fenced append is.
            return False
        if entry.below_offset > self.next_offset:
            raise CorruptLogError(
                f"log version {version} reclaims below offset {entry.below_offset}, past the "
                f"end of the stream ({self.next_offset})"
            )
        void = {f.path for _v, fs in self.voided for f in fs}
        for f in entry.removed:
            if f.path not in void and f.offset + f.rows > entry.below_offset:
                raise CorruptLogError(
                    f"log version {version} removes {f.path}, which holds offsets past "
                    f"{entry.below_offset}"
                )
        gone = frozenset(f.path for f in entry.removed)
        self.index.remove(Removal(version, entry.below_offset, gone))
        if gone:
            self.voided = [(v, fs) for v, fs in self.voided
                           if not all(f.path in gone for f in fs)]
        self.reclaimed_below = max(self.reclaimed_below, entry.below_offset)
        self.reclaim_versions.append(version)
        return True

    def writers_since(self, version: int, *, besides: str | None = None) -> int:
        """Distinct writers of the appends folded in after ``version`` (``besides`` not
        counted), as far as ``recent`` reaches back."""
        found = {p for v, p in reversed(self.recent) if v > version} if self.recent else set()
        found.discard(besides)
        return len(found)

    def fragments_between(self, lo: int, hi: int) -> list[Fragment]:
        """Live fragments overlapping offsets ``[lo, hi)``, in offset order."""
        return self.index.between(lo, hi)

    def all_fragments(self) -> list[Fragment]:
        """Every live fragment, in offset order: fetches the whole index."""
        return self.index.all()


def refuse_if_sealed(state: ReplayState, uri: str) -> None:
    """Raises StreamSealedError if the stream is sealed in ``state``."""
    if state.sealed_at is not None:
        raise StreamSealedError(
            f"{uri} is sealed (at {state.sealed_at} samples): it takes no more appends; "
            "write to a new stream")


def replay(entries: Iterable[tuple[int, Entry]], state: ReplayState | None = None) -> ReplayState:
    """Folds ``(version, entry)`` pairs, in version order, into ``state`` (or a new one)."""
    state = state if state is not None else ReplayState()
    for version, entry in entries:
        state.apply(version, entry)
    return state
