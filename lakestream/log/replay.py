"""Replay: the deterministic fold of log entries into the stream's state (docs/design.md §3)."""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from lakestream.checks import check_int
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
    Refused,
    Register,
    RemoveGroup,
    Seal,
    SharedAppend,
    StreamMeta,
)
from lakestream.log.index import FragmentIndex, Removal
from lakestream.log.keys import valid_group
from lakestream.log.overlay import OverlayDict
from lakestream.log.segments import Fragment
from lakestream.store.parse import MAX_INT

RECENT_APPENDS = 256
"""Appends a state remembers the writers of (``ReplayState.recent``)."""
MAX_VOID_FILES = 100_000
"""Files of void appends a state lists for retention to remove from the Delta view; past it,
more void files are not listed (gc deletes them all the same: no live fragment names
them), so that void appends cannot grow every state and manifest without end."""


class ProducerState(NamedTuple):
    """A producer's epoch, last committed seq and state (a tuple: made on every append)."""

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
    """The state after replaying versions ``0..version``. ``apply`` mutates; ``copy`` forks,
    in time that does not grow with the producers, groups or markers the stream knows."""

    def __init__(self) -> None:
        self.version = -1
        self.meta: StreamMeta | None = None
        self.next_offset = 0
        self.index = FragmentIndex()
        """The live fragments (``docs/design.md`` §4): lookups fetch what they touch."""
        self.producers: OverlayDict[str, ProducerState] = OverlayDict()
        self.markers: OverlayDict[str, tuple[Marker, ...]] = OverlayDict()
        self.registered: OverlayDict[str, int] = OverlayDict()
        """Registered consumer groups and the step each holds from (``Register``)."""
        self.reclaimed_below = 0
        self.reclaim_versions: tuple[int, ...] = ()
        """Versions of reclaim entries (gc keeps their files for the grace period)."""
        self.voided: tuple[tuple[int, tuple[FragmentRef, ...]], ...] = ()
        """Void appends (fenced zombies, duplicates) and their files, for maintenance."""
        self.sealed_at: int | None = None
        """The stream's size in samples when it was sealed; None while it takes appends."""
        self.recent: deque[tuple[int, str | None]] = deque(maxlen=RECENT_APPENDS)
        """``(version, producer)`` of the last appends folded in by this state (None:
        ``Stream.append``'s): who is writing now, for a committer's pacing. Not in
        snapshots: a state opened from one starts it empty."""
        self.digest: str | None = None
        """The digest of the entry at ``version`` as this state read it (``Link``); None
        where unknown (a snapshot from before the chain, an entry built in memory)."""
        self.chained = False
        """Whether a chained entry has been folded in: from then on every entry must be
        chained, and name the digest of the entry before it."""

    def copy(self) -> ReplayState:
        other = copy.copy(self)
        other.index = self.index.copy()
        other.producers = self.producers.copy()
        other.markers = self.markers.copy()
        other.registered = self.registered.copy()
        other.recent = self.recent.copy()
        return other

    @property
    def stream_meta(self) -> StreamMeta:
        if self.meta is None:
            raise CorruptLogError("the log has no version 0 (create) entry")
        return self.meta

    @property
    def num_steps(self) -> int:
        return self.stream_meta.step_of(self.next_offset)

    @property
    def first_retained_step(self) -> int:
        """The first step retention left whole: reclaims remove whole fragments, which may
        end inside a step, and that step can no longer be read."""
        return self.stream_meta.first_whole_step(self.reclaimed_below)

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
        keep_last = check_int("keep_last", keep_last, least=1)
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
        below = max(self.stream_meta.offset(step), self.reclaimed_below) \
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
            CorruptLogError: versions out of order, an entry before version 0, offsets
                recorded in the entry that disagree with replay, an entry that does not
                follow the one before it in the chain (one of them was rewritten), or a
                tombstone gc cannot have written.
            LogCompactedError: the entry is gc's tombstone: this state is older than the
                log's retained start, and only a newer snapshot can take it further.
        """
        if isinstance(entry, Compacted):
            if entry.snapshot <= version:
                # gc compacts only below the snapshot before the newest, which it names.
                raise CorruptLogError(
                    f"log version {version} holds a tombstone naming snapshot "
                    f"{entry.snapshot}, which is not past it: gc never writes one, so the "
                    "entry there was overwritten by another writer (docs/deployment.md, "
                    "Threat model)")
            raise LogCompactedError(
                f"log version {version} was compacted by gc: a view at version {self.version} "
                f"is older than the retained log; reopen from snapshot {entry.snapshot} or "
                "later", version=version, snapshot=entry.snapshot)
        if version != self.version + 1:
            raise CorruptLogError(f"log version {version} replayed after {self.version}")
        self._check_link(version, entry)
        if isinstance(entry, Create):
            if version != 0:
                raise CorruptLogError(f"log version {version} re-creates the stream")
            self.meta = entry.meta
        elif self.meta is None:
            raise CorruptLogError(f"log version {version} comes before the stream's creation")
        applied = self._fold(version, entry)
        self.version = version
        if entry.link is not None:
            self.digest = entry.link.digest
            self.chained = self.chained or entry.link.chained
        else:
            self.digest = None
        return applied

    def _check_link(self, version: int, entry: Entry) -> None:
        """Raises CorruptLogError if ``entry`` does not follow the entry this state read at
        ``version - 1``: a chained entry names that entry's digest (or None, the writer not
        knowing it, only before the chain started), and once the chain has started every
        entry is chained."""
        link = entry.link
        if link is None:
            return  # built in memory, not read: nothing to check
        if not link.chained:
            if self.chained:
                raise CorruptLogError(
                    f"log version {version} is not chained, though the entries before it are: "
                    "it was written by a lakestream from before the chain, or rewritten; "
                    "nothing after it is read")
            return
        if self.digest is None or link.prev == self.digest:
            return
        if link.prev is None and not self.chained:
            return  # the first chained entries of a stream from before the chain
        raise CorruptLogError(
            f"log version {version} does not follow log version {version - 1} as this reader "
            f"read it (it names digest {link.prev}, the entry read was {self.digest}): one of "
            "the two was rewritten after it was committed. Readers refuse to go on rather "
            "than read a history another reader does not; compare the two entries, and see "
            "docs/deployment.md, Threat model")

    def _fold(self, version: int, entry: Entry) -> bool:
        if isinstance(entry, Append):
            return self._append(version, entry, (entry,), entry.producer)
        if isinstance(entry, SharedAppend):
            return self._append(version, entry, entry.parts, entry.host)
        if isinstance(entry, Fence):
            p = self.producers.get(entry.producer, ProducerState())
            if entry.epoch <= p.epoch:
                return False
            self.producers[entry.producer] = ProducerState(entry.epoch, p.seq, p.state)
            return True
        if isinstance(entry, Checkpoint | Register | RemoveGroup) \
                and not valid_group(entry.group):
            # Writers refuse such a name; one that does not (another tool) has its entry
            # void, so no name that could not be removed, or would print as terminal
            # control sequences, ever becomes a group.
            return False
        if isinstance(entry, Checkpoint | Register) and entry.step > self.num_steps:
            # Writers mark and register only steps already readable: one past the stream's
            # end holds nothing, nor can it stand as a group's last marker or registration
            # (a reclaim past every honest hold would pass).
            return False
        if isinstance(entry, Checkpoint):
            self.markers[entry.group] = (*self.markers.get(entry.group, ()),
                                         Marker(entry.group, entry.step, entry.checkpoint_id,
                                                version))
        elif isinstance(entry, Register):
            held = self.registered.get(entry.group)
            if held is not None and held <= entry.step:
                return False  # a group holds from its earliest registration
            self.registered[entry.group] = entry.step
        elif isinstance(entry, RemoveGroup):
            self.markers.pop(entry.group, None)
            self.registered.pop(entry.group, None)
        elif isinstance(entry, Seal):
            if self.sealed_at is not None:
                return False
            self.sealed_at = self.next_offset
        elif isinstance(entry, Reclaim):
            return self._reclaim(version, entry)
        elif isinstance(entry, Refused):
            return False
        return True

    def _append(self, version: int, entry: Append | SharedAppend, parts: tuple[Append, ...],
                writer: str | None) -> bool:
        """Folds in the fragments of ``parts`` (one producer's each), all or none: one void
        part (fenced, a duplicate, after a seal, a fragment no writer writes) voids them all.
        ``writer`` is who committed them, for pacing (``recent``)."""
        group = self.stream_meta.group_size
        fragments = entry.fragments
        if any(f.rows == 0 or f.rows % group for f in fragments):
            return False  # no writer writes such a fragment: void, and its files unlisted
        if any(self.is_void(part) for part in parts):
            if sum(len(fs) for _v, fs in self.voided) + len(fragments) <= MAX_VOID_FILES:
                self.voided = (*self.voided, (version, fragments))
            return False
        # Check every fragment before changing anything: a corrupt entry leaves the state
        # exactly as it was, at the version before it.
        offset = self.next_offset
        for f in fragments:
            if f.offset != offset:
                raise CorruptLogError(
                    f"log version {version}: fragment {f.path} records offset {f.offset} but "
                    f"replay places it at {offset}; the log is corrupt"
                )
            offset += f.rows
        if offset > MAX_INT:
            raise CorruptLogError(f"log version {version} places samples past offset 2**63 - 1:"
                                  " the log is corrupt")
        self.index.append(version, fragments)
        self.next_offset = offset
        self.recent.append((version, writer))
        for part in parts:
            if part.producer is not None:
                p = self.producers.get(part.producer, ProducerState())
                self.producers[part.producer] = ProducerState(max(p.epoch, part.epoch),
                                                              part.last_seq, part.state)
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
        if entry.void is None:  # from before the split: live and void files by path
            void = {f.path for _v, fs in self.voided for f in fs}
            live = [f for f in entry.removed if f.path not in void]
            removal = Removal(version, entry.below_offset,
                              frozenset(f.path for f in entry.removed))
            gone = removal.paths
        else:
            live = list(entry.removed)
            removal = Removal(version, entry.below_offset, frozenset(f.path for f in live),
                              frozenset((f.path, f.offset) for f in live))
            gone = frozenset(f.path for f in entry.void)
        for f in live:
            if f.offset + f.rows > entry.below_offset:
                raise CorruptLogError(
                    f"log version {version} removes {f.path}, which holds offsets past "
                    f"{entry.below_offset}"
                )
        self.index.remove(removal)
        if gone:
            self.voided = tuple((v, fs) for v, fs in self.voided
                                if not all(f.path in gone for f in fs))
        self.reclaimed_below = max(self.reclaimed_below, entry.below_offset)
        self.reclaim_versions = (*self.reclaim_versions, version)
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
