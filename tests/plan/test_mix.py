"""The mix planner: pure, no torch, no I/O. Ranks partition every step, each source gives
exactly its take, a sealed source's samples come exactly once per epoch, shuffles keep
groups whole and are the same wherever they are computed."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lakestream.plan.mix import (
    KEPT_PER_SOURCE,
    MixPlan,
    SourcePlan,
    permutation,
    resume_position,
    source_key,
)
from lakestream.plan.slices import slice_offsets


def _read(plan: MixPlan, step: int, rank: int, world: int) -> list[list[int]]:
    return [[x for lo, hi in spans for x in range(lo, hi)]
            for spans in plan.rank_spans(step, rank, world)]


@st.composite
def _plans(draw: st.DrawFn, sealed: bool) -> tuple[MixPlan, int]:
    world = draw(st.sampled_from([1, 2, 4]))
    sources = []
    for _ in range(draw(st.integers(1, 3))):
        g = draw(st.sampled_from([1, 2]))
        take = world * g * draw(st.integers(1, 3))
        cycle = sealed and draw(st.booleans())
        n = g * draw(st.integers(1, 40)) if sealed else None
        sources.append(SourcePlan(take, g, cycle=cycle, sealed=n))
    if sealed and all(s.cycle for s in sources):
        sources[0] = SourcePlan(sources[0].take, sources[0].group_size,
                                sealed=sources[0].sealed)
    if sealed:  # an epoch of at least one step
        sources = [s if s.cycle else SourcePlan(s.take, s.group_size,
                                                sealed=max(s.sealed or 0, s.take))
                   for s in sources]
    window = draw(st.sampled_from([None, 1, 2, 3]))
    epochs = draw(st.sampled_from([1, 2])) if sealed else None
    return MixPlan(sources, shuffle_window=window, seed=draw(st.integers(0, 2**40)),
                   epochs=epochs), world


@settings(max_examples=150, deadline=None)
@given(_plans(sealed=False))
def test_ranks_partition_every_step_and_take_exactly_k(case: tuple[MixPlan, int]) -> None:
    plan, world = case
    for step in range(6):
        whole = _read(plan, step, 0, 1)
        per_rank = [_read(plan, step, r, world) for r in range(world)]
        for i, s in enumerate(plan.sources):
            assert [x for part in per_rank for x in part[i]] == whole[i]
            assert all(len(part[i]) == s.take // world for part in per_rank)
            assert max(whole[i]) < plan.needed(step)[i]
            # Groups stay whole and in order.
            g = s.group_size
            assert all(whole[i][j + r] == whole[i][j] + r and whole[i][j] % g == 0
                       for j in range(0, len(whole[i]), g) for r in range(g))
            # A resume at this step holds everything it and later steps read.
            assert plan.hold_from(step)[i] <= min(
                x for later in range(step, step + 4) for x in _read(plan, later, 0, 1)[i])


@settings(max_examples=150, deadline=None)
@given(_plans(sealed=True))
def test_each_sealed_sample_comes_once_per_epoch(case: tuple[MixPlan, int]) -> None:
    plan, world = case
    steps = plan.steps_per_epoch
    assert steps is not None and plan.num_steps == steps * (plan.epochs or 1)
    for epoch in range(plan.epochs or 1):
        read = [_read(plan, t, 0, 1) for t in range(epoch * steps, (epoch + 1) * steps)]
        for i, s in enumerate(plan.sources):
            got = [x for r in read for x in r[i]]
            assert s.sealed is not None
            if not s.cycle:  # the first steps x take positions, each sample at most once
                assert len(set(got)) == len(got) == steps * s.take
                assert all(0 <= x < s.sealed for x in got)
    for i, s in enumerate(plan.sources):
        if s.cycle:  # every N consecutive positions are a permutation of the source
            assert s.sealed is not None
            got = [x for t in range(plan.num_steps or 0) for x in _read(plan, t, 0, 1)[i]]
            for lo in range(0, len(got) - s.sealed + 1, s.sealed):
                assert sorted(got[lo:lo + s.sealed]) == list(range(s.sealed))


def test_one_source_in_log_order_is_the_plain_stream() -> None:
    plan = MixPlan([SourcePlan(take=12, group_size=2)])
    for step in range(5):
        for world in (1, 2, 3, 6):
            for rank in range(world):
                span = slice_offsets(step, 12, rank, world)
                assert plan.rank_spans(step, rank, world) == [[(span.start, span.stop)]]
        assert plan.needed(step) == [12 * (step + 1)] and plan.hold_from(step) == [12 * step]
    assert plan.num_steps is None


def test_a_live_window_is_read_once_whole_and_a_seal_ends_the_mix() -> None:
    plan = MixPlan([SourcePlan(take=4), SourcePlan(take=2)], shuffle_window=3, seed=5)
    assert [plan.needed(t) for t in range(4)] == [[12, 6]] * 3 + [[24, 12]]
    window = sorted(x for t in range(3) for x in _read(plan, t, 0, 1)[0])
    assert window == list(range(12))
    assert plan.hold_from(4) == [12, 6]
    sealed = plan.with_sealed([30, None])
    assert sealed.num_steps == 7  # 30 // 4: the last two samples are not read
    # The last window is shorter (offsets 24-29): it is permuted within itself.
    last = _read(sealed, 6, 0, 1)[0]
    assert len(set(last)) == 4 and all(24 <= x < 30 for x in last)
    assert sealed.needed(6) == [30, 18]


def test_permutations_are_fixed_by_their_key() -> None:
    assert permutation(10, 1, 2).tolist() == permutation(10, 1, 2).tolist()
    assert sorted(permutation(1000, 3).tolist()) == list(range(1000))
    assert permutation(1000, 3).tolist() != permutation(1000, 4).tolist()
    # Pinned: a change here would reshuffle every saved run.
    assert permutation(8, 0).tolist() == PINNED


PINNED = [1, 7, 2, 6, 4, 5, 3, 0]


@pytest.mark.parametrize("kwargs, message", [
    ({"sources": [SourcePlan(take=3, group_size=2)]}, "multiple of its group size"),
    ({"sources": [SourcePlan(take=2, cycle=True)]}, "cycle needs a sealed"),
    ({"sources": [SourcePlan(take=2)], "epochs": 2}, "epochs needs sealed sources"),
    ({"sources": [SourcePlan(take=2, cycle=True, sealed=4)], "epochs": 2},
     "a source that does not cycle"),
    ({"sources": [SourcePlan(take=2)], "shuffle_window": 0}, "shuffle_window"),
    ({"sources": []}, "at least one source"),
])
def test_bad_plans_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MixPlan(**kwargs)  # type: ignore[arg-type]


def test_a_world_that_splits_a_group_is_refused() -> None:
    plan = MixPlan([SourcePlan(take=8, group_size=2), SourcePlan(take=4, group_size=2)])
    plan.check_world(2)
    with pytest.raises(ValueError, match="source 1 takes 4 samples per step: world_size 4 "):
        plan.check_world(4)


def test_a_changed_mix_resumes_a_cycling_source_at_its_position() -> None:
    plan = MixPlan([SourcePlan(take=4, sealed=40), SourcePlan(take=2, cycle=True, sealed=6)])
    assert plan.cursor(5) == [20, 10]  # position 10: the cycled source's second pass
    assert plan.hold_from(5) == [20, 0]  # it holds all of itself
    shuffled = MixPlan([SourcePlan(take=4)], shuffle_window=3)
    assert shuffled.cursor(4) == shuffled.hold_from(4) == [12]  # its window's start


@settings(max_examples=150, deadline=None)
@given(_plans(sealed=True))
def test_a_fragment_is_read_within_the_windows_of_steps_a_reader_keeps(
        case: tuple[MixPlan, int]) -> None:
    # What lets a shuffled reader drop a fragment once the next window of steps is read
    # (one window more where windows are not aligned): within a source epoch, every read
    # of a fragment falls in one window of steps (two in a row where not aligned). A
    # fragment here is the largest block of offsets that never straddles a source window.
    plan, _ = case
    assume(plan.shuffle_window is not None)
    w, keep = plan.shuffle_window, 0 if plan.aligned else 1
    end = min(plan.num_steps or 60, 60)
    for i, s in enumerate(plan.sources):
        assert s.sealed is not None
        block = math.gcd(w * s.take, s.sealed)
        windows: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
        for step in range(end):
            for j, x in enumerate(_read(plan, step, 0, 1)[i]):
                if s.cycle:
                    epoch = (plan.position(i, step) + j) // s.sealed
                else:
                    assert plan.steps_per_epoch
                    epoch = step // plan.steps_per_epoch
                windows[epoch, x // block].add(step // w)
        assert all(max(t) - min(t) <= keep for t in windows.values()), dict(windows)


@settings(max_examples=200, deadline=None)
@given(st.booleans().flatmap(_plans), st.data())
def test_no_step_after_last_step_reads_what_a_step_read_until_the_source_comes_round(
        case: tuple[MixPlan, int], data: st.DataObject) -> None:
    # What lets a reader's cache drop a fragment once its last step is read: every later
    # read of offsets [lo, hi) in the same pass over the source (epoch, cycle) is at or
    # before last_step, and, where the source's windows are permuted, in the same source
    # window (a fragment across two permuted windows is read again when the second comes).
    # And it is not much later: the cache holds no more than the reads need.
    plan, _ = case
    w = plan.shuffle_window
    end = min(plan.num_steps or 40, 40)
    for i, s in enumerate(plan.sources):
        lo = data.draw(st.integers(0, 3 * s.take))
        hi = lo + data.draw(st.integers(1, 3 * s.take))
        reads: defaultdict[tuple[int, int], list[int]] = defaultdict(list)
        for step in range(end):
            for j, x in enumerate(_read(plan, step, 0, 1)[i]):
                if not lo <= x < hi:
                    continue
                if s.cycle:
                    assert s.sealed
                    turn = (plan.position(i, step) + j) // s.sealed
                else:
                    turn = step // plan.steps_per_epoch if plan.steps_per_epoch else 0
                permuted = w is not None and (s.cycle or plan.epochs is not None)
                reads[turn, x // (w * s.take) if permuted else 0].append(step)
        for steps in reads.values():
            for t in steps:
                last = plan.last_step(i, t, lo, hi)
                assert max(steps) <= last, (t, steps, last)
                assert last - t <= (hi - lo) // s.take + (1 if w is None else 2 * w)


def test_windows_align_unless_a_permuted_source_has_a_short_window_or_an_epoch_cuts_one(
        ) -> None:
    live = SourcePlan(4, 1)
    sealed = SourcePlan(4, 1, sealed=32)  # windows of 2 steps: 8 samples, 4 of them
    assert MixPlan([live, sealed], shuffle_window=2).aligned
    assert MixPlan([sealed], shuffle_window=2, epochs=3).aligned
    assert not MixPlan([SourcePlan(4, 1, sealed=36)], shuffle_window=2, epochs=3).aligned
    assert MixPlan([live, SourcePlan(4, 1, cycle=True, sealed=32)], shuffle_window=2).aligned
    assert not MixPlan([live, SourcePlan(4, 1, cycle=True, sealed=32, start=4)],
                       shuffle_window=2).aligned  # resumed inside a window


def test_a_long_run_over_a_cycling_source_keeps_a_bounded_plan() -> None:
    """A small cycling source wraps every few steps: a plan that kept every epoch's order of
    windows, or every window's permutation, would grow with the run."""
    plan = MixPlan([SourcePlan(take=4, cycle=True, sealed=12), SourcePlan(take=4, cycle=True,
                                                                         sealed=20)],
                   shuffle_window=2, seed=5)
    first = [_read(plan, step, 0, 1) for step in range(30)]
    for step in range(30, 3000):
        _read(plan, step, 0, 1)
    kept = len(plan._orders) + len(plan._sigmas)
    assert 0 < kept <= 2 * KEPT_PER_SOURCE * len(plan.sources)
    again = MixPlan(plan.sources, shuffle_window=2, seed=5)
    assert [_read(plan, step, 0, 1) for step in range(30)] == first == [
        _read(again, step, 0, 1) for step in range(30)]


