"""Rank 0's progress publisher: a background thread with an owner, a stop and a voice."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from lakestream.errors import LakestreamError

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
