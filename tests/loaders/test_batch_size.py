"""A batch size chosen at read time: the stream's samples in log order cut into batches of
that many, the same on every rank, resumed exactly at every world size (also with another
batch size), with markers, retention and checkpoints in the stream's own steps."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import lakestream
from lakestream.loaders import Source, StreamDataset, load_checkpoint, save_checkpoint
from tests.helpers import SCHEMA, read_ranks, rows, worker_options

ROOT = Path(__file__).resolve().parents[2]
B, G, SAMPLES = 24, 2, 24 * 8  # the stream's own batch and group size; 8 steps of it


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    u = str(tmp_path_factory.mktemp("batch") / "s")
    s = lakestream.create(u, SCHEMA, global_batch_size=B, group_size=G)
    for k in range(0, SAMPLES, 6):
        s.append(rows(k, 6))  # fragments that straddle the steps of every batch size
    s.seal()
    return u


def _read(uri: str, batch: int | None, world: int, state: dict[str, Any] | None = None,
          stop: int | None = None, workers: int = 0) -> tuple[list[list[int]], dict[str, Any]]:
    return read_ranks(uri, world, state=state, stop=stop, workers=workers, group=None,
                      batch_size=batch, timeout=10)


@pytest.mark.parametrize("batch", [8, 16, 40, B])
def test_steps_are_the_log_in_batches_on_every_world_size(uri, batch) -> None:
    whole, _ = _read(uri, batch, 1)
    assert whole == [list(range(k, k + batch)) for k in range(0, SAMPLES - batch + 1, batch)]
    if batch == B:  # the stream's own size reads as the stream's own steps
        assert whole == _read(uri, None, 1)[0]
    for world in (2, 4):
        assert _read(uri, batch, world)[0] == whole


@pytest.mark.parametrize("batch", [16, 40])
def test_every_elastic_resume_equals_the_uninterrupted_run(uri, batch) -> None:
    whole, _ = _read(uri, batch, 1)
    steps = len(whole)
    for before, after, point, workers in [(1, 4, 0, 0), (2, 1, 1, 0), (4, 2, steps // 2, 0),
                                          (2, 4, steps - 1, 0), (1, 2, steps, 0),
                                          (4, 1, 2, 2 if batch == 16 else 0)]:
        head, state = _read(uri, batch, before, None, point, workers)
        tail, _ = _read(uri, batch, after, state, None, workers)
        assert head + tail == whole, (before, after, point, workers)


def test_a_run_resumes_with_another_batch_size_at_the_next_sample(uri) -> None:
    head, state = _read(uri, 16, 2, None, 3)
    tail, _ = _read(uri, 12, 2, state)
    assert sum(head + tail, []) == list(range(SAMPLES))
    assert [len(b) for b in tail] == [12] * ((SAMPLES - 48) // 12)


def test_markers_retention_and_checkpoints_count_the_streams_own_steps(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=8)
    for k in range(0, 96, 8):
        s.append(rows(k, 8))
    ds = StreamDataset(s.uri, group="train", rank=0, world_size=1, batch_size=12,
                       max_steps=5, timeout=10)
    assert [b["id"].tolist()[0] for b in ds] == [0, 12, 24, 36, 48]
    save_checkpoint({"w": torch.ones(1)}, "c5", ds, root=str(tmp_path / "ckpt"))
    s.refresh()
    marker = s.checkpoints("train")[-1]
    assert marker.step == 60 // 8  # the next sample, offset 60, lies in the stream's step 7
    s.retain(keep_last=1)
    assert s.state.first_retained_step == 7
    again = StreamDataset(s.uri, group="train", rank=0, world_size=1, batch_size=12,
                          timeout=10, max_steps=7)
    load_checkpoint({"w": torch.zeros(1)}, marker, again, root=str(tmp_path / "ckpt"))
    assert [b["id"].tolist() for b in again] == [list(range(60, 72)), list(range(72, 84))]


def test_two_gloo_ranks_agree_on_every_step(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=8, group_size=2)
    for k in range(0, 80, 4):
        s.append(rows(k, 4))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.loaders.rank_worker", s.uri, str(r), "2",
         str(tmp_path / "init"), str(tmp_path / f"rank{r}.json"), "6", "0", "{}", "12"],
        cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True) for r in range(2)]
    errors = [p.communicate(timeout=180)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for step in range(6):
        (s0, a), (s1, b) = got[0][step], got[1][step]
        assert s0 == s1 == step and a + b == list(range(12 * step, 12 * step + 12))


def test_batch_sizes_that_cannot_be_read_are_refused(uri) -> None:
    for bad, said in ((5, "batch_size=5 splits the groups"), (0, "positive int"),
                      (True, "positive int"), (2.0, "positive int")):
        with pytest.raises(ValueError, match=said):
            StreamDataset(uri, group=None, batch_size=bad)
    with pytest.raises(ValueError, match="world_size 4 splits a group"):
        StreamDataset(uri, group=None, batch_size=12, rank=0, world_size=4)
    with pytest.raises(ValueError, match="batch_size= reads one stream"):
        StreamDataset([Source(uri, take=8)], group=None, batch_size=8)
    with pytest.raises(ValueError, match="do not combine with mixing, batch_size"):
        StreamDataset(uri, group=None, batch_size=8, max_staleness=2)


def _loader_shapes(uri: str, **options: Any) -> list[tuple[int, ...]]:
    ds = StreamDataset(uri, group=None, rank=0, world_size=1, batch_size=8, max_steps=3,
                       timeout=10)
    return [tuple(b["id"].shape) for b in torch.utils.data.DataLoader(ds, **options)]


def test_a_dataloaders_own_batching_is_refused_with_the_fix(uri) -> None:
    """It would stack whole batches into a new leading dimension ((1, 8) for its default
    batch_size=1): refused, in process and in workers; batch_size=None reads as meant."""
    for options in ({}, {"batch_size": 32}, worker_options(1)):
        with pytest.raises(ValueError, match=r"Pass DataLoader\(ds, batch_size=None\), or "
                           r"StreamLoader\(ds\); to choose the batch size, pass "
                           r"StreamDataset\(\.\.\., batch_size=n\)"):
            _loader_shapes(uri, **options)
    assert _loader_shapes(uri, batch_size=None) == [(8,)] * 3
    batch = next(iter(StreamDataset(uri, group=None, rank=0, world_size=1, timeout=10)))
    assert copy.copy(batch)["id"].tolist() == batch["id"].tolist()  # a user's copy is plain
