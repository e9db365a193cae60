"""A producer's counters: written to by its writer, upload and commit threads at once."""

from __future__ import annotations

import threading
from collections import deque

LATENCY_WINDOW = 4096
"""Commit latencies a producer remembers: the newest, for percentiles; memory stays bounded."""


STAGES = ("write call", "conform", "size check", "encode", "crc32", "store put", "committer")
"""The stages whose CPU a producer counts (``ProducerStats.cpu_s``)."""


class ProducerStats:
    """Counters of one producer instance (since it opened).

    The writer's thread, the upload pool and the committer all count here, so every update
    goes through ``add`` under a lock; reads of single counters need none.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.writes = 0
        self.rows = 0
        self.bytes_uploaded = 0
        self.fragments_uploaded = 0
        self.commits = 0
        self.attempts = 0
        self.conflicts = 0
        self.fragments_committed = 0
        self.lag_wait_s = 0.0
        self.commit_latencies_s: deque[float] = deque(maxlen=LATENCY_WINDOW)
        """The latencies of the last ``LATENCY_WINDOW`` commits, oldest first."""
        self.cpu_s: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        """CPU seconds of the threads running each stage (``STAGES``), where this
        producer's CPU goes: the writer's ``write`` calls, of which conforming the data and
        checking sample sizes; the upload threads' encoding, CRC-32 and store puts; the
        committer thread, all of it, counted when it ends (at ``close``)."""

    def add(self, **counts: float) -> None:
        """Adds to the named counters atomically."""
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def add_cpu(self, *spent: tuple[str, float]) -> None:
        """Adds each ``(stage, seconds)`` of a thread's CPU, at once."""
        with self._lock:
            for stage, seconds in spent:
                self.cpu_s[stage] += seconds

    def add_commit(self, attempts: int, conflicts: int, fragments: int,
                   latency_s: float) -> None:
        with self._lock:
            self.commits += 1
            self.attempts += attempts
            self.conflicts += conflicts
            self.fragments_committed += fragments
            self.commit_latencies_s.append(latency_s)

    def add_landed(self, fragments: int, latency_s: float) -> None:
        """Counts fragments committed by the host's committer (commits shared by a host),
        ``latency_s`` after they were handed to it."""
        with self._lock:
            self.fragments_committed += fragments
            self.commit_latencies_s.append(latency_s)

    def latencies(self) -> list[float]:
        """A copy of the remembered commit latencies, oldest first (safe while committing)."""
        with self._lock:
            return list(self.commit_latencies_s)

    @property
    def fragments_per_commit(self) -> float:
        return self.fragments_committed / self.commits if self.commits else 0.0

    def __repr__(self) -> str:
        return (f"ProducerStats(writes={self.writes}, rows={self.rows}, commits={self.commits}, "
                f"conflicts={self.conflicts}, fragments_committed={self.fragments_committed})")
