"""The DAC interval controller: a pure policy, from what one producer alone observes."""

from __future__ import annotations

import random
from collections import deque


class IntervalController:
    """Chooses how long a committer waits after a commit before starting the next one.

    The log takes one commit at a time: a version lands about one commit window ``w`` (the
    store's round trips of a commit: the read that finds the head and the put) after the
    read it was built on, and a rival that lands in between takes its version. So n
    producers that each commit every T keep the log busy a fraction n·w/T of the time, and
    a commit loses a race with probability about (n-1)·w/T. Each producer takes an equal
    share of a target fraction ``utilization`` (U, 0.3) of it:

        T = (r + 1) · w / U

    where r is the number of other producers that committed since this one's previous
    commit (distinct producers, not entries: counted as entries, a slower producer saw more
    of them, backed off further and fell behind), held a few commits so that one gap in
    which a rival happened not to commit does not halve it, and w the shortest window of
    the last ``WINDOWS`` commits: the store's own speed, not the time a busy host kept the
    committer descheduled (a mean let one starved producer's long windows make it wait
    longer, commit less, and starve more). Every producer sees about the same r and w, so
    all choose about the same T: they share the log equally whatever order they started in,
    and settle in one round, with no lost race to teach them their rivals. With 8
    producers a commit loses about U·7/8 ≈ 26% of its races and the interval is about 27
    windows. A producer alone (r = 0) waits nothing: it commits as soon as its committer's
    floor allows (``min_interval_s``, the gap). A rival that stops is forgotten within a
    few commits (r decays by a fifth a commit). ``max_s`` caps T; jitter (±25%) keeps
    producers out of lockstep. No clock and no I/O: ``observe`` is a function of its
    inputs and the random stream.

    A producer whose writes wait for its upload threads (``bound``) is bound by its own
    CPU, not by the log: its samples wait in that queue whatever T is, and each commit's
    CPU (its entry and put, and reading its rivals' entries) comes out of the uploads'. It
    waits at least the median CPU of its last ``WINDOWS`` commits over
    ``BOUND_COMMIT_SHARE``, so that committing takes at most that share of its CPU
    (without it, producers bound by their CPU committed several times as often and
    ingested less: BENCHMARKS.md, DAC).
    """

    WINDOWS = 16
    BOUND_COMMIT_SHARE = 0.05

    def __init__(self, *, max_s: float = 5.0, utilization: float = 0.3, jitter: float = 0.25,
                 rng: random.Random | None = None) -> None:
        if max_s < 0:
            raise ValueError(f"need max_s >= 0, got {max_s}")
        if not 0 < utilization <= 1 or not 0 <= jitter < 1:
            raise ValueError("need 0 < utilization <= 1 and 0 <= jitter < 1")
        self.max_s, self.utilization, self.jitter = max_s, utilization, jitter
        self.interval = 0.0
        self.rivals = 0.0
        """Other producers committing, as last seen and fading a fifth per commit."""
        self._windows: deque[float] = deque(maxlen=self.WINDOWS)
        self._cpu: deque[float] = deque(maxlen=self.WINDOWS)
        self._rng = rng or random.Random()

    @property
    def window(self) -> float:
        """The store's commit window: the shortest of the last ``WINDOWS``."""
        return min(self._windows) if self._windows else 0.0

    def observe(self, window_s: float, rivals: int, *, cpu_s: float = 0.0,
                bound: bool = False) -> float:
        """Folds in one commit; returns the wait before the next.

        Args:
            window_s: the landing attempt's store round trips (``CommitResult.store_s``:
                not the time building and encoding the entry, which grows with the batch
                and would make a producer with a backlog wait longer still).
            rivals: other producers whose entries landed since this producer's previous
                commit (the races it lost to included).
            cpu_s: the CPU time the commit took in the committer's thread.
            bound: whether the producer's writes wait for upload threads (it is bound by
                its own uploads, not by the log).
        """
        self._windows.append(max(0.0, window_s))
        self._cpu.append(max(0.0, cpu_s))
        self.rivals = max(float(rivals), 0.8 * self.rivals)
        share = 0.0 if self.rivals < 0.5 else \
            (self.rivals + 1) * self.window / self.utilization  # alone: at once
        floor = sorted(self._cpu)[len(self._cpu) // 2] / self.BOUND_COMMIT_SHARE \
            if bound else 0.0
        self.interval = min(self.max_s, max(share, floor))
        if self.interval == 0.0:
            return 0.0  # commit as soon as the committer's floor allows
        return self.interval * (1 + self.jitter * self._rng.uniform(-1, 1))
