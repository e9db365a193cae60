"""A stream's steps under a read-time policy (``SelectedSteps``), without torch: every rank of
every world size, resumed from any saved (step, cursor), reads the same full steps; and what
each step skipped is counted once (``skipped``), whether its choice passed over a group or
the group was dropped before the step could be filled."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lakestream
from lakestream.plan.choose import FRESH, kept
from lakestream.read.selected import ReadPolicy, SelectedSteps, Skipped, skipped
from lakestream.stream import Stream
from tests.plan.test_choose import _plan, streams

B, G, GROUPS, STEPS = 16, 2, 240, 12
SCHEMA = pa.schema([("id", pa.int64()), ("tokens", pa.list_(pa.int32())),
                    ("reward", pa.float32()), ("policy_version", pa.int64())])


def varied(group: pa.Table) -> bool:
    rewards = group.column("reward").to_pylist()
    return min(rewards) != max(rewards)


@pytest.fixture(scope="module")
def stream(tmp_path_factory: Any) -> Stream:
    s = lakestream.create(str(tmp_path_factory.mktemp("sel") / "s"), SCHEMA,
                          global_batch_size=B, group_size=G)
    rng = np.random.default_rng(1)
    n = GROUPS * G
    lengths = rng.integers(1, 60, n)
    # Versions rise one per 3 steps of the log; a fifth of the groups are 3 versions behind.
    versions = np.maximum(0, np.arange(n) // (3 * B) - (rng.random(GROUPS) < 0.2).repeat(G) * 3)
    table = pa.table({
        "id": pa.array(np.arange(n), pa.int64()),
        "tokens": pa.array([[0] * int(k) for k in lengths], pa.list_(pa.int32())),
        "reward": pa.array((rng.random(n) < 0.5).astype(np.float32)),
        "policy_version": pa.array(versions, pa.int64()),
    }, schema=SCHEMA)
    for lo in range(0, n, 40):
        s.append(table.slice(lo, 40))
    return s


def _ids(steps: SelectedSteps, step: int, rank: int, world: int) -> list[int]:
    return [int(x) for x in steps.read(step, rank, world, ["id"]).column("id").to_pylist()]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=st.sampled_from([1, 2, 4, 8]), at=st.integers(0, STEPS - 1),
       k=st.none() | st.integers(0, 3), drop=st.booleans(), filtered=st.booleans(),
       balance=st.booleans())
def test_every_rank_and_every_resume_reads_the_same_full_steps(
        stream: Stream, world: int, at: int, k: int | None, drop: bool, filtered: bool,
        balance: bool) -> None:
    policy = ReadPolicy(max_staleness=k, on_stale="drop" if drop or k is None else "mask",
                        accept=varied if filtered else None,
                        accept_columns=("reward",) if filtered else None,
                        balance="tokens" if balance else None)
    whole = SelectedSteps(stream, policy)
    steps = [s for s in range(STEPS) if whole.ready(s)]
    if at >= len(steps):
        return
    reference = {s: _ids(whole, s, 0, 1) for s in steps}
    cursor = whole.cursors(at)[0]
    for s in steps:
        ids = reference[s]
        assert len(ids) == B and len(set(ids)) == B
        if filtered:
            rewards = whole.read(s, 0, 1, ["reward"]).column("reward").to_pylist()
            assert all(rewards[j] != rewards[j + 1] for j in range(0, B, G))
    ranks = [SelectedSteps(stream, policy, base_step=at, base_cursor=cursor)
             for _ in range(world)]
    for s in steps[at:]:
        parts = [_ids(r, s, rank, world) for rank, r in enumerate(ranks)]
        assert sorted(x for p in parts for x in p) == sorted(reference[s])
        assert all(len(p) == B // world for p in parts)
        assert all(p[j] % G == 0 and p[j + 1] == p[j] + 1 for p in parts
                   for j in range(0, len(p), G))
        assert ranks[0].counts(s) == whole.counts(s)


@pytest.mark.parametrize("balance", [None, "tokens"])
def test_a_rank_outside_the_world_is_refused(stream: Stream, balance: str | None) -> None:
    # Regression: rank -1 read the last rank's groups, without a word.
    steps = SelectedSteps(stream, ReadPolicy(balance=balance))
    assert len(_ids(steps, 0, 1, 2)) == B // 2
    for rank in (-1, 2):
        with pytest.raises(ValueError, match=f"rank {rank} is outside world size 2"):
            steps.read(0, rank, 2)


@settings(max_examples=150, deadline=None)
@given(streams, st.integers(1, 3), st.none() | st.integers(0, 5), st.booleans())
def test_every_sample_a_step_passes_over_is_counted_once_with_its_reason(
        sampled: tuple[list[int], list[bool]], groups: int, k: int | None, drop: bool) -> None:
    versions = np.sort(np.array(sampled[0], np.int64))
    accepted = np.array(sampled[1])
    oldest = versions.reshape(-1, G).min(axis=1)
    cursor = 0
    for c in _plan(versions, accepted, groups, k, drop):
        lo, passed = cursor // G, (c.end - cursor) // G
        keep, dropped, _ = kept(c.step, G, versions[cursor:], accepted[lo:], k, drop)
        count = skipped(keep[:passed], dropped[:passed], G)
        assert c.end - cursor == groups * G + count.stale_dropped + count.filtered
        gone = [gi for gi in range(lo, lo + passed) if gi * G not in c.groups]
        for_staleness = [gi for gi in gone if k is not None and drop and oldest[gi] < c.step - k]
        assert count.stale_dropped == len(for_staleness) * G
        if k is None or not drop:
            assert count.stale_dropped == 0
        cursor = c.end


def test_a_null_version_is_never_stale_and_counts_say_what_was_skipped() -> None:
    versions = np.array([FRESH, FRESH, 0, 0, 9, 9, 9, 9], np.int64)
    accepted = np.array([True, True, False, True])
    keep, dropped, _ = kept(9, G, versions, accepted, 2, True)
    assert skipped(keep, dropped, G) == Skipped(stale_dropped=2, filtered=2)
    assert skipped(keep, dropped, G) + Skipped(1, 1) == Skipped(3, 3)
    keep, dropped, _ = kept(9, G, versions, np.ones(4, bool), 2, False)
    assert skipped(keep, dropped, G) == Skipped()  # masked: nothing is passed over


def reject_odd(group: pa.Table) -> bool:
    return group.column("id")[0].as_py() % 2 == 0


def test_groups_dropped_before_a_step_fills_count_in_that_step(tmp_path) -> None:
    """A step that cannot be filled yet drops the rejected groups ahead of it; when later
    samples fill it, its counts hold those groups too, as the samples between its cursor
    and the next step's say."""
    schema = pa.schema([("id", pa.int64()), ("policy_version", pa.int64())])
    s = lakestream.create(str(tmp_path / "s"), schema, global_batch_size=4, group_size=1)

    def append(ids: list[int], version: int = 9) -> None:
        s.append(pa.table({"id": ids, "policy_version": [version] * len(ids)}, schema=schema))

    append([1, 3])  # rejected by the filter
    append([10], version=-5)  # stale at step 0 (below 0 - 3)
    append([0, 2])
    steps = SelectedSteps(s, ReadPolicy(max_staleness=3, accept=reject_odd,
                                        accept_columns=("id",)))
    assert not steps.ready(0)  # two kept groups: 1, 3 and 10 are dropped meanwhile
    append([5, 4, 6])
    assert steps.ready(0)
    assert steps.read(0, 0, 1, ["id"]).column("id").to_pylist() == [0, 2, 4, 6]
    assert steps.counts(0) == {"stale_dropped": 1, "filtered": 3, "stale_masked": 0}
    assert steps.cursors(1)[0] - steps.cursors(0)[0] == 4 + 1 + 3
