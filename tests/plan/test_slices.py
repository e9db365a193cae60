"""The rank slice, written once (``lakestream.plan.slices``): the shares of every rank of a
world partition what they split, in rank order, and every planner refuses the same worlds
and ranks, with the same words: a stream's steps, a mix's sources, a step's groups."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lakestream.plan.balance import balance_groups
from lakestream.plan.mix import MixPlan, SourcePlan
from lakestream.plan.slices import check_world, equal_count, rank_slice, slice_offsets


@given(st.integers(1, 8), st.integers(0, 6), st.integers(0, 50))
def test_the_shares_of_a_world_partition_what_they_split_in_rank_order(
        world: int, per_rank: int, step: int) -> None:
    n = world * per_rank
    shares = [rank_slice(n, r, world, "the items") for r in range(world)]
    assert [x for s in shares for x in s] == list(range(n))
    assert [g.tolist() for g in equal_count(n, world)] == [list(s) for s in shares]
    b = max(n, world)
    offsets = [x for r in range(world) for x in slice_offsets(step, b, r, world)]
    assert offsets == list(range(step * b, (step + 1) * b))


@pytest.mark.parametrize("world", [0, -1, True, 1.0, "2", None])
def test_a_world_size_that_is_not_a_positive_int_is_refused_everywhere(world: object) -> None:
    plan = MixPlan([SourcePlan(take=4)])
    for call in (lambda: check_world(4, 1, world),  # type: ignore[arg-type]
                 lambda: slice_offsets(0, 4, 0, world),  # type: ignore[arg-type]
                 lambda: equal_count(4, world),  # type: ignore[arg-type]
                 lambda: balance_groups([1, 2, 3, 4], world),  # type: ignore[arg-type]
                 lambda: plan.check_world(world),  # type: ignore[arg-type]
                 lambda: plan.rank_spans(0, 0, world)):  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="world_size must be a positive int"):
            call()


def test_a_numpy_world_size_is_a_world_size() -> None:
    assert check_world(8, 2, np.int64(2)) == 4
    assert [g.tolist() for g in equal_count(4, np.int64(2))] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("rank", [-1, 4, 5, True])
def test_a_rank_outside_the_world_is_refused_by_every_planner(rank: object) -> None:
    # Regression: a mix's rank 4 of 4 read the next step's first rows, and a negative
    # rank another rank's share, without a word.
    plan = MixPlan([SourcePlan(take=8), SourcePlan(take=4)])
    for call in (lambda: slice_offsets(0, 8, rank, 4),  # type: ignore[arg-type]
                 lambda: rank_slice(8, rank, 4, "the items"),  # type: ignore[arg-type]
                 lambda: plan.rank_spans(0, rank, 4)):  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="is outside world size 4"):
            call()


def test_a_world_that_does_not_divide_is_named_with_what_it_splits() -> None:
    with pytest.raises(ValueError, match="world_size 5 does not divide the global batch size 8"):
        check_world(8, 1, 5)
    with pytest.raises(ValueError, match="splits a group of 4 samples across ranks"):
        check_world(8, 4, 4)
    with pytest.raises(ValueError, match="world_size 3 does not divide the step's 8 groups"):
        equal_count(8, 3)
    with pytest.raises(ValueError, match="world_size 3 does not divide the step's 8 groups"):
        balance_groups(list(range(8)), 3)
    with pytest.raises(ValueError, match="source 1's take of 4"):
        MixPlan([SourcePlan(take=6), SourcePlan(take=4)]).rank_spans(0, 0, 3)
    with pytest.raises(ValueError, match="^source 0 takes 6 samples per step: world_size 4 "):
        MixPlan([SourcePlan(take=6), SourcePlan(take=4)]).check_world(4)
