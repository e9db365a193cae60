"""Read-time policies on StreamDataset: stale groups dropped (and steps refilled) or masked,
groups a filter rejects skipped, ranks balanced by tokens; every rank, world size and
restart derives the same steps."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

import lakestream
from lakestream.loaders import StreamDataset
from lakestream.log.progress import read_progress
from lakestream.producers import Producer
from tests.helpers import step_ids, worker_options

B, G = 8, 2
SCHEMA = pa.schema([
    ("id", pa.int64()),
    ("tokens", pa.list_(pa.int32())),
    ("reward", pa.float32()),
    ("policy_version", pa.int64()),
])


def group(first_id: int, version: int, *, equal: bool = False, length: int = 3) -> pa.Table:
    """One group of G samples with ids ``first_id..``; ``equal`` gives them equal rewards."""
    ids = list(range(first_id, first_id + G))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "tokens": pa.array([[i] * (length + j) for j, i in enumerate(ids)],
                           pa.list_(pa.int32())),
        "reward": pa.array([1.0] * G if equal else [float(j) for j in range(G)], pa.float32()),
        "policy_version": pa.array([version] * G, pa.int64()),
    }, schema=SCHEMA)


def varied(rewards: pa.Table) -> bool:
    """A DAPO filter: keeps groups whose rewards are not all equal."""
    values = rewards.column("reward").to_pylist()
    return min(values) != max(values)


def _written(tmp_path: Any, groups: int = 120, seal: bool = False) -> str:
    """A stream whose versions rise by one every 6 groups (1.5 steps), every fifth group
    three versions behind, a third of whose groups have equal rewards, with lengths
    varying 1..40 tokens."""
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B, group_size=G)
    rng = np.random.default_rng(5)
    parts = [group(2 * i, max(0, i // 6 - 3 * (i % 5 == 0)), equal=i % 3 == 1,
                   length=int(rng.integers(1, 40))) for i in range(groups)]
    for k in range(0, groups, 5):
        s.append(pa.concat_tables(parts[k:k + 5]))
    if seal:
        s.seal()
    return s.uri


POLICY = {"max_staleness": 1, "accept": varied, "accept_columns": ["reward"],
          "balance": "tokens"}


def test_drop_and_filter_fill_every_step_with_kept_groups_only(tmp_path) -> None:
    uri = _written(tmp_path)
    counts = []
    seen: list[int] = []
    ds = StreamDataset(uri, group=None, timeout=5, max_steps=12, **POLICY)
    for batch in ds:
        step = int(batch["step"])
        versions = batch["policy_version"].tolist()
        ids = [int(x) for x in batch["id"]]
        assert len(ids) == B
        assert all(step - v <= 1 for v in versions)
        rewards = batch["reward"].tolist()
        assert all(rewards[j] != rewards[j + 1] for j in range(0, B, G))  # all varied
        seen += ids
        counts.append(batch["read_policy"])
    assert len(seen) == len(set(seen)) == 12 * B
    assert sum(c["filtered"] for c in counts) > 0
    assert sum(c["stale_dropped"] for c in counts) > 0
    # Every sample below the last cursor was either trained or counted as dropped.
    cursor = int(json.loads(ds.state_dict()["mix"])["cursors"][0])
    assert len(seen) + sum(c["filtered"] + c["stale_dropped"] for c in counts) == cursor


def test_mask_keeps_stale_samples_and_marks_exactly_them(tmp_path) -> None:
    uri = _written(tmp_path)
    ds = StreamDataset(uri, group=None, timeout=5, max_steps=10, max_staleness=1,
                       on_stale="mask")
    masked = 0
    for batch in ds:
        step = int(batch["step"])
        assert [int(x) for x in batch["id"]] == list(range(step * B, (step + 1) * B))
        want = [step - int(v) > 1 for v in batch["policy_version"]]
        assert batch["stale"].tolist() == want
        assert batch["read_policy"]["stale_masked"] == sum(want)
        assert batch["read_policy"]["stale_dropped"] == 0
        masked += sum(want)
    assert masked > 0


@pytest.mark.parametrize("on_stale", ["drop", "mask"])
def test_max_staleness_holds_exactly_with_producers_racing_ahead_of_a_slow_trainer(
        tmp_path, on_stale: str) -> None:
    """Three producers stamp each group with the trainer's published policy version and
    write as fast as they can, with no admission bound; the trainer is slow. The read-time
    policy alone keeps what is trained within ``max_staleness``. The producers write until
    the trainer is done (within bounds): with a fixed 2,000 groups each, a trainer slowed
    by dropping hundreds of stale samples a step could find them all written and stale
    before its last step (step 22 of 25, once, on a loaded machine)."""
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B, group_size=G)
    k, steps = 2, 25
    deadline = time.monotonic() + 120
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce(i: int) -> None:
        try:
            with Producer(s.uri, f"rollout-{i}") as p:
                n = 0
                while not stop.is_set() and n < 50_000 and time.monotonic() < deadline:
                    progress = read_progress(p.stream.store, "train")
                    version = progress.policy_version or 0 if progress else 0
                    p.write(group(1_000_000 * i + G * n, version))
                    n += 1
                    # Three producers at ~100 groups/s each: over twice the ~130 groups/s the
                    # trainer takes, under what it can read and drop on two cores. Flat out
                    # (~500/s) they outran its reading, every group it read was stale, and
                    # whether it finished in the 120 s depended on the machine's load.
                    time.sleep(0.01)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    ds = StreamDataset(s.uri, group="train", timeout=30, max_steps=steps, max_staleness=k,
                       on_stale=on_stale, progress_interval_s=0.01)
    ds.policy_version = 0
    worst, skipped, trained = 0, 0, []
    try:
        for batch in ds:
            step = int(batch["step"])
            versions = [int(v) for v in batch["policy_version"]]
            if on_stale == "drop":
                worst = max(worst, max(step - v for v in versions))
                skipped += batch["read_policy"]["stale_dropped"]
            else:
                stale = batch["stale"].tolist()
                assert stale == [step - v > k for v in versions]
                worst = max([worst, *(step - v for v, x in zip(versions, stale, strict=True)
                                      if not x)])
                skipped += batch["read_policy"]["stale_masked"]
            trained += [int(x) for x in batch["id"]]
            time.sleep(0.03)  # the trainer is slower than the producers
            ds.policy_version = step + 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    assert len(trained) == len(set(trained)) == steps * B
    assert worst <= k
    assert skipped > 0, "the producers never got ahead: the test shows nothing"


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_reads_its_share_of_the_same_steps(tmp_path, world: int) -> None:
    uri = _written(tmp_path)
    whole = step_ids(StreamDataset(uri, group=None, timeout=5, max_steps=10, **POLICY))
    ranks = [step_ids(StreamDataset(uri, group=None, timeout=5, max_steps=10, rank=r,
                                  world_size=world, **POLICY)) for r in range(world)]
    for t, (step, ids) in enumerate(whole):
        parts = [r[t][1] for r in ranks]
        assert all(r[t][0] == step for r in ranks)
        assert sorted(x for p in parts for x in p) == sorted(ids)
        assert all(len(p) == B // world for p in parts)
        assert all(p[j] % G == 0 and p[j + 1] == p[j] + 1 for p in parts
                   for j in range(0, len(p), G))  # groups stay whole


def test_balancing_by_tokens_evens_the_ranks_out(tmp_path) -> None:
    uri = _written(tmp_path)
    world = 2

    def loads(**kwargs: Any) -> list[int]:
        per_rank = []
        for r in range(world):
            ds = StreamDataset(uri, group=None, timeout=5, max_steps=10, rank=r,
                               world_size=world, **kwargs)
            per_rank.append([int(b["tokens_lengths"].sum()) for b in ds])
        return [max(x) for x in zip(*per_rank, strict=True)]

    balanced = loads(balance="tokens")
    equal = loads(max_staleness=1000)  # a policy that drops nothing: equal shares
    assert sum(balanced) < sum(equal)


def test_resume_with_another_world_size_continues_the_same_steps(tmp_path) -> None:
    uri = _written(tmp_path)
    whole = step_ids(StreamDataset(uri, group=None, timeout=5, max_steps=12, **POLICY))
    first = StreamDataset(uri, group=None, timeout=5, max_steps=12, rank=0, world_size=2,
                          **POLICY)
    assert step_ids(first, 5) == [(s, ids) for s, ids in step_ids(
        StreamDataset(uri, group=None, timeout=5, max_steps=5, rank=0, world_size=2,
                      **POLICY))]
    state = first.state_dict()
    assert state["next_step"] == 5
    resumed = []
    for r in range(4):
        ds = StreamDataset(uri, group=None, timeout=5, max_steps=12, rank=r, world_size=4,
                           **POLICY)
        ds.load_state_dict(state)
        resumed.append(step_ids(ds))
    for t, (step, ids) in enumerate(whole[5:]):
        assert all(r[t][0] == step for r in resumed)
        assert sorted(x for r in resumed for x in r[t][1]) == sorted(ids)


def test_dataloader_workers_read_the_same_steps(tmp_path) -> None:
    uri = _written(tmp_path)
    whole = step_ids(StreamDataset(uri, group=None, timeout=5, max_steps=10, **POLICY))
    ds = StreamDataset(uri, group=None, timeout=5, max_steps=10, **POLICY)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    assert step_ids(loader) == whole


def test_a_sealed_stream_ends_when_what_is_left_cannot_fill_a_step(tmp_path) -> None:
    uri = _written(tmp_path, groups=20, seal=True)
    got = step_ids(StreamDataset(uri, group=None, timeout=5, accept=varied,
                               accept_columns=["reward"]))
    kept = sum(1 for i in range(20) if i % 3 != 1)  # 13 varied groups of 2: 3 steps of 8
    assert [s for s, _ in got] == list(range(kept * G // B))


def test_checkpoint_markers_and_progress_hold_from_the_cursor(tmp_path) -> None:
    uri = _written(tmp_path)
    ds = StreamDataset(uri, timeout=5, max_steps=6, progress_interval_s=0.01, **POLICY)
    step_ids(ds)
    cursor = int(json.loads(ds.state_dict()["mix"])["cursors"][0])
    assert cursor > 6 * B  # groups were skipped
    ds.commit_checkpoint()
    stream = lakestream.open(uri)
    assert stream.checkpoints("train")[-1].step == cursor // B
    progress = read_progress(stream.store, "train")
    assert progress is not None and progress.step == cursor // B


def test_a_policy_takes_over_from_a_log_order_state(tmp_path) -> None:
    uri = _written(tmp_path)
    plain = StreamDataset(uri, group=None, timeout=5, max_steps=3)
    step_ids(plain)
    ds = StreamDataset(uri, group=None, timeout=5, max_steps=5, **POLICY)
    ds.load_state_dict(plain.state_dict())
    got = step_ids(ds)
    assert [s for s, _ in got] == [3, 4]
    assert min(x for _, ids in got for x in ids) >= 3 * B


@pytest.mark.parametrize("kwargs, message", [
    ({"max_staleness": -1}, "max_staleness"),
    ({"max_staleness": 1, "on_stale": "skip"}, "on_stale"),
    ({"accept": "yes"}, "accept"),
    ({"accept": varied, "accept_columns": ["nope"]}, "accept_columns"),
    ({"balance": "reward"}, "list column"),
    ({"balance": "nope"}, "not a column"),
    ({"max_staleness": 1, "shuffle_window": 2}, "log order"),
    ({"accept_columns": ["reward"]}, "give accept"),
    ({"on_stale": "mask"}, "give max_staleness"),
])
def test_bad_policies_are_refused_by_name(tmp_path, kwargs: dict[str, Any],
                                          message: str) -> None:
    uri = _written(tmp_path, groups=5)
    with pytest.raises(ValueError, match=message):
        StreamDataset(uri, group=None, **kwargs)


def test_bad_policy_columns_are_refused_by_name(tmp_path) -> None:
    uri = _written(tmp_path, groups=5)
    with pytest.raises(TypeError, match="list of column names"):
        StreamDataset(uri, group=None, accept=varied, accept_columns="reward")
    for name, t in (("read_policy", pa.int64()), ("policy_version", pa.float32())):
        schema = pa.schema([("id", pa.int64()), (name, t)] + (
            [("policy_version", pa.int64())] if name != "policy_version" else []))
        other = lakestream.create(str(tmp_path / name), schema, global_batch_size=2)
        with pytest.raises(ValueError, match=name):
            StreamDataset(other.uri, group=None, max_staleness=1)


def test_max_staleness_needs_a_policy_version_column(tmp_path) -> None:
    from tests.helpers import SCHEMA as PLAIN

    s = lakestream.create(str(tmp_path / "p"), PLAIN, global_batch_size=4)
    with pytest.raises(ValueError, match="policy_version"):
        StreamDataset(s.uri, group=None, max_staleness=2)


def test_a_version_range_counts_from_its_oldest_version(tmp_path) -> None:
    """A partial rollout resumed under new weights carries ``policy_version_min/max``: its
    staleness is that of the oldest weights."""
    schema = pa.schema([("id", pa.int64()), ("policy_version_min", pa.int64()),
                        ("policy_version_max", pa.int64())])
    s = lakestream.create(str(tmp_path / "r"), schema, global_batch_size=2, group_size=2)
    for i in range(6):  # group 2 began under version 0 and finished under version 3
        oldest = 0 if i == 2 else i
        s.append(pa.table({"id": [2 * i, 2 * i + 1], "policy_version_min": [oldest] * 2,
                           "policy_version_max": [i] * 2}, schema=schema))
    got = step_ids(StreamDataset(s.uri, group=None, timeout=5, max_steps=4,
                                 max_staleness=1))
    assert got == [(0, [0, 1]), (1, [2, 3]), (2, [6, 7]), (3, [8, 9])]


def test_an_int32_policy_version_is_compared_as_an_integer(tmp_path) -> None:
    schema = pa.schema([("id", pa.int64()), ("policy_version", pa.int32())])
    s = lakestream.create(str(tmp_path / "i"), schema, global_batch_size=2, group_size=2)
    for i in range(4):
        s.append(pa.table({"id": [2 * i, 2 * i + 1], "policy_version": [0 if i == 1 else i] * 2},
                          schema=schema))
    got = step_ids(StreamDataset(s.uri, group=None, timeout=5, max_steps=3, max_staleness=0))
    assert got == [(0, [0, 1]), (1, [4, 5]), (2, [6, 7])]


def test_a_filter_rejecting_everything_keeps_nothing_in_memory(tmp_path) -> None:
    from lakestream.read.selected import ReadPolicy, SelectedSteps

    uri = _written(tmp_path, groups=120)
    steps = SelectedSteps(lakestream.open(uri), ReadPolicy(accept=lambda g: False))
    assert not steps.ready(0)
    assert len(steps._versions) == 0 and steps._lo == 120 * G
    assert steps.progress_offsets(0) == [120 * G]  # everything is known to be skipped


def test_a_live_stream_plans_in_the_trainer_process_for_state_markers_and_progress(
        tmp_path) -> None:
    """Under StreamLoader with workers the trainer process's dataset reads no steps: it plans
    them for its state, markers and progress, from a handle opened before the data came."""
    from lakestream.loaders import StreamLoader

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B, group_size=G)
    ds = StreamDataset(s.uri, group="train", timeout=10, max_steps=6, progress_interval_s=0.01,
                       accept=varied, accept_columns=["reward"])
    for i in range(60):
        s.append(group(2 * i, 0, equal=i % 2 == 1))
    got = step_ids(StreamLoader(ds, **worker_options(1)))
    assert [t for t, _ in got] == list(range(6))
    cursor = int(json.loads(ds.state_dict()["mix"])["cursors"][0])
    assert cursor == 6 * 2 * B - G  # every other group skipped; the last skipped one ahead
    assert ds.commit_checkpoint() is not None
    assert lakestream.open(s.uri).checkpoints("train")[-1].step == cursor // B
    assert ds.publish_errors == 0
    progress = read_progress(s.store, "train")
    assert progress is not None and progress.step == cursor // B


def test_progress_counts_the_groups_known_skipped_so_bounded_producers_fill_the_step(
        tmp_path) -> None:
    """Stale groups landing late, more than max_lag_steps of them, must not stop producers
    (bounded by the trainer's progress) while the trainer waits for fresh ones."""
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B, group_size=G)
    k = 1
    for i in range(12):
        s.append(group(2 * i, i // 4))  # 3 fresh steps
    ds = StreamDataset(s.uri, group="train", timeout=10, max_staleness=k,
                       progress_interval_s=0.01)
    it = iter(ds)
    for _ in range(3):
        ds.policy_version = int(next(it)["step"]) + 1
    for i in range(12, 20):  # two steps' worth of groups generated long ago
        s.append(group(2 * i, 0))
    ds.publish_progress()
    with Producer(s.uri, "late", max_lag_steps=k) as p:
        assert p.wait_for_lag(timeout=5)  # skipped groups do not count as lag
        for i in range(20, 24):
            p.write(group(2 * i, 3))
    batch = next(it)
    assert int(batch["step"]) == 3 and min(int(x) for x in batch["id"]) == 40
    assert batch["read_policy"]["stale_dropped"] == 8 * G
    ds.close()


def test_save_checkpoint_with_workers_holds_from_the_least_advanced_worker(tmp_path) -> None:
    """A StatefulDataLoader's workers each plan from their own saved (step, cursor): the
    marker must hold from the lowest cursor, or retention reclaims what a lagging worker
    reads again."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lakestream.loaders import load_checkpoint, save_checkpoint

    uri = _written(tmp_path)
    kw: dict[str, Any] = {"group": "train", "timeout": 5, "max_steps": 12, "keep_last": 1,
                          **POLICY}
    whole = step_ids(StreamDataset(uri, **{**kw, "group": None}))
    loader = StatefulDataLoader(StreamDataset(uri, **kw), batch_size=None, num_workers=2)
    it = iter(loader)
    first = [next(it) for _ in range(5)]
    assert [int(b["step"]) for b in first] == list(range(5))
    save_checkpoint({}, str(tmp_path / "ckpt"), loader)
    del it
    stream = lakestream.open(uri)
    assert stream.state.reclaimed_below > 0  # retention ran
    resumed = StatefulDataLoader(StreamDataset(uri, **kw), batch_size=None, num_workers=2)
    load_checkpoint({}, str(tmp_path / "ckpt"), resumed)
    assert step_ids(resumed) == whole[5:]


def test_a_policy_change_under_worker_states_is_refused(tmp_path, monkeypatch) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    # torchdata does not tell workers whose iteration raised to stop: shutting each down
    # waits for this interval (5 s), then kills it.
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.2)

    from lakestream.errors import LakestreamError

    uri = _written(tmp_path)
    for before, after in (({}, POLICY), (POLICY, {})):
        loader = StatefulDataLoader(StreamDataset(uri, group=None, max_steps=8, timeout=5,
                                                  **before), batch_size=None, num_workers=2)
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = loader.state_dict()
        del it
        other = StatefulDataLoader(StreamDataset(uri, group=None, max_steps=8, timeout=5,
                                                 **after), batch_size=None, num_workers=2)
        other.load_state_dict(state)
        with pytest.raises(LakestreamError, match="read policy|log order"):
            list(other)
    # The failed iterator is collected here, while its workers' join timeout is short.
    gc.collect()


def test_a_reader_under_a_staleness_bound_and_balancing_never_imports_pandas(tmp_path) -> None:
    """The policy's plan reads each group's policy version and token counts as NumPy; through
    pyarrow's conversion that imported pandas (installed here), 0.2-0.4 s a reader's first
    step waited for. Read in a process of its own."""
    uri = _written(tmp_path)
    code = f"""
import sys
from lakestream.loaders import StreamDataset
got = list(StreamDataset({uri!r}, group=None, timeout=5, max_steps=4, max_staleness=1,
                         balance="tokens"))
print(len(got), "pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["4", "False"]
