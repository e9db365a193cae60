"""A stream's steps under a read-time policy (``SelectedSteps``), without torch: every rank of
every world size, resumed from any saved (step, cursor), reads the same full steps."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lakestream
from lakestream.read.selected import ReadPolicy, SelectedSteps
from lakestream.stream import Stream

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
