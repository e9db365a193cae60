"""The DAC interval controller, as a pure function of what it observes (no threads)."""

from __future__ import annotations

import random

import pytest

from lakestream.producers import IntervalController


def _controller(**kwargs: float) -> IntervalController:
    return IntervalController(jitter=0.0, rng=random.Random(0), **kwargs)  # type: ignore[arg-type]


def test_low_load_commits_at_once() -> None:
    c = _controller()
    assert c.observe(0.01, conflicted=False, others=0) == 0.0
    c.observe(0.01, conflicted=True)
    assert c.interval > 0
    assert c.observe(0.01, conflicted=False, others=0) == 0.0  # alone again: no wait


def test_conflicts_grow_the_interval_multiplicatively_up_to_the_cap() -> None:
    c = _controller(max_s=0.5, conflict_floor_s=0.002)
    waits = [c.observe(0.01, conflicted=True) for _ in range(12)]
    assert waits[:4] == pytest.approx([0.002, 0.004, 0.008, 0.016])
    assert waits[-1] == 0.5 and max(waits) == 0.5


def test_successes_shrink_it_additively_in_rate() -> None:
    c = _controller(gain=0.01)
    for _ in range(6):
        c.observe(0.01, conflicted=True)
    before = c.interval
    after = c.observe(0.01, conflicted=False, others=3)
    rate_before, rate_after = 1 / before, 1 / after
    assert rate_after - rate_before == pytest.approx(0.01 / 0.01)  # rate + gain/latency
    assert c.interval >= c.min_s


def _simulate(producers: int, latency: float, rounds: int = 4000) -> float:
    """Conflict ratio of ``producers`` identical controllers sharing one log, with a
    conflict when another producer committed within our commit's latency window."""
    rng = random.Random(1)
    cs = [IntervalController(rng=random.Random(k)) for k in range(producers)]
    next_at = [rng.random() * latency for _ in cs]
    last_commit, last_by = -1.0, -1
    conflicts = attempts = 0
    for _ in range(rounds):
        k = min(range(producers), key=next_at.__getitem__)
        t = next_at[k]
        attempts += 1
        conflicted = t - last_commit < latency and last_by != k
        conflicts += conflicted
        if not conflicted:
            last_commit, last_by = t, k
        wait = cs[k].observe(latency, conflicted, others=1 if producers > 1 else 0)
        next_at[k] = t + latency + wait
    return conflicts / attempts


def test_the_conflict_ratio_settles_low_whatever_the_latency() -> None:
    for latency in (0.001, 0.01, 0.1):
        assert _simulate(8, latency) < 0.2
    assert _simulate(1, 0.01) == 0.0


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        IntervalController(min_s=2, max_s=1)
    with pytest.raises(ValueError):
        IntervalController(increase=1.0)
