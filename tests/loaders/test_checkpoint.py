"""Training checkpoints beside the stream: DCP on S3 with the stream's options, trainers
killed and resumed with another world size, no marker for a checkpoint that is not whole, and
a checkpoint that resumes only the streams that saved it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torchdata.stateful_dataloader import StatefulDataLoader

import lakestream
from lakestream.errors import IncompleteCheckpointError
from lakestream.loaders import Source, StreamDataset, load_checkpoint, save_checkpoint
from lakestream.loaders import checkpoint as checkpoint_module
from lakestream.loaders.checkpoint import StreamMismatchError
from lakestream.loaders.resume import dataset_states
from lakestream.store import open_filesystem
from tests.helpers import SCHEMA, ids, rows, worker_options

ROOT = Path(__file__).resolve().parents[2]
B, STEPS = 8, 8


def _stream(uri: str, options: dict[str, str] | None) -> lakestream.Stream:
    s = lakestream.create(uri, SCHEMA, global_batch_size=B, group_size=2,
                          storage_options=options)
    for k in range(STEPS * 2):
        s.append(rows(4 * k, 4))
    return s


def _start(tmp_path: Path, name: str, env: dict[str, str] | None = None,
           **spec: Any) -> subprocess.Popen[str]:
    spec.setdefault("out", str(tmp_path / f"{name}.jsonl"))
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LAKESTREAM_FAILPOINT")}
    return subprocess.Popen([sys.executable, "-m", "tests.loaders.ckpt_worker",
                             json.dumps(spec)], cwd=ROOT, env={**base, **(env or {})},
                            stderr=subprocess.PIPE, text=True)


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() \
        else []


def _steps(events: list[dict[str, Any]]) -> dict[int, list[int]]:
    return {e["step"]: e["ids"] for e in events if "step" in e}


def _markers(uri: str, options: dict[str, str] | None) -> list[tuple[int, str]]:
    return [(m.step, m.checkpoint_id)
            for m in lakestream.open(uri, storage_options=options).checkpoints("train")]


def test_a_checkpoint_on_s3_loads_what_was_saved(s3_options, tmp_path) -> None:
    """With the stream's own options (none given). Several tensors, so that torch.save
    writes from buffers it reuses: a writer that kept references to them (obstore's does)
    would store garbage of the right size."""
    from tests.s3server import BUCKET

    uri = f"s3://{BUCKET}/ckpt-roundtrip-{time.time_ns()}"
    s = _stream(f"{uri}/stream", s3_options)
    ds = StreamDataset(s.uri, rank=0, world_size=1, max_steps=2, storage_options=s3_options)
    assert [b["step"] for b in ds] == [0, 1]
    saved = {"w": torch.randn(64, 33), "b": torch.arange(1000.0), "n": torch.tensor(7)}
    save_checkpoint({"model": dict(saved)}, "a", ds, root=f"{uri}/ckpt")
    assert _markers(s.uri, s3_options) == [(2, f"{uri}/ckpt/a")]
    state = {"model": {k: torch.zeros_like(v) for k, v in saved.items()}}
    fresh = StreamDataset(s.uri, rank=0, world_size=1, storage_options=s3_options)
    marker = lakestream.open(s.uri, storage_options=s3_options).checkpoints("train")[-1]
    load_checkpoint(state, marker, fresh, root=f"{uri}/ckpt/")
    assert all(torch.equal(state["model"][k], v) for k, v in saved.items())
    assert fresh.start_step == 2


@pytest.mark.parametrize("where", ["local", "s3"])
def test_keep_last_deletes_the_checkpoints_it_no_longer_keeps(where, request, tmp_path) -> None:
    """Only the group's checkpoints past keep_last, under root, that are DCP checkpoints: not
    one another group's marker names, nor a folder without a ``.metadata``."""
    options = None
    base = str(tmp_path)
    if where == "s3":
        from tests.s3server import BUCKET

        options = request.getfixturevalue("s3_options")
        base = f"s3://{BUCKET}/ckpt-prune-{time.time_ns()}"
    s = _stream(f"{base}/stream", options)
    root = f"{base}/ckpt"
    fs = open_filesystem(root, options) if options else None

    def exists(name: str) -> bool:
        path = f"{root}/{name}/.metadata"
        return fs.exists(path) if fs else os.path.exists(path)

    ds = StreamDataset(s.uri, rank=0, world_size=1, max_steps=6, keep_last=2,
                       storage_options=options)
    state = {"w": torch.arange(4.0)}
    for batch in ds:
        step = int(batch["step"])
        save_checkpoint(state, f"c{step + 1}", ds, root=root)
        if step == 0:  # another group's marker names c1: kept, whatever train keeps
            s.mark_checkpoint("eval", 1, _markers(s.uri, options)[0][1])
        if step == 1 and fs is None:  # a folder that is not a checkpoint (any more)
            os.unlink(f"{root}/c2/.metadata")
    assert [exists(f"c{k}") for k in range(1, 7)] == [True, False, False, False, True, True]
    assert fs is not None or os.listdir(f"{root}/c2")  # not a checkpoint: not deleted
    assert [c.rsplit("/", 1)[1] for _, c in _markers(s.uri, options)] == \
        [f"c{k}" for k in range(1, 7)]  # the markers stay, naming what they did
    fresh = StreamDataset(s.uri, rank=0, world_size=1, storage_options=options)
    with pytest.raises(IncompleteCheckpointError, match="c3 has no .metadata"):
        load_checkpoint({"w": torch.zeros(4)}, lakestream.open(
            s.uri, storage_options=options).checkpoints("train")[2], fresh, root=root)
    load_checkpoint(state, lakestream.open(
        s.uri, storage_options=options).checkpoints("train")[-1], fresh, root=root)
    assert fresh.start_step == 6


def test_keep_last_never_deletes_the_root_a_kept_checkpoint_or_past_a_failure(
        tmp_path, monkeypatch, caplog) -> None:
    """Markers are data: one naming the root itself, a folder holding a kept checkpoint, or
    a checkpoint this trainer did not save (a producer may commit a marker naming one a
    user saved by hand) is skipped; a delete that fails is logged and the save goes on
    (rank 0 alone prunes, and the other ranks must not wait for it)."""
    s = _stream(str(tmp_path / "stream"), None)
    root = tmp_path / "ckpt"
    ds = StreamDataset(s.uri, rank=0, world_size=1, max_steps=6, keep_last=1)
    state = {"w": torch.arange(4.0)}
    steps = iter(ds)
    next(steps)
    dcp.save(state, checkpoint_id=str(root / "by-hand"))
    s.mark_checkpoint("train", 1, str(root / "by-hand"))  # a forged marker, first to go
    save_checkpoint(state, "outer", ds, root=str(root))  # will hold the kept one below
    next(steps)
    dcp.save(state, checkpoint_id=str(root))  # the root itself, named by a marker below
    s.mark_checkpoint("train", 2, str(root))
    next(steps)
    save_checkpoint(state, "outer/inner", ds, root=str(root))
    assert (root / ".metadata").exists() and (root / "outer" / ".metadata").exists()
    next(steps)

    def fail(uri: str, fs: Any) -> None:
        raise OSError("permission denied")

    monkeypatch.setattr(checkpoint_module, "_delete_checkpoint", fail)
    assert save_checkpoint(state, "c4", ds, root=str(root)) is not None
    assert "could not delete older checkpoints" in caplog.text
    assert (root / "outer" / "inner" / ".metadata").exists()
    assert (root / "by-hand" / ".metadata").exists()


def test_two_gloo_ranks_checkpoint_to_s3_are_killed_and_resume_with_one(
        s3_options, tmp_path) -> None:
    from tests.s3server import BUCKET

    root = f"s3://{BUCKET}/ckpt-ranks-{time.time_ns()}"
    s = _stream(f"{root}/stream", s3_options)
    common = {"uri": s.uri, "options": s3_options, "ckpt": f"{root}/ckpt", "steps": 6,
              "save_after": [2, 4], "hang": True, "world": 2, "init": str(tmp_path / "init")}
    procs = [_start(tmp_path, f"rank{r}", rank=r, **common) for r in range(2)]
    outs = [tmp_path / f"rank{r}.jsonl" for r in range(2)]
    try:
        deadline = time.monotonic() + 240
        while not all(any(e.get("done") for e in _events(o)) for o in outs):
            dead = [p for p in procs if p.poll() is not None]
            assert not dead, [p.communicate()[1] for p in dead]
            assert time.monotonic() < deadline, "the trainer did not reach step 6"
            time.sleep(0.2)
    finally:
        for p in procs:  # killed, not stopped: nothing after the last save is flushed
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            p.communicate(timeout=60)
    assert _markers(s.uri, s3_options) == [(2, f"{root}/ckpt/step-2"), (4, f"{root}/ckpt/step-4")]
    before = [_steps(_events(o)) for o in outs]
    resumed = _start(tmp_path, "resumed", uri=s.uri, options=s3_options, rank=0, world=1,
                     steps=STEPS, resume=True, ckpt=f"{root}/ckpt")
    _, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err
    events = _events(tmp_path / "resumed.jsonl")
    assert events[0] == {"loaded": f"{root}/ckpt/step-4", "model": [0.0, 4.0, 8.0],
                         "next_step": 4}
    after = _steps(events)
    assert sorted(after) == list(range(4, STEPS))
    # The steps read after the last checkpoint are read again, the same samples.
    for step in (4, 5):
        assert after[step] == before[0][step] + before[1][step]
    whole = [before[0][k] + before[1][k] for k in range(4)] + [after[k] for k in range(4, 8)]
    assert whole == [ids(s.read_step(k)) for k in range(STEPS)]
    assert sum(whole, []) == list(range(B * STEPS))


# On S3 alone: what it checks does not depend on the store, and S3 is the slower path to
# get right (the local store runs it in the crash tests); make test stays under 10 minutes.
@pytest.mark.parametrize("backend", ["s3"], indirect=True)
def test_a_save_killed_before_its_metadata_commits_no_marker(backend, tmp_path) -> None:
    s = _stream(backend.uri("stream"), backend.options)
    ckpt = backend.uri("ckpt")
    killed = _start(tmp_path, "killed", env={"LAKESTREAM_FAILPOINT":
                                             "before_checkpoint_metadata@2"},
                    uri=s.uri, options=backend.options, rank=0, world=1, steps=STEPS,
                    ckpt=ckpt, save_after=[2, 3])
    _, err = killed.communicate(timeout=240)
    assert killed.returncode == -signal.SIGKILL, err
    assert [e for e in _events(tmp_path / "killed.jsonl") if "saved" in e] == \
        [{"saved": f"{ckpt}/step-2"}]
    assert _markers(s.uri, backend.options) == [(2, f"{ckpt}/step-2")]
    # Midway: the shard of the second save is there, its .metadata is not.
    if backend.options is None:
        assert sorted(os.listdir(f"{ckpt}/step-3")) == ["__0_0.distcp"]
    else:
        fs = open_filesystem(ckpt, backend.options)
        assert [p.rsplit("/", 1)[1] for p in fs.ls(f"{ckpt}/step-3")] == ["__0_0.distcp"]
    fresh = StreamDataset(s.uri, rank=0, world_size=1, storage_options=backend.options)
    with pytest.raises(IncompleteCheckpointError, match="step-3 has no .metadata"):
        load_checkpoint({"model": torch.zeros(1000)}, f"{ckpt}/step-3", fresh)
    assert fresh.start_step == 0  # nothing was loaded
    resumed = _start(tmp_path, "resumed", uri=s.uri, options=backend.options, rank=0,
                     world=1, steps=STEPS, resume=True, ckpt=ckpt)
    _, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err
    events = _events(tmp_path / "resumed.jsonl")
    assert events[0]["loaded"] == f"{ckpt}/step-2" and events[0]["next_step"] == 2
    assert _steps(events) == {k: ids(s.read_step(k)) for k in range(2, STEPS)}


@pytest.mark.parametrize("damage, message", [
    ("drop", r"__0_0.distcp is missing"),
    ("truncate", r"__0_0.distcp is \d+ bytes, \d+ needed"),
    ("garble", r".metadata cannot be read"),
])
def test_a_checkpoint_its_writer_left_broken_is_refused_and_not_marked(
        tmp_path, monkeypatch, damage: str, message: str) -> None:
    """A writer that returns as if all were saved while a file is missing or short (the
    silent drops remote DCP writers have had) gets no marker, on any rank."""
    s = _stream(str(tmp_path / "s"), None)
    ckpt = tmp_path / "ckpt"
    finish = checkpoint_module._Writer.finish

    def damaging(self: Any, *args: Any, **kwargs: Any) -> None:
        finish(self, *args, **kwargs)
        shard, meta = ckpt / "__0_0.distcp", ckpt / ".metadata"
        if damage == "drop":
            shard.unlink()
        elif damage == "truncate":
            shard.write_bytes(shard.read_bytes()[:-10])
        else:
            meta.write_bytes(b"\x80\x04not a pickle")

    monkeypatch.setattr(checkpoint_module._Writer, "finish", damaging)
    ds = StreamDataset(s.uri, rank=0, world_size=1, max_steps=1)
    assert [b["step"] for b in ds] == [0]
    with pytest.raises(IncompleteCheckpointError, match=message):
        save_checkpoint({"model": torch.arange(1000.0)}, str(ckpt), ds)
    assert _markers(s.uri, None) == []
    with pytest.raises(IncompleteCheckpointError, match=message):
        load_checkpoint({"model": torch.zeros(1000)}, str(ckpt), ds)


def test_a_checkpoint_saved_by_an_earlier_version_still_loads(tmp_path) -> None:
    """Its dataset state has no "mix" key; DCP requires every key of the template, so the
    template is cut to what the checkpoint holds."""
    s = _stream(str(tmp_path / "s"), None)
    old = {"version": 1, "next_step": 3, "group": "train", "global_batch_size": B}
    dcp.save({"model": torch.arange(3.0), "data": old}, checkpoint_id=str(tmp_path / "old"))
    fresh, state = StreamDataset(s.uri, rank=0, world_size=1), {"model": torch.zeros(3)}
    load_checkpoint(state, str(tmp_path / "old"), fresh)
    assert fresh.start_step == 3 and state["model"].tolist() == [0.0, 1.0, 2.0]


def test_a_checkpoint_of_another_stream_with_the_same_batch_size_is_refused(tmp_path) -> None:
    """Both streams have B samples per step: only their creation ids tell them apart."""
    a, b = _stream(str(tmp_path / "a"), None), _stream(str(tmp_path / "b"), None)
    ds = StreamDataset(a.uri, rank=0, world_size=1, max_steps=2)
    assert [batch["step"] for batch in ds] == [0, 1]
    save_checkpoint({"model": torch.arange(4.0)}, "step-2", ds, root=str(tmp_path / "ckpt"))
    fresh, state = StreamDataset(b.uri, rank=0, world_size=1), {"model": torch.zeros(4)}
    with pytest.raises(StreamMismatchError) as e:
        load_checkpoint(state, str(tmp_path / "ckpt" / "step-2"), fresh)
    assert f"{a.uri} (id {a.meta.table_id})" in str(e.value)
    assert f"{b.uri} is another stream (id {b.meta.table_id})" in str(e.value)
    assert fresh.start_step == 0
    # A stream created anew at the same URI is another stream too.
    shutil.rmtree(tmp_path / "a")
    again = _stream(str(tmp_path / "a"), None)
    with pytest.raises(StreamMismatchError, match=f"another stream \\(id {again.meta.table_id}"):
        load_checkpoint(state, str(tmp_path / "ckpt" / "step-2"),
                        StreamDataset(again.uri, rank=0, world_size=1))


def test_each_source_of_a_mix_is_checked(tmp_path) -> None:
    a, b = _stream(str(tmp_path / "a"), None), _stream(str(tmp_path / "b"), None)

    def mix() -> StreamDataset:
        return StreamDataset([Source(a.uri, take=4), Source(b.uri, take=4)], rank=0,
                             world_size=1, max_steps=2)

    ds = mix()
    assert [batch["step"] for batch in ds] == [0, 1]
    state = ds.state_dict()
    shutil.rmtree(tmp_path / "b")
    b = _stream(str(tmp_path / "b"), None)
    with pytest.raises(StreamMismatchError, match=f"{b.uri} is another stream"):
        mix().load_state_dict(state)


def test_a_state_saved_before_identities_were_kept_still_loads(tmp_path) -> None:
    """A loader's state (torchdata's, per worker) saved without "streams": the key is
    dropped from the template wherever a dataset state sits inside it."""
    s = _stream(str(tmp_path / "s"), None)

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(StreamDataset(s.uri, rank=0, world_size=1, max_steps=6),
                                  batch_size=None, **worker_options(2))

    before = loader()
    it = iter(before)
    assert [int(next(it)["step"]) for _ in range(3)] == [0, 1, 2]
    state = before.state_dict()
    found = dataset_states(state)
    assert found and all("streams" in d for d in found)
    for d in found:  # as an earlier version saved it
        del d["streams"]
    del it
    dcp.save({"model": torch.arange(4.0), "data": state}, checkpoint_id=str(tmp_path / "old"))
    resumed, model = loader(), {"model": torch.zeros(4)}
    load_checkpoint(model, str(tmp_path / "old"), resumed)
    assert model["model"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert [int(batch["step"]) for batch in resumed] == [3, 4, 5]
