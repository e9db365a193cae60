"""The DAC interval controller, as a pure function of what it observes (no threads), and
the committer's pacing around it, simulated against one shared log (``bench/dac.py``)."""

from __future__ import annotations

import random

import pytest

from bench.dac import simulate
from lakestream.producers import IntervalController


def _controller(**kwargs: float) -> IntervalController:
    return IntervalController(jitter=0.0, rng=random.Random(0), **kwargs)  # type: ignore[arg-type]


def test_alone_a_producer_commits_at_once() -> None:
    c = _controller()
    assert c.observe(0.01, rivals=0) == 0.0
    assert c.observe(0.5, rivals=0) == 0.0  # however slow its store


def test_each_producer_takes_an_equal_share_of_the_log() -> None:
    # T = (r + 1) w / U: 8 producers on a 4 ms store take 8 x 4 / 0.3 ms each.
    c = _controller()
    assert c.observe(0.004, rivals=7) == pytest.approx(8 * 0.004 / 0.3)
    # Two producers that see the same rivals and store choose the same interval, whatever
    # their batches (the window is the store's round trips, not building the entry).
    a, b = _controller(), _controller()
    for _ in range(5):
        a.observe(0.004, rivals=3)
        b.observe(0.004, rivals=3)
    assert a.interval == b.interval == pytest.approx(4 * 0.004 / 0.3)


def test_rivals_are_producers_not_entries() -> None:
    # Regression: the entries between a producer's commits were taken for rival producers,
    # so a slower producer, seeing more entries, backed off further and fell further behind
    # while the leader saw none and halved its wait. ``observe`` takes distinct producers:
    # a slow and a fast producer among 8 both see 7.
    slow, fast = _controller(), _controller()
    assert slow.observe(0.004, rivals=7) == fast.observe(0.004, rivals=7)


def test_a_descheduled_commit_does_not_lengthen_the_wait() -> None:
    # The window is the shortest of the last few: one commit kept off the CPU for 100 ms
    # inside its window says nothing of the store, and a mean made a starved producer wait
    # longer, commit less and starve more.
    c = _controller()
    for _ in range(10):
        c.observe(0.002, rivals=3)
    assert c.observe(0.1, rivals=3) == pytest.approx(4 * 0.002 / 0.3)
    # A store that did get slower is followed once its fast windows have aged out.
    for _ in range(IntervalController.WINDOWS):
        c.observe(0.02, rivals=3)
    assert c.interval == pytest.approx(4 * 0.02 / 0.3)


def test_a_rival_seen_counts_at_once_and_one_gone_fades_in_a_few_commits() -> None:
    c = _controller()
    c.observe(0.004, rivals=7)
    assert c.observe(0.004, rivals=2) == pytest.approx((7 * 0.8 + 1) * 0.004 / 0.3)
    waits = [c.observe(0.004, rivals=0) for _ in range(12)]
    assert waits[-1] == 0.0 and waits.index(0.0) <= 10  # alone again within ten commits


def test_a_producer_bound_by_its_uploads_spends_at_most_a_share_of_its_cpu_committing() -> None:
    # Writes waiting for the upload threads: each commit's CPU comes out of the uploads',
    # so the wait is at least the commits' median CPU over the share (5%), rivals or not.
    # Regression: 8 producers flat out on 2 cores spent 17-18% of their CPU committing.
    c = _controller()
    for _ in range(5):
        c.observe(0.001, rivals=7, cpu_s=0.003)
    assert c.interval == pytest.approx(8 * 0.001 / 0.3)  # not bound: the share alone
    bound = c.observe(0.001, rivals=7, cpu_s=0.003, bound=True)
    assert bound == pytest.approx(0.003 / IntervalController.BOUND_COMMIT_SHARE)
    # The median, not one commit that caught up with many entries.
    assert c.observe(0.001, rivals=7, cpu_s=0.5, bound=True) == pytest.approx(0.06)
    alone = _controller()
    assert alone.observe(0.001, rivals=0, cpu_s=0.002, bound=True) == pytest.approx(0.04)
    assert alone.observe(0.001, rivals=0, cpu_s=0.002) == 0.0


def test_the_wait_is_capped() -> None:
    c = _controller(max_s=0.05)
    assert c.observe(0.1, rivals=63) == 0.05


LATENCIES = (0.001, 0.01, 0.1)


def test_alone_a_producer_never_conflicts() -> None:
    run = simulate(1, 0.01, write_every=0.0005)
    assert len(run.attempts) > 1000 and run.conflict_ratio() == 0.0
    assert run.fragments[0] > 32 * len(run.attempts)  # batches of half the budget or more


@pytest.mark.parametrize("latency", LATENCIES)
def test_the_conflict_ratio_settles_where_the_share_puts_it_whatever_the_latency(
        latency: float) -> None:
    """Where the controller paces commits: writers always have fragments and the in-flight
    budget never half fills. With 8 producers each commits every 8 w / 0.3, about 27
    windows, and loses about a third of its races (seeds 1-3: 34-37% in the second half;
    the model's 26% leaves out the retries' own windows)."""
    run = simulate(8, latency, write_every=latency / 20, inflight=1 << 40, max_s=60.0)
    assert len(run.attempts) > 300
    assert run.conflict_ratio(after=2000 * latency) < 0.4  # the second half of the run


