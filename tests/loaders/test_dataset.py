"""StreamDataset in one process: slices, collate, workers, tailing, resume."""

from __future__ import annotations

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
import torch.distributed.checkpoint as dcp

import lakestream
from lakestream.errors import StepNotAvailableError
from lakestream.loaders import StreamDataset, StreamLoader, collate_table, save_checkpoint
from lakestream.producers import Producer
from tests.helpers import SCHEMA, ids, rows, worker_options

B = 12


def _stream(uri: str, steps: int, options: dict[str, str] | None = None) -> lakestream.Stream:
    s = lakestream.create(uri, SCHEMA, global_batch_size=B, storage_options=options)
    for k in range(steps * 2):
        s.append(rows(6 * k, 6))
    return s


def _ids(batch: dict[str, Any]) -> list[int]:
    return [int(x) for x in batch["id"]]


def test_each_item_is_a_rank_slice(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"), 3)
    for world in (1, 2, 3, 4, 6):
        for rank in range(world):
            ds = StreamDataset(s.uri, rank=rank, world_size=world, max_steps=3)
            got = [(b["step"], _ids(b)) for b in ds]
            assert got == [(k, ids(s.read_step(k, rank, world))) for k in range(3)]


def test_world_size_must_divide_the_batch(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"), 1)
    with pytest.raises(ValueError, match="does not divide the global batch size 12"):
        StreamDataset(s.uri, rank=0, world_size=5)
    with pytest.raises(ValueError, match="outside world size"):
        StreamDataset(s.uri, rank=2, world_size=2)
    with pytest.raises(ValueError, match="unknown columns"):
        StreamDataset(s.uri, rank=0, world_size=1, columns=["nope"])


def test_rank_comes_from_the_environment(tmp_path, monkeypatch) -> None:
    s = _stream(str(tmp_path / "s"), 1)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    ds = StreamDataset(s.uri)
    assert (ds.rank, ds.world_size) == (1, 3)


def test_padded_and_packed_collate() -> None:
    table = pa.table({"id": pa.array([1, 2], pa.int64()),
                      "tokens": pa.array([[1, 2, 3], [4]], pa.list_(pa.int32())),
                      "name": ["a", "b"]})
    padded = collate_table(table)
    assert padded["tokens"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert padded["tokens_lengths"].tolist() == [3, 1] and padded["name"] == ["a", "b"]
    assert padded["tokens"].dtype == torch.int32 and padded["id"].dtype == torch.int64
    packed = collate_table(table, "packed")
    assert packed["tokens"].tolist() == [1, 2, 3, 4]
    assert packed["tokens_offsets"].tolist() == [0, 3, 4]


@pytest.mark.parametrize("longest", [5, 700])  # below and above ROW_COPY_WIDTH
@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_collate_of_sliced_chunks_with_nulls_matches_the_rows(mode: str, longest: int) -> None:
    """A step's table is slices of several fragments: each chunk is padded or packed where
    it is, and the result is what the rows say, whatever the chunks' offsets."""
    rng = np.random.default_rng(longest)

    def chunk(n: int) -> pa.Table:
        lists = [None if k % 5 == 3 else rng.integers(0, 99, rng.integers(0, longest + 1))
                 .tolist() for k in range(n)]
        lists[0] = list(range(longest))
        return pa.table({"tokens": pa.array(lists, pa.list_(pa.int32())),
                         "mask": pa.array([None if v is None else [x % 2 == 0 for x in v]
                                           for v in lists], pa.list_(pa.bool_())),
                         "logprobs": pa.array([None if v is None else [x / 4 for x in v]
                                               for v in lists], pa.list_(pa.float32()))})

    table = pa.concat_tables([chunk(9).slice(2, 5), chunk(1), chunk(7).slice(3)])
    assert table.column("tokens").num_chunks == 3
    out = collate_table(table, mode)
    for name, dtype in (("tokens", torch.int32), ("mask", torch.bool),
                        ("logprobs", torch.float32)):
        rows = [v or [] for v in table.column(name).to_pylist()]
        assert out[name].dtype == dtype
        if mode == "packed":
            assert out[name].tolist() == [x for v in rows for x in v]
            assert out[f"{name}_offsets"].tolist() == np.cumsum(
                [0] + [len(v) for v in rows]).tolist()
        else:
            width = max(len(v) for v in rows)
            assert out[name].tolist() == [v + [0] * (width - len(v)) for v in rows]
            assert out[f"{name}_lengths"].tolist() == [len(v) for v in rows]


@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_collate_reads_null_values_in_lists_as_zeros_and_many_small_chunks_whole(
        mode: str) -> None:
    rows = [[1, None, 3], [4], [], [5, 6]] * 8
    one = pa.table({"tokens": pa.array(rows, pa.list_(pa.int32()))})
    table = pa.concat_tables([one.slice(k, 1) for k in range(len(rows))])
    assert table.column("tokens").num_chunks == len(rows)  # a chunk per sample
    clean = [[x or 0 for x in v] for v in rows]
    for t in (one, table):
        out = collate_table(t, mode)
        assert out["tokens"].dtype == torch.int32
        if mode == "packed":
            assert out["tokens"].tolist() == [x for v in clean for x in v]
        else:
            assert out["tokens"].tolist() == [v + [0] * (3 - len(v)) for v in clean]


@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_shared_collate_makes_the_same_tensors_in_shared_memory(mode: str) -> None:
    """What a DataLoader worker makes: the same tensors, already in shared memory, so that
    handing them to the trainer process copies nothing more."""
    table = pa.table({"id": pa.array([1, 2, 3], pa.int64()),
                      "tokens": pa.array([[1, 2, 3], [4], []], pa.list_(pa.int32())),
                      "reward": pa.array([0.5, 1.5, 2.5], pa.float32())})
    plain, shared = collate_table(table, mode), collate_table(table, mode, shared=True)
    assert plain.keys() == shared.keys()
    for key, value in plain.items():
        assert torch.equal(value, shared[key]) and value.dtype == shared[key].dtype, key
    assert all(v.is_shared() for v in shared.values())
    assert not plain["tokens"].is_shared()
    shared["tokens"][0] = 9  # writable, like the copies it replaces


def test_a_callable_collate_gets_the_table(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"), 2)
    ds = StreamDataset(s.uri, rank=0, world_size=1, max_steps=2, collate=lambda t: t.num_rows)
    assert list(ds) == [12, 12]


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_yields_every_step_once_in_order(tmp_path, workers: int) -> None:
    s = _stream(str(tmp_path / "s"), 5)
    ds = StreamDataset(s.uri, rank=1, world_size=2, max_steps=5)
    loader = StreamLoader(ds, num_workers=workers)
    got = [(int(b["step"]), _ids(b)) for b in loader]
    assert got == [(k, ids(s.read_step(k, 1, 2))) for k in range(5)]
    assert ds.state_dict()["next_step"] == 5


def test_breaking_out_of_a_live_stream_stops_waiting_workers_at_once(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"), 2)
    loader = StreamLoader(StreamDataset(s.uri, rank=0, world_size=1), **worker_options(2))
    batches = iter(loader)
    assert [int(next(batches)["step"]) for _ in range(2)] == [0, 1]
    time.sleep(0.2)  # both workers are now waiting for steps no producer will commit
    t0 = time.monotonic()
    batches.close()
    # A DataLoader gives each worker still busy 5 s to exit before it kills it.
    assert time.monotonic() - t0 < 4
    assert loader.dataset.stop is None  # an iteration in the trainer process waits again


def test_tailing_waits_for_producers_and_times_out(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    writer = lakestream.open(s.uri)

    def produce() -> None:
        for k in range(6):
            time.sleep(0.05)
            writer.append(rows(2 * k, 2))

    t = threading.Thread(target=produce)
    t.start()
    ds = StreamDataset(s.uri, rank=0, world_size=1, max_steps=3, timeout=10)
    got = [(b["step"], _ids(b)) for b in ds]
    t.join()
    assert got == [(0, [0, 1, 2, 3]), (1, [4, 5, 6, 7]), (2, [8, 9, 10, 11])]
    late = StreamDataset(s.uri, rank=0, world_size=1, start_step=3, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(StepNotAvailableError, match="step 3 .* did not become visible"):
        next(iter(late))
    assert 0.3 <= time.monotonic() - t0 < 5


def _run(uri: str, world: int, workers: int, start: dict[str, Any] | None, steps: int,
         ckpt: Path | None = None) -> tuple[list[list[int]], dict[str, Any] | None]:
    """Reads ``steps`` steps on every rank of ``world``; returns each step's ids (ranks
    concatenated) and, if ``ckpt``, rank 0's state saved there with DCP."""
    per_rank = []
    state = None
    for rank in range(world):
        ds = StreamDataset(uri, rank=rank, world_size=world)
        if start is not None:
            ds.load_state_dict(start)
        loader = StreamLoader(ds, **worker_options(workers))
        got = []
        for batch in loader:
            got.append(_ids(batch))
            if len(got) == steps:
                break
        per_rank.append(got)
        if rank == 0 and ckpt is not None:
            save_checkpoint({"model": torch.zeros(2)}, str(ckpt), ds)
            state = ds.state_dict()
    return [sum(parts, []) for parts in zip(*per_rank, strict=True)], state


# Growing the world with workers ((1, 4) at 2 workers: eight spawned workers, 50 s) is in
# the elastic matrix (tests/reliability/test_elastic.py), which also goes through StreamLoader.
@pytest.mark.parametrize("workers, before, after",
                         [(0, 2, 2), (0, 2, 1), (0, 1, 4), (2, 2, 2), (2, 2, 1)])
def test_resume_from_a_dcp_checkpoint_equals_an_uninterrupted_run(
        tmp_path, workers: int, before: int, after: int) -> None:
    s = _stream(str(tmp_path / "s"), 6)
    whole, _ = _run(s.uri, 1, 0, None, 6)
    head, _ = _run(s.uri, before, workers, None, 2, ckpt=tmp_path / "ckpt")
    fresh = StreamDataset(s.uri, rank=0, world_size=after)
    dcp.load({"model": torch.ones(2), "data": fresh}, checkpoint_id=str(tmp_path / "ckpt"))
    assert fresh.state_dict()["next_step"] == 2
    tail, _ = _run(s.uri, after, workers, fresh.state_dict(), 4)
    assert head + tail == whole
    markers = lakestream.open(s.uri).checkpoints("train")
    assert [(m.step, m.checkpoint_id) for m in markers] == [(2, str(tmp_path / "ckpt"))]


def test_state_of_another_stream_is_refused(tmp_path) -> None:
    a = _stream(str(tmp_path / "a"), 1)
    b = lakestream.create(str(tmp_path / "b"), SCHEMA, global_batch_size=6)
    state = StreamDataset(a.uri, rank=0, world_size=1).state_dict()
    with pytest.raises(lakestream.LakestreamError, match="global batch size 12"):
        StreamDataset(b.uri, rank=0, world_size=1).load_state_dict(state)


def test_rank_zero_publishes_progress(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"), 3)
    ds = StreamDataset(s.uri, rank=0, world_size=1, max_steps=3, progress_interval_s=0.0001)
    ds.policy_version = 5
    assert [b["step"] for b in ds] == [0, 1, 2]
    # Published from a background thread: wait for it (however late it runs), not a guess.
    progress = _progress(s, at_least=3)
    assert (progress.step, progress.policy_version) == (3, 5)


def _progress(s: lakestream.Stream, at_least: int, within_s: float = 60.0) -> Any:
    """The group's published progress once it reaches step ``at_least``; fails loudly if
    it does not within ``within_s`` (a generous bound: only a publish that never comes
    takes that long)."""
    from lakestream.log.progress import read_progress

    deadline = time.monotonic() + within_s
    while True:
        progress = read_progress(s.store, "train")
        if progress is not None and progress.step >= at_least:
            return progress
        assert time.monotonic() < deadline, f"no progress at step {at_least}: {progress}"
        time.sleep(0.01)


def test_keep_last_runs_retention_from_the_checkpoint_hook(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"), 6)
    ds = StreamDataset(s.uri, rank=0, world_size=1, max_steps=4, keep_last=1)
    for _ in ds:
        pass
    ds.commit_checkpoint(checkpoint_id="c4")
    s.refresh()
    assert s.state.reclaimed_below == 4 * B
    with pytest.raises(StepNotAvailableError, match="reclaimed"):
        s.read_step(3)
    off = StreamDataset(s.uri, rank=0, world_size=1, start_step=4, max_steps=5)
    for _ in off:
        pass
    off.commit_checkpoint(checkpoint_id="c5")
    assert lakestream.open(s.uri).state.reclaimed_below == 4 * B  # off by default


def test_progress_after_a_burst_is_published_while_the_trainer_waits(tmp_path) -> None:
    """Regression: a throttled publish dropped the last progress update when the trainer
    consumed a burst of steps and then waited for more, so producers held by max_lag_steps
    and the trainer waited on each other forever (found by the demo)."""
    s = _stream(str(tmp_path / "s"), 3)
    ds = StreamDataset(s.uri, rank=0, world_size=1, max_steps=4, timeout=300,
                       progress_interval_s=0.3)
    steps: list[int] = []
    t = threading.Thread(target=lambda: steps.extend(b["step"] for b in ds), daemon=True)
    t.start()  # consumes steps 0-2 in a burst, then waits for step 3
    assert _progress(s, at_least=3).step == 3
    assert t.is_alive()  # published while the trainer waits: step 3 is not there yet
    s.append(rows(72, 6))
    s.append(rows(78, 6))
    t.join(timeout=120)
    assert not t.is_alive() and steps == [0, 1, 2, 3]


def test_a_column_named_step_is_not_overwritten(tmp_path) -> None:
    schema = pa.schema([("id", pa.int64()), ("step", pa.int64())])
    s = lakestream.create(str(tmp_path / "s"), schema, global_batch_size=2)
    s.append({"id": [0, 1], "step": [70, 71]})
    version = s.version
    with pytest.raises(ValueError, match="has a column 'step'.*pass step_key="):
        StreamDataset(s.uri, max_steps=1)
    (batch,) = StreamDataset(s.uri, max_steps=1, step_key="lakestream_step")
    assert batch["step"].tolist() == [70, 71] and batch["lakestream_step"] == 0
    assert s.refresh() == version + 1  # the group "train" registered; nothing else


def test_a_dataset_dropped_without_close_stops_its_publisher(tmp_path) -> None:
    """Nothing the publisher thread holds may keep the dataset alive, or the finalizer that
    stops the thread would wait for the process to exit."""
    import gc

    s = _stream(str(tmp_path / "s"), 2)
    ds = StreamDataset(s.uri, rank=0, world_size=1, progress_interval_s=0.01)
    ds.record_step(0)  # as a loader over workers does: no iteration here to close it
    publisher = ds.membership._publisher
    assert publisher is not None and publisher.running
    del ds
    gc.collect()
    assert not publisher.running


def test_a_reader_of_tokens_and_numbers_never_imports_pandas(tmp_path) -> None:
    """pyarrow's conversion of an array to NumPy imports pandas (installed here): 0.2-0.4 s
    and 53 MB that a tailing reader's first step waited for (``bench/delivered.py``: its
    first batch 0.4 s after the first write). The index's and the collation's arrays are
    viewed from their buffers instead. Read in a process of its own, written in this one
    (a producer converts lists)."""
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    with Producer(uri, "p") as p:
        for k in range(16):
            p.write(rows(4 * k, 4))
    code = f"""
import sys
from lakestream.loaders import StreamDataset
got = list(StreamDataset({uri!r}, group=None, max_steps=16))
print(len(got), "pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["16", "False"]