def _epoch_samples(plan: MixPlan, i: int, step: int) -> list[tuple[int, int]]:
    """(source epoch, sample) of each slot source ``i`` fills at ``step``."""
    slots = np.arange(plan.sources[i].take)
    epochs, _ = plan._epoch_positions(i, step, slots)
    offsets, _ = plan._offsets(i, step, slots)
    assert offsets is not None
    return list(zip(epochs.tolist(), offsets.tolist(), strict=True))


@settings(max_examples=200, deadline=None)
@given(g=st.sampled_from([1, 2]), groups=st.integers(2, 30), take=st.integers(1, 4),
       window=st.integers(1, 4), seed=st.integers(0, 2**40), read=st.integers(1, 40),
       change=st.sampled_from(["added", "take", "both"]), new_take=st.integers(1, 4))
def test_a_changed_mix_reads_each_sample_of_a_cycling_source_once_per_epoch(
        g: int, groups: int, take: int, window: int, seed: int, read: int, change: str,
        new_take: int) -> None:
    n = g * groups
    other = SourcePlan(take=2, sealed=10_000)
    cycled = SourcePlan(take * g, g, cycle=True, sealed=n, key=source_key("table-of-s"))
    before = MixPlan([cycled], shuffle_window=window, seed=seed)
    got = [x for step in range(read) for x in _epoch_samples(before, 0, step)]
    cursor = before.cursor(read)[0]
    taken = new_take * g if change != "added" else cycled.take
    if change == "take":
        assume(taken != cycled.take)
    same = taken == cycled.take  # a source added before it changes neither key nor windows
    start = resume_position(cursor, n, same_order=same)
    moved = SourcePlan(taken, g, cycle=True, sealed=n, start=start, key=cycled.key)
    after = MixPlan([other, moved] if change != "take" else [moved], shuffle_window=window,
                    seed=seed, base_step=read)
    i = len(after.sources) - 1
    epoch = cursor // n
    step = read
    while after.position(i, step) < (epoch + 1) * n:
        got += _epoch_samples(after, i, step)
        step += 1
    current = [sample for e, sample in got if e == epoch]
    assert len(current) == len(set(current)), (cursor, start, current)
    if same:
        assert sorted(current) == list(range(n))  # and none skipped where nothing changed


