"""Checkpoint-aligned retention (docs/design.md §7): what no retained checkpoint needs, and
the reclaim entry that removes it from the table (``lakestream.log.gc`` deletes the files
later)."""

from __future__ import annotations

from dataclasses import dataclass

from lakestream.log.entries import MAX_FRAGMENTS_PER_ENTRY, Entry, FragmentRef, Reclaim
from lakestream.log.replay import ReplayState


@dataclass(frozen=True)
class RetentionPoint:
    """Where retention may reclaim up to: offsets below ``below_offset`` (step ``step``)."""

    step: int
    below_offset: int
    fragments: tuple[FragmentRef, ...]
    """Live fragments wholly below the point, and the files of void appends."""

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.fragments)


def retention_point(state: ReplayState, keep_last: int) -> RetentionPoint:
    """The smallest step any consumer group may still resume at: over each group's last
    ``keep_last`` markers, and the registration step of each registered group that has no
    marker yet. A stream with no group holds everything: nothing says what is consumed.
    Only what groups committed counts (markers, registrations), never a progress object.
    """
    step, below = state.retention_point(keep_last)
    live = tuple(FragmentRef(f.path, f.rows, f.size, f.offset, -1, f.crc32)
                 for f in state.index.below(below))
    void = tuple(f for _v, fs in state.voided for f in fs)
    return RetentionPoint(step, below, live + void)


def reclaim_entry(state: ReplayState, keep_last: int, commit_id: str) -> Entry | None:
    """The next reclaim entry to commit on top of ``state``, or None if nothing is left to
    reclaim. One entry removes at most ``MAX_FRAGMENTS_PER_ENTRY`` files: live fragments
    first (its point is then the end of the last it removes, if that is short of the
    retention point), then void appends' files. ``retain`` commits them until None.

    Built anew on each commit attempt, so markers committed concurrently are honoured.
    """
    _, point = state.retention_point(keep_last)
    live = [FragmentRef(f.path, f.rows, f.size, f.offset, -1, f.crc32)
            for f in state.index.below(point, limit=MAX_FRAGMENTS_PER_ENTRY)]
    below = point
    if len(live) == MAX_FRAGMENTS_PER_ENTRY:
        below = min(point, live[-1].offset + live[-1].rows)
    room = MAX_FRAGMENTS_PER_ENTRY - len(live)
    void: list[FragmentRef] = []
    for _v, fs in state.voided:
        if len(void) + len(fs) > room:
            break  # a void append's files leave their list together
        void.extend(fs)
    if not live and not void and below <= state.reclaimed_below:
        return None
    return Reclaim(max(below, state.reclaimed_below), tuple(live), commit_id, tuple(void))


def group_holds(state: ReplayState, keep_last: int) -> dict[str, int]:
    """The step from which each consumer group holds data (``ReplayState.holds``)."""
    return state.holds(keep_last)
