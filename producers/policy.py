"""The DAC interval controller: a pure policy, from what one producer alone observes."""

from __future__ import annotations

import random


class IntervalController:
    """Chooses how long a committer waits after a commit before starting the next one.

    It runs AIMD on the producer's commit rate r = 1/interval, the way TCP runs it on a
    window: each race a commit lost multiplies the interval by ``increase`` (rate ×
    1/increase), and a loss sets it to at least the interval the rate settles at (below)
    for as many rivals as entries preceded ours (at the rate they came while the producer
    was busy, not over an idle stretch). Between losses the rate
    grows additively *in time*: each commit adds ``gain · elapsed / w²``, where elapsed is
    the time since this producer's previous commit landed, counted up to twice the interval
    and the window (a producer back from an idle hour has not tested the rate since), and w
    the commit window smoothed over commits (one short window, squared, would multiply
    one commit's growth). Growth per second
    rather than per commit is what shares the log fairly: with growth per commit, the
    producer that commits most often also speeds up most often, and the one ahead stays
    ahead. With n producers a commit loses a race with probability about p = (n-1)·w·r,
    and each loss divides the rate by ``increase``, so the rate settles where the growth
    gain/w² meets the loss r·p·r·(1 - 1/increase), at
    r·w ≈ (gain/((n-1)·(1 - 1/increase)))^(1/3) whatever the store's latency. With the
    defaults at 8 producers: ~50 windows between a producer's commits, p ≈ 14% by the
    model, 6-14% in simulation; p grows as (n-1)^(2/3). ``max_s`` must be above that
    interval or it binds and more races are lost. Producers starting together all begin
    at no wait; doubling up from one window, each took a few rounds of lost races to
    space out (on SeaweedFS, 8 producers lost 35-51 races in their first 4 s, 21-31% of
    the attempts of a 20 s run); going at once to the settled interval, 10-13%.

    ``latency_floor_s`` stands for what a commit's own latency does not show: on a busy
    host the window between reading the head and the put landing includes time spent
    descheduled. Low load is detected directly: once no other producer's entry has
    preceded ours for ``quiet_windows`` commit windows of commits in a row, each such
    commit from the one that reaches it divides the interval by ``increase``, and below
    ``conflict_floor_s`` it drops to 0 (commit at once). Quiet is counted in
    windows, above the ~50 windows between a rival's commits at the settled rate, so that
    rivals pacing themselves are not mistaken for no rivals: counted per commit, or in a
    fixed second, it let the producer that commits most often halve its interval while the
    others' stayed long. Halving, not resetting: a reset threw away what the conflicts had
    taught (the next round went out at once and lost again). Jitter keeps producers out of
    lockstep. No clock and no I/O: ``observe`` is a function of its inputs and the random
    stream.
    """

    def __init__(self, *, max_s: float = 5.0, increase: float = 2.0,
                 gain: float = 3e-5, quiet_windows: float = 200.0, conflict_floor_s: float = 0.002,
                 latency_floor_s: float = 0.002, jitter: float = 0.25,
                 rng: random.Random | None = None) -> None:
        if max_s < 0:
            raise ValueError(f"need max_s >= 0, got {max_s}")
        if increase <= 1 or gain <= 0 or quiet_windows < 0 or not 0 <= jitter < 1:
            raise ValueError("need increase > 1, gain > 0, quiet_windows >= 0, 0 <= jitter < 1")
        self.max_s = max_s
        self.increase, self.gain, self.quiet_windows = increase, gain, quiet_windows
        self.conflict_floor_s, self.jitter = conflict_floor_s, jitter
        self.latency_floor_s = latency_floor_s
        self.interval = 0.0
        self._quiet = 0.0  # seconds of commits that no rival entry preceded, in a row
        self._window: float | None = None
        self._rng = rng or random.Random()

    def observe(self, latency_s: float, conflicted: bool, others: int = 1,
                conflicts: int = 1, elapsed_s: float = 0.0) -> float:
        """Folds in one commit's outcome; returns the wait before the next commit.

        Args:
            latency_s: the commit's window (``CommitResult.window_s``).
            conflicted: whether it lost at least one race.
            others: entries other producers committed since our previous commit.
            conflicts: how many races it lost.
            elapsed_s: time since our previous commit landed (0 for the first).
        """
        self._quiet = self._quiet + elapsed_s if others == 0 and not conflicted else 0.0
        # Growth and quiet go by the window smoothed over commits: one short window, squared,
        # would multiply one commit's growth.
        window = max(latency_s, self.latency_floor_s)
        self._window = window if self._window is None else 0.7 * self._window + 0.3 * window
        w = self._window
        if conflicted:
            # Rival entries count at the rate they came while this producer was busy (its
            # wait, the committer's gap, the commit's rounds of three requests per lost
            # race; twice that, for the jitter and backoffs), not over an idle hour.
            busy = 2 * (self.interval + (2 + 3 * conflicts) * w)
            rivals = others * min(1.0, busy / elapsed_s) if elapsed_s > 0 else others
            grown = self.interval * self.increase ** max(1, conflicts)
            floor = max(self.conflict_floor_s, latency_s, self._settled(w, rivals))
            self.interval = min(self.max_s, max(grown, floor))
        elif others == 0 and self._quiet >= self.quiet_windows * w:
            halved = self.interval / self.increase
            self.interval = 0.0 if halved < self.conflict_floor_s else halved
        elif self.interval > 0:
            # Time the next commit was due counts (the interval, jittered, and the commit),
            # time the writer had nothing to commit does not: back from an idle hour, it
            # has not tested the rate since.
            due = min(elapsed_s, 2 * (self.interval + w))
            rate = 1.0 / self.interval + self.gain * due / (w * w)
            self.interval = 1.0 / rate
        if self.interval <= 0:
            return 0.0
        return self.interval * (1 + self.jitter * self._rng.uniform(-1, 1))

    def _settled(self, w: float, rivals: float) -> float:
        """The interval the rate settles at (see the class docstring) with ``rivals`` other
        producers: where a lost race sends the interval at once, instead of doubling up to
        it from one window over a few rounds of lost races per producer."""
        return w * (rivals * (1 - 1 / self.increase) / self.gain) ** (1 / 3)