def test_a_source_added_before_a_cycling_one_used_to_remap_its_positions() -> None:
    # Keyed by index (as plans were), the cycling source's permutations change when a source
    # is added before it: positions already read then name other samples.
    cycled = SourcePlan(take=2, cycle=True, sealed=48)
    before = MixPlan([cycled], shuffle_window=3, seed=1)
    seen = {x for step in range(8) for x in _read(before, step, 0, 1)[0]}
    moved = SourcePlan(take=2, cycle=True, sealed=48, start=before.cursor(8)[0])
    after = MixPlan([SourcePlan(take=2, sealed=1000), moved], shuffle_window=3, seed=1,
                    base_step=8)
    rest = [x for step in range(8, 24) for x in _read(after, step, 0, 1)[1]]
    assert set(rest) & seen  # read twice within the epoch
    keyed = [SourcePlan(take=2, cycle=True, sealed=48, key=7),
             SourcePlan(take=2, cycle=True, sealed=48, start=16, key=7)]
    before = MixPlan([keyed[0]], shuffle_window=3, seed=1)
    seen = {x for step in range(8) for x in _read(before, step, 0, 1)[0]}
    after = MixPlan([SourcePlan(take=2, sealed=1000), keyed[1]], shuffle_window=3, seed=1,
                    base_step=8)
    rest = [x for step in range(8, 24) for x in _read(after, step, 0, 1)[1]]
    assert not set(rest) & seen and len(seen | set(rest)) == 48


def test_a_plan_says_which_passes_are_read_again() -> None:
    """A source read once is never read again; a cycling one always is; with epochs, every
    step before the last epoch is (a host's disk cache lets go first what is not)."""
    once = MixPlan([SourcePlan(take=4)], shuffle_window=3)
    assert not once.reads_again(0, 0) and not once.reads_again(0, 10_000)
    mixed = MixPlan([SourcePlan(take=4, sealed=40), SourcePlan(take=2, cycle=True, sealed=6)])
    assert not mixed.reads_again(0, 3) and mixed.reads_again(1, 3)
    epochs = MixPlan([SourcePlan(take=4, sealed=40)], epochs=3, shuffle_window=2)
    assert epochs.steps_per_epoch == 10
    assert [epochs.reads_again(0, s) for s in (0, 9, 10, 19, 20, 29)] == \
        [True, True, True, True, False, False]
