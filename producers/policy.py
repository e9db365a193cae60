"""The DAC interval controller: a pure policy, from what one producer alone observes."""

from __future__ import annotations

import random


class IntervalController:
    """Chooses how long a committer waits after a commit before starting the next one.

    It runs AIMD on the producer's commit rate r = 1/interval, the way TCP runs it on a
    window: each race a commit lost multiplies the interval by ``increase`` (rate ×
    1/increase), and the first loss sets it to at least the commit window (a wait shorter
    than the window a rival needs cannot avoid the next race); a success adds
    ``gain / latency`` to the rate, which shrinks the interval by a step that is additive
    in rate. That has a stable operating point: with n producers and commit
    latency w, a conflict comes with probability about (n-1)·w·r, and the fixed point
    r ≈ sqrt(gain / ((n-1)·(1 - 1/increase)))/w keeps conflicts near
    sqrt(gain·(n-1)/(1 - 1/increase)) whatever the store's latency, while each commit
    carries more fragments. (A step additive in the interval itself has no interior fixed
    point: the expected growth per commit, p·interval ≈ (n-1)·w, does not depend on the
    interval, so it drifts to a bound.)

    ``latency_floor_s`` stands for what a commit's own latency does not show: on a busy
    host the window between reading the head and the put landing includes time spent
    descheduled. Low load is detected directly: a commit that no other producer's entry
    preceded since our last one divides the interval by ``increase``, and below
    ``conflict_floor_s`` it drops to ``min_s`` (commit at once). Halving, not resetting: among
    many producers a quiet gap comes by chance every few commits, and a reset threw away what
    the conflicts had taught (the next round went out at once and lost again). Jitter
    keeps producers out of lockstep. No clock and no I/O: ``observe`` is a function of its
    inputs and the random stream.
    """

    def __init__(self, *, min_s: float = 0.0, max_s: float = 5.0, increase: float = 2.0,
                 gain: float = 0.001, conflict_floor_s: float = 0.002,
                 latency_floor_s: float = 0.002, jitter: float = 0.25,
                 rng: random.Random | None = None) -> None:
        if not 0 <= min_s <= max_s:
            raise ValueError(f"need 0 <= min_s <= max_s, got {min_s}, {max_s}")
        if increase <= 1 or gain <= 0 or not 0 <= jitter < 1:
            raise ValueError("need increase > 1, gain > 0, 0 <= jitter < 1")
        self.min_s, self.max_s = min_s, max_s
        self.increase, self.gain = increase, gain
        self.conflict_floor_s, self.jitter = conflict_floor_s, jitter
        self.latency_floor_s = latency_floor_s
        self.interval = min_s
        self._rng = rng or random.Random()

    def observe(self, latency_s: float, conflicted: bool, others: int = 1,
                conflicts: int = 1) -> float:
        """Folds in one commit's outcome; returns the wait before the next commit.

        Args:
            latency_s: the commit's window (``CommitResult.window_s``).
            conflicted: whether it lost at least one race.
            others: entries other producers committed since our previous commit.
            conflicts: how many races it lost.
        """
        if conflicted:
            grown = self.interval * self.increase ** max(1, conflicts)
            floor = max(self.conflict_floor_s, latency_s)
            self.interval = min(self.max_s, max(grown, floor))
        elif others == 0:
            halved = self.interval / self.increase
            self.interval = self.min_s if halved < self.conflict_floor_s else halved
        elif self.interval > 0:
            rate = 1.0 / self.interval + self.gain / max(latency_s, self.latency_floor_s)
            self.interval = max(self.min_s, 1.0 / rate)
        if self.interval <= 0:
            return 0.0
        return self.interval * (1 + self.jitter * self._rng.uniform(-1, 1))
