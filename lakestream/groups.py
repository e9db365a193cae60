"""A stream's consumer groups and the data they hold, as two namespaces of a ``Stream``
handle (``s.groups``, ``s.retention``), each call made by the log wing: the group entries
of ``lakestream.log.commits``, the point of ``lakestream.log.retention``, and ``gc``.

``s.groups`` reads as the list of groups the log knows and carries what is done to one
(register, remove, mark a checkpoint); ``s.retention`` says what the groups hold and
reclaims the rest. The handle's flat methods (``s.register_group``, ``s.retain``...) are
these same calls under their older names.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from lakestream.errors import LakestreamError
from lakestream.log import commits
from lakestream.log.compaction import GcReport
from lakestream.log.gc import gc_stream
from lakestream.log.outcomes import Build, unwrap
from lakestream.log.replay import Marker
from lakestream.log.retention import RetentionPoint, group_holds, reclaim_entry, retention_point
from lakestream.log.view import LogView


def commit_version(view: LogView, build: Build) -> int:
    """Commits an entry ``build`` always makes on ``view``; returns its version.

    Raises:
        The precondition's error from ``build``, CommitConflictError or
        CommitStateUnknownError.
    """
    result = unwrap(view.transact(build))
    if result is None:  # the build always makes an entry; kept under python -O too
        raise LakestreamError(f"{view.uri}: a commit that always makes an entry made none")
    return result.version


class Groups(Sequence[str]):
    """The consumer groups the log knows (with markers, or registered), sorted, as of the
    handle's last refresh; equal to a list of the same names. Its methods commit to the log.
    """

    def __init__(self, view: LogView) -> None:
        self._view = view
        self._names = view.state.groups

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        return self._names[i]

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Groups):
            return self._names == other._names
        if isinstance(other, Sequence) and not isinstance(other, str):
            return self._names == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._names)

    def checkpoints(self, group: str) -> list[Marker]:
        """The checkpoint markers of ``group``, oldest first."""
        return list(self._view.state.markers.get(group, []))

    def registered_step(self, group: str) -> int | None:
        """The step ``group`` registered at, or None if it never registered."""
        return self._view.state.registered.get(group)

    def mark_checkpoint(self, group: str, step: int, checkpoint_id: str | None = None) -> int:
        """Records that ``group`` has a durable checkpoint resuming at ``step``; returns the
        version. Call it after the training checkpoint is saved.

        The marker is committed only on a state whose reclaimed offset is at or below the
        step's data: a ``retain`` that lands first makes it fail, never leaves a marker
        pointing at reclaimed data.

        Raises:
            ValueError: ``group`` is not a valid group name, or ``step`` is negative or past
                the visible steps.
            StepNotAvailableError: the step's data is already reclaimed (nothing committed).
        """
        step = commits.check_group_step(self._view, group, step, "a checkpoint resumes at")
        return commit_version(self._view, commits.checkpoint(self._view.uri, group, step,
                                                             checkpoint_id))

    def register(self, group: str, step: int = 0) -> int | None:
        """Makes ``group`` a consumer group that holds retention from ``step`` until its own
        markers take over. A group holds from its earliest registration: a group with
        markers, or registered at ``step`` or below, is left as it is and None returned;
        else the registration's version (a registration below the one the log holds lowers
        the group's hold to it).

        Raises:
            ValueError: ``group`` is not a valid group name, or ``step`` is negative or past
                the visible steps (a group registers where it starts reading).
            StepNotAvailableError: ``step``'s data is already reclaimed (nothing committed).
        """
        step = commits.check_group_step(self._view, group, step, "a group registers at")
        result = unwrap(self._view.transact(commits.registration(self._view.uri, group, step)))
        return None if result is None else result.version

    def remove(self, group: str) -> int:
        """Removes ``group``: its markers and registration stop holding data (the next
        ``retain`` may reclaim what only it held). Returns the removal's version.

        Raises:
            ValueError: ``group`` is not a valid group name, or the log knows no such group
                (nothing committed).
        """
        return commit_version(self._view, commits.removal(self._view.uri, group))


class Retention:
    """What the consumer groups hold, and the reclaiming of the rest: ``retain`` takes data
    out of the table, ``gc`` deletes its files after a grace period."""

    def __init__(self, view: LogView, storage_options: dict[str, str] | None) -> None:
        self._view = view
        self._storage_options = storage_options

    def point(self, keep_last: int = 2) -> RetentionPoint:
        """What ``retain(keep_last)`` would reclaim now."""
        return retention_point(self._view.state, keep_last)

    def holds(self, keep_last: int = 2) -> dict[str, int]:
        """The step from which each consumer group holds data under ``retain(keep_last)``."""
        return group_holds(self._view.state, keep_last)

    def retain(self, keep_last: int = 2) -> int | None:
        """Reclaims data no retained checkpoint needs: for every consumer group keep its last
        ``keep_last`` markers; fragments wholly below the smallest of their resume steps are
        removed from the table (Delta ``remove``). Files are deleted later by ``gc``.

        Safe beside producers, readers and other retainers: the point is recomputed on the
        latest log at every commit attempt. A registered group with no marker holds from its
        registration step; a stream with no group holds everything; progress objects hold
        nothing. Returns the version of the last reclaim entry, or None if nothing was
        reclaimable. An entry removes at most 10,000 files: a larger reclaim commits several,
        each complete on its own (a crash between them leaves a smaller reclaim done).
        """
        version = None
        while True:
            result = unwrap(self._view.transact(
                lambda state, cid: reclaim_entry(state, keep_last, cid)))
            if result is None:
                return version
            version = result.version

    def gc(self, grace_seconds: float = 3600.0, *, delta_checkpoint: bool = True) -> GcReport:
        """Deletes, once ``grace_seconds`` have passed by the store's own clock, the files of
        reclaimed fragments and of uploads never committed, and log entries and snapshots
        older than the newest snapshot and Delta checkpoint.

        With ``delta_checkpoint`` (and deltalake installed) it first writes a Delta checkpoint
        so other engines open the table fast and old entries can go; without one the log is
        kept whole. Killing gc at any point leaves a readable stream; run it again.
        """
        return gc_stream(self._view, grace_seconds, delta_checkpoint=delta_checkpoint,
                         storage_options=self._storage_options)