@pytest.mark.parametrize("producers", [3, 8])
def test_producers_sharing_the_log_commit_about_equally_often(producers: int) -> None:
    """Writers a little slower than the log, 2 ms requests, 30 s. When the rate grew per
    commit and every quiet commit halved the interval, one producer wrote 2,993 of 3,152
    versions among 3 (2,939 of 3,282 among 8); under the AIMD controller that followed,
    the least committing made 64-69% as many commits as the most. Each taking an equal
    share (seeds 1-3): 92-99%."""
    run = simulate(producers, 0.002, write_every=0.01, windows=15_000)
    commits = [run.versions.count(k) for k in range(producers)]
    assert min(commits) >= 0.8 * max(commits), commits
    assert run.conflict_ratio(after=15.0) < 0.4


def test_producers_starting_together_settle_in_one_round() -> None:
    """8 producers starting at once on a 50 ms store: over the first 400 windows (20 s),
    37-41% of attempts lost a race (seeds 1-3), about what the settled share loses: each
    learns its rivals from the entries its first commit folds in, with no run of lost races
    to double its way up (45-47% when a first loss set the interval to one window)."""
    for seed in (1, 2, 3):
        run = simulate(8, 0.05, write_every=0.05 / 20, windows=400, inflight=1 << 40,
                        seed=seed)
        assert run.conflict_ratio() < 0.45


def test_a_producer_left_alone_commits_at_once_within_a_few_commits() -> None:
    """7 of 8 producers stop: the one left goes back to committing at once (its gap, two
    windows) within a few commits, not after hundreds (the AIMD controller needed 200
    windows of quiet before each halving)."""
    latency, stop = 0.01, 10.0
    run = simulate(8, latency, write_every=latency / 20, inflight=1 << 40, max_s=60.0,
                    windows=2000, others_stop_at=stop)
    mine = [t for t, k in run.landings if k == 0 and t > stop]
    gaps = [b - a for a, b in zip(mine, mine[1:], strict=False)]
    settled = next(i for i, g in enumerate(gaps) if g < 5 * latency)
    assert settled <= 12 and max(gaps[settled:]) < 5 * latency, gaps[:20]


@pytest.mark.parametrize("latency", LATENCIES)
def test_the_gap_keeps_one_producer_from_capturing_the_log(latency: float) -> None:
    """Writers faster than the log: half the budget fills between commits, so the early
    trigger overrides the controller and the gap paces a producer's next commit. With it,
    no producer writes more than a few versions in a row (seeds 1-3: at most 2)."""
    fair = simulate(8, latency, write_every=latency / 20)
    assert len(fair.versions) > 1000
    assert fair.longest_run() <= 10, fair.longest_run()


def test_without_the_gap_the_winner_goes_again_before_its_rivals_can() -> None:
    """The producer that just won puts again before its rivals have read its entry, and
    wins again. On a fast store (1 ms requests, seeds 1-7) that gives runs of 6, 6, 3, 4,
    2, 7 and 46 versions in a row, against 2 with the gap (the equal shares space most
    commits on their own; under the AIMD controller, 6, 24, 6, 12 and 4 for seeds 1-5, and
    with one that halved its interval on every quiet commit, runs of hundreds)."""
    runs = [(simulate(8, 0.001, write_every=0.001 / 20, gap_windows=0.0, seed=seed),
             simulate(8, 0.001, write_every=0.001 / 20, seed=seed)) for seed in range(1, 8)]
    assert all(bare.longest_run() >= gapped.longest_run() for bare, gapped in runs)
    assert sum(bare.longest_run() for bare, _ in runs) > 2 * sum(g.longest_run() for _, g in runs)
    assert max(bare.longest_run() for bare, _ in runs) >= 10


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        IntervalController(max_s=-1)
    with pytest.raises(ValueError):
        IntervalController(utilization=0.0)


def test_in_the_model_a_host_sharing_one_commit_waits_less_than_a_commit_each() -> None:
    """``bench/dac.py``'s sizing of host-shared commits: 2 hosts x 8 producers writing 10
    fragments a second each on a 45 ms store. A committer each: 16 share the log and each
    commits every 16 windows / 0.3; one a host: 2 do (p99 2.5 s against 0.55 s, seed 1)."""
    from bench.dac import compare

    r = compare(2, 8, 0.045, 0.1, windows=2000)
    assert r["per host"]["p99_s"] < 0.5 * r["per producer"]["p99_s"]
    assert r["per host"]["conflict_ratio"] < r["per producer"]["conflict_ratio"]


def test_in_the_model_hosts_pooling_their_runs_wait_for_anyone_s_commit() -> None:
    """The same at 16 hosts: one committer a host still waits its host's turn of the one
    log, about every 16 windows; pooled, every commit carries every host's runs listed in
    its wait, and a sample waits for the next commit of any host (p99 0.68 s against 2.6 s
    at seed 1)."""
    from bench.dac import compare

    r = compare(16, 8, 0.045, 0.1, windows=1000)
    pooled = r["per host, runs pooled through the store"]
    assert pooled["p99_s"] < 0.5 * r["per host"]["p99_s"]
    assert pooled["p99_s"] < 1.0
