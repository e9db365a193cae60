"""A StreamDataset's place in its consumer group: the group's registration on rank 0's first
step, the progress rank 0 publishes, and the checkpoint markers (with retention) it commits.
Without a group (``group=None``) it does none of these."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any

from lakestream.errors import PermissionDeniedError
from lakestream.loaders.publisher import JobProgress, MixProgress, ProgressPublisher, job_id
from lakestream.reading import Steps
from lakestream.stream import Stream

log = logging.getLogger("lakestream")


class Membership:
    """The group ``group`` (None: none) as rank ``rank`` of a job sees it.

    Only rank 0 registers, publishes and commits; the other ranks' calls do nothing. The
    publisher thread holds the progress, never this object or its dataset, so a dataset
    dropped without ``close()`` still stops it (through a finalizer)."""

    def __init__(self, group: str | None, rank: int, *, progress_interval_s: float,
                 keep_last: int | None) -> None:
        self.group, self.rank = group, rank
        self.job = job_id()
        """This job's identity in its group's progress (``JobProgress``)."""
        self.progress_interval_s, self.keep_last = progress_interval_s, keep_last
        self._publisher: ProgressPublisher | None = None
        self._progress: MixProgress | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A DataLoader worker publishes nothing of its own: the trainer process does.
        return {**self.__dict__, "_publisher": None, "_progress": None}

    @property
    def leads(self) -> bool:
        """Whether this rank speaks for the group (rank 0 of a dataset with a group)."""
        return self.group is not None and self.rank == 0

    @property
    def publishing(self) -> bool:
        """Whether progress is published over a plan (which ``follow`` must then replace)."""
        return self._progress is not None

    def follow(self, steps: Steps) -> None:
        """Publishes progress in ``steps`` from now on (the plan made again on a resume)."""
        if self._progress is not None:
            self._progress.steps = steps

    def register(self, streams: Sequence[Stream], steps: Sequence[int]) -> None:
        """Registers the group on each stream whose log does not know it yet, at the step of
        that stream where this job starts reading (at most the visible steps: holding from
        an earlier step is safe, from a later one would not be)."""
        if not self.leads:
            return
        assert self.group is not None
        for stream, step in zip(streams, steps, strict=True):
            if self.group in stream.groups:
                continue
            step = min(step, stream.num_steps)
            try:
                stream.register_group(self.group, step)
            except PermissionDeniedError as e:
                log.warning("could not register consumer group %r at step %d of %s (%s): it "
                            "holds no data until it commits a checkpoint marker; a job that "
                            "only reads passes group=None", self.group, step, stream.uri, e)

    def record(self, next_step: int, policy_version: int | None, steps: Steps,
               streams: Sequence[Stream]) -> None:
        """Notes that the job resumes at ``next_step`` now: published at most every
        ``progress_interval_s``, and always the latest."""
        if not self.leads or self.progress_interval_s <= 0:
            return
        if self._publisher is None:
            self._publisher = ProgressPublisher(self._job_progress(steps, streams),
                                                self.progress_interval_s)
            weakref.finalize(self, self._publisher.stop)
        self._publisher.update(next_step, policy_version)

    def publish(self, next_step: int, policy_version: int | None, steps: Steps,
                streams: Sequence[Stream]) -> None:
        """Publishes ``{step, policy_version}`` for the group now."""
        if self.leads:
            self._job_progress(steps, streams)(next_step, policy_version)

    def _job_progress(self, steps: Steps, streams: Sequence[Stream]) -> MixProgress:
        assert self.group is not None
        if self._progress is None:
            self._progress = MixProgress(steps, [JobProgress(s.store, self.group, self.job)
                                                 for s in streams])
        return self._progress

    def mark(self, streams: Sequence[Stream], steps: Sequence[int],
             checkpoint_id: str | None) -> int:
        """Commits the marker of a durable checkpoint on each stream at its step; returns the
        first marker's log version."""
        assert self.group is not None
        versions = [stream.mark_checkpoint(self.group, s, checkpoint_id)
                    for stream, s in zip(streams, steps, strict=True)]
        return versions[0]

    def retain(self, streams: Sequence[Stream]) -> None:
        """With ``keep_last``, runs retention on each stream, keeping that many markers."""
        if self.keep_last is not None:
            for stream in streams:
                stream.retain(keep_last=self.keep_last)

    @property
    def conflicts(self) -> int:
        """Publishes that found another job's progress in this group (``JobProgress``)."""
        return sum(p.conflicts for p in self._progress.parts) if self._progress is not None \
            else 0

    @property
    def publish_errors(self) -> int:
        """Progress publishes that failed (each was retried; see the ``lakestream`` log)."""
        return self._publisher.errors if self._publisher is not None else 0

    def close(self) -> None:
        """Publishes the last progress and stops the publisher thread (started again by the
        next ``record``)."""
        if self._publisher is not None:
            self._publisher.stop()
