"""Rank 0's progress publisher: a background thread with an owner, a stop and a voice, and
the job identity that tells two jobs in one consumer group apart."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable

from lakestream.errors import LakestreamError
from lakestream.reading import (
    ObjectStore,
    Progress,
    Steps,
    publish_progress,
    read_progress,
    stream_steps,
)

log = logging.getLogger("lakestream")

Publish = Callable[[int, "int | None"], None]
"""Writes ``(step, policy_version)`` to the group's progress object."""


class ProgressPublisher:
    """Publishes the latest ``(step, policy_version)`` at most every ``interval_s``.

    A background thread, not a throttle on ``update``: a throttle would drop the last update
    when the trainer consumes a burst of steps and then waits for more, and producers held
    by ``max_lag_steps`` would wait for that update for ever. The thread starts with the
    first ``update``; ``stop`` publishes what is still unpublished and joins it (the owner
    calls it when iteration ends or the dataset is closed). A failed publish is retried at
    the next round and logged (a warning when publishing starts to fail, and when it
    recovers); ``errors`` counts them.
    """

    def __init__(self, publish: Publish, interval_s: float) -> None:
        self._publish = publish
        self.interval_s = interval_s
        self.errors = 0
        self._latest: tuple[int, int | None] | None = None
        self._published: tuple[int, int | None] | None = None
        self._failing = False
        self._lock = threading.Lock()
        self._publishing = threading.Lock()
        """One publish at a time: an older step never overwrites a newer one."""
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def update(self, step: int, policy_version: int | None) -> None:
        """Notes the newest progress; it is published within ``interval_s``."""
        with self._lock:
            self._latest = (step, policy_version)
            if self._thread is None or not self._thread.is_alive():
                # Each thread gets its own stop event: a thread that outlived its stop's
                # join (a publish stuck in retries) still stops, and never runs beside its
                # successor for long.
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(self._stop,),
                                                daemon=True, name="lakestream-progress")
                self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Publishes what is unpublished, then stops the thread. Idempotent."""
        with self._lock:
            thread, self._thread = self._thread, None
            stop = self._stop
        if thread is None:
            return
        stop.set()
        thread.join(timeout)

    def _round(self) -> None:
        with self._publishing:
            latest = self._latest
            if latest is None or latest == self._published:
                return
            try:
                self._publish(*latest)
            except LakestreamError as e:
                self.errors += 1
                if not self._failing:
                    log.warning("publishing progress step %d failed (retrying every %.1fs): "
                                "%s", latest[0], self.interval_s, e)
                self._failing = True
                return
            if self._failing:
                log.warning("publishing progress works again (step %d)", latest[0])
            self._failing = False
            self._published = latest

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._round()
            stop.wait(self.interval_s)
        self._round()  # the last update, so producers see where the trainer stopped


_PROCESS_JOB = uuid.uuid4().hex[:16]


def job_id() -> str:
    """This job's id in progress objects: torchrun's run id (the same across the elastic
    restarts of one run), else one per process (every dataset of the process shares it)."""
    return os.environ.get("TORCHELASTIC_RUN_ID") or _PROCESS_JOB


class JobProgress:
    """Writes one job's progress into its consumer group, and says when another job writes
    there too: two jobs in one group would interleave their progress, and producers bounded
    by ``max_lag_steps`` would follow whichever wrote last.

    Before each publish it reads the group's progress. Another job's progress found there
    after this job has published means that job published since: both are publishing now.
    Found before this job's first publish, it proves nothing: a job resuming from a
    checkpoint finds the progress its crashed or stopped predecessor left, however recent
    (a restart takes seconds). That job is noted (logged at INFO) and is reported only if it
    publishes again, within this job's next interval if it is alive. Each report is counted
    in ``conflicts`` and logged as a warning (the first, then every 100th), naming both
    jobs. This job's publish still goes ahead.
    """

    def __init__(self, store: ObjectStore, group: str, job: str) -> None:
        self.store, self.group, self.job = store, group, job
        self.conflicts = 0
        self._published = False

    def __call__(self, step: int, policy_version: int | None) -> None:
        current = read_progress(self.store, self.group)
        if current is not None and current.job not in (None, self.job):
            if self._published:
                self._report(current, step)
            else:
                log.info("consumer group %r: job %s takes over from job %s (its progress: "
                         "step %d, %.0f s ago); reported if that job publishes again",
                         self.group, self.job, current.job, current.step,
                         max(0.0, time.time() - current.updated))
        publish_progress(self.store, self.group, step, policy_version, self.job)
        self._published = True

    def _report(self, other: Progress, step: int) -> None:
        self.conflicts += 1
        if self.conflicts == 1 or self.conflicts % 100 == 0:
            log.warning(
                "consumer group %r: job %s published progress (step %d) beside this job %s "
                "(step %d); two jobs in one group interleave their progress: give each job "
                "its own group, or group=None to read without one (%d times)",
                self.group, other.job, other.step, self.job, step, self.conflicts)


class MixProgress:
    """Publishes a mix's progress to each source: the step of that source's own stream the
    mix has consumed up to (what its producers' ``max_lag_steps`` follows)."""

    def __init__(self, steps: Steps, parts: list[JobProgress]) -> None:
        self.steps, self.parts = steps, parts
        """The dataset's current steps (it replaces them when it plans again)."""

    def __call__(self, step: int, policy_version: int | None) -> None:
        steps = self.steps
        own = stream_steps(steps.progress_offsets(step), steps.streams)
        for part, reached in zip(self.parts, own, strict=True):
            part(reached, policy_version)
