"""torchdata's StatefulDataLoader over a StreamDataset: save after k steps with prefetching
workers, rebuild, load, and the remaining steps are those of an uninterrupted run, also with
another world size; save_checkpoint takes the loader and marks the step it resumes at."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import lakestream
from lakestream.loaders import StreamDataset, load_checkpoint, save_checkpoint
from tests.helpers import SCHEMA, ids, rows, step_ids, worker_options

B, STEPS, WORKERS = 8, 9, 2


def _stream(uri: str) -> lakestream.Stream:
    s = lakestream.create(uri, SCHEMA, global_batch_size=B, group_size=2)
    for k in range(STEPS * 2):
        s.append(rows(4 * k, 4))
    return s


def _loader(uri: str, rank: int, world: int) -> StatefulDataLoader:
    ds = StreamDataset(uri, rank=rank, world_size=world, max_steps=STEPS, prefetch=1,
                       read_threads=1)
    return StatefulDataLoader(ds, batch_size=None, prefetch_factor=2,
                              **worker_options(WORKERS))


def _expected(s: lakestream.Stream, rank: int, world: int, start: int) -> list[Any]:
    return [(k, ids(s.read_step(k, rank, world))) for k in range(start, STEPS)]


# k = 3 and 4: the next step is the second worker's, then the first's.
@pytest.mark.parametrize("before, after, k", [(1, 1, 3), (2, 2, 4), (2, 1, 3)])
def test_resume_equals_the_uninterrupted_run(tmp_path, before: int, after: int,
                                              k: int) -> None:
    s = _stream(str(tmp_path / "s"))
    states = []
    for rank in range(before):
        loader = _loader(s.uri, rank, before)
        it = iter(loader)
        assert step_ids(it, k) == _expected(s, rank, before, 0)[:k]
        states.append(loader.state_dict())
        # The same loader, uninterrupted: the rest of the run.
        assert step_ids(it) == _expected(s, rank, before, k)
    for rank in range(after):
        resumed = _loader(s.uri, rank, after)
        # Every rank of a run saved the same steps; a new world takes any rank's state.
        resumed.load_state_dict(states[rank % before])
        assert step_ids(resumed) == _expected(s, rank, after, k)


def test_a_state_taken_before_the_workers_yield_resumes_at_the_start(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"))
    loader = _loader(s.uri, 0, 1)
    it = iter(loader)
    state = loader.state_dict()
    del it
    resumed = _loader(s.uri, 0, 1)
    resumed.load_state_dict(state)
    assert step_ids(resumed) == _expected(s, 0, 1, 0)


def test_save_checkpoint_takes_the_loader_and_marks_where_it_resumes(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"))
    loader = _loader(s.uri, 0, 1)
    it = iter(loader)
    step_ids(it, 5)  # the workers have prefetched beyond step 4
    ckpt = str(tmp_path / "ckpt")
    save_checkpoint({"model": torch.arange(4.0)}, ckpt, loader)
    assert [(m.step, m.checkpoint_id) for m in lakestream.open(s.uri).checkpoints("train")] \
        == [(5, ckpt)]
    del it
    resumed, state = _loader(s.uri, 0, 1), {"model": torch.zeros(4)}
    load_checkpoint(state, ckpt, resumed)
    assert state["model"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert step_ids(resumed) == _expected(s, 0, 1, 5)
