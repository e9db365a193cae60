"""The read-time planner: which groups a step takes, as a pure function, and planned one
step after another from any saved (step, cursor). What each step skipped is counted by the
reader (tests/read/test_selected.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lakestream.plan.choose import FRESH, Choice, choose, kept

G = 2


def _plan(versions: np.ndarray, accepted: np.ndarray, groups: int, k: int | None,
          drop: bool, step: int = 0, cursor: int = 0) -> list[Choice]:
    """Every step that the samples fill, from (step, cursor) on."""
    out = []
    while True:
        lo = cursor // G
        keep, _, stale = kept(step, G, versions[cursor:], accepted[lo:], k, drop)
        choice = choose(step, cursor, G, groups, keep=keep, stale=stale,
                        costs=np.zeros(len(accepted) - lo, np.int64))
        if choice is None:
            return out
        out.append(choice)
        step, cursor = step + 1, choice.end


streams = st.integers(4, 60).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 30), min_size=n * G, max_size=n * G),
    st.lists(st.booleans(), min_size=n, max_size=n)))


@settings(max_examples=150, deadline=None)
@given(streams, st.integers(1, 3), st.none() | st.integers(0, 5), st.booleans())
def test_steps_take_kept_groups_in_order_and_account_for_every_skipped_one(
        stream: tuple[list[int], list[bool]], groups: int, k: int | None, drop: bool) -> None:
    versions = np.sort(np.array(stream[0], np.int64))  # versions rise along the log, roughly
    accepted = np.array(stream[1])
    plan = _plan(versions, accepted, groups, k, drop)
    cursor = 0
    for t, c in enumerate(plan):
        assert c.step == t and len(c.groups) == groups
        assert np.all(np.diff(c.groups) > 0) and c.groups[0] >= cursor
        assert c.end == c.groups[-1] + G
        taken = c.groups // G
        assert accepted[taken].all()
        oldest = versions.reshape(-1, G).min(axis=1)
        if k is not None and drop:
            assert np.all(oldest[taken] >= t - k)  # nothing stale is trained
            assert not c.stale.any()
        elif k is not None:
            want = versions[(c.groups[:, None] + np.arange(G)).ravel()] < t - k
            assert np.array_equal(c.stale, want)
        # every group skipped between the cursor and the end had a reason
        for gi in range(cursor // G, c.end // G):
            if gi in taken:
                continue
            assert not accepted[gi] or (k is not None and drop and oldest[gi] < t - k)
        cursor = c.end
    # A plan stops only when what is left cannot fill a step.
    rest = _plan(versions, accepted, groups, k, drop, len(plan), cursor)
    assert rest == []


@settings(max_examples=100, deadline=None)
@given(streams, st.integers(1, 3), st.integers(0, 4), st.data())
def test_resuming_from_a_saved_step_and_cursor_makes_the_same_choices(
        stream: tuple[list[int], list[bool]], groups: int, k: int, data: st.DataObject) -> None:
    versions = np.array(stream[0], np.int64)
    accepted = np.array(stream[1])
    whole = _plan(versions, accepted, groups, k, True)
    if not whole:
        return
    at = data.draw(st.integers(0, len(whole) - 1))
    cursor = whole[at - 1].end if at else 0
    resumed = _plan(versions, accepted, groups, k, True, at, cursor)
    assert [(c.step, c.groups.tolist(), c.end) for c in resumed] == \
        [(c.step, c.groups.tolist(), c.end) for c in whole[at:]]


def test_a_null_version_is_never_stale() -> None:
    versions = np.array([FRESH, FRESH, 0, 0, 9, 9, 9, 9], np.int64)
    accepted = np.array([True, True, False, True])
    keep, dropped, stale = kept(9, G, versions, accepted, 2, True)
    assert keep.tolist() == [True, False, False, True]
    assert dropped.tolist() == [False, True, False, False]  # group 2 the filter rejected
    c = choose(9, 100, G, 2, keep=keep, stale=stale, costs=np.array([1, 2, 3, 4]))
    assert c is not None
    assert c.groups.tolist() == [100, 106] and c.end == 108
    assert c.costs.tolist() == [1, 4] and not c.stale.any()
    keep, dropped, stale = kept(9, G, versions, np.ones(4, bool), 2, False)
    assert keep.all() and not dropped.any()
    masked = choose(9, 100, G, 2, keep=keep, stale=stale, costs=np.zeros(4, np.int64))
    assert masked is not None and masked.stale.tolist() == [False, False, True, True]
    keep, _, stale = kept(9, G, versions, accepted, 2, True)
    assert choose(9, 0, G, 3, keep=keep, stale=stale, costs=np.zeros(4, np.int64)) is None
