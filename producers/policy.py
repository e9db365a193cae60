"""The DAC interval controller: a pure policy, from what one producer alone observes."""

from __future__ import annotations

import random


class IntervalController:
    """Chooses how long a committer waits after a commit before starting the next one.

    Multiplicative increase on conflict, additive decrease on success: under contention every
    producer backs off on its own until the aggregate commit rate is what the store sustains,
    and each commit then carries more fragments; at low load the interval decays to
    ``min_s`` (commit at once, lowest latency). Jitter keeps producers out of lockstep.
    No clock and no I/O: ``observe`` is a function of its inputs and the random stream.
    """

    def __init__(self, *, min_s: float = 0.0, max_s: float = 1.0, increase: float = 2.0,
                 decrease_s: float = 0.002, conflict_floor_s: float = 0.004,
                 jitter: float = 0.25, rng: random.Random | None = None) -> None:
        if not 0 <= min_s <= max_s:
            raise ValueError(f"need 0 <= min_s <= max_s, got {min_s}, {max_s}")
        if increase < 1 or decrease_s < 0 or not 0 <= jitter < 1:
            raise ValueError("need increase >= 1, decrease_s >= 0, 0 <= jitter < 1")
        self.min_s, self.max_s = min_s, max_s
        self.increase, self.decrease_s = increase, decrease_s
        self.conflict_floor_s, self.jitter = conflict_floor_s, jitter
        self.interval = min_s
        self._rng = rng or random.Random()

    def observe(self, latency_s: float, conflicted: bool) -> float:
        """Folds in one commit's outcome; returns the wait before the next commit."""
        if conflicted:
            grown = max(self.interval * self.increase, self.conflict_floor_s, latency_s)
            self.interval = min(self.max_s, grown)
        else:
            self.interval = max(self.min_s, self.interval - self.decrease_s)
        if self.interval <= 0:
            return 0.0
        return self.interval * (1 + self.jitter * self._rng.uniform(-1, 1))
