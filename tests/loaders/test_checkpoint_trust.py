"""Checkpoint locations read from the log are data: a producer identity that commits a marker
(it may write the log, snapshots and its own ``data/<id>/``) cannot make a resuming trainer
run code, connect anywhere, or read with the stream's credentials outside the trainer's
checkpoint root; legitimate checkpoints still save and load."""

from __future__ import annotations

import os
import pickle
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

import lakestream
from lakestream.errors import IncompleteCheckpointError
from lakestream.loaders import StreamDataset, load_checkpoint, save_checkpoint
from lakestream.loaders import checkpoint as checkpoint_module
from lakestream.loaders.checkpoint import CheckpointLocationError
from tests.helpers import SCHEMA, rows

B = 8


def _stream(uri: str, options: dict[str, str] | None = None) -> lakestream.Stream:
    s = lakestream.create(uri, SCHEMA, global_batch_size=B, group_size=2,
                          storage_options=options)
    for k in range(8):
        s.append(rows(4 * k, 4))
    return s


class _Payload:
    """Unpickled, it creates the folder ``path``: proof that code named by a file ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return os.mkdir, (str(self.path),)


def _trained(uri: str, root: str, options: dict[str, str] | None = None) -> StreamDataset:
    """A trainer's dataset that read 2 steps and saved its checkpoint (and marker) under
    ``root``."""
    ds = StreamDataset(uri, rank=0, world_size=1, max_steps=2, storage_options=options)
    assert [b["step"] for b in ds] == [0, 1]
    save_checkpoint({"model": torch.arange(4.0)}, "step-2", ds, root=root)
    return ds


def _resume(how: str, marker: Any, ds: StreamDataset, root: str,
            state: dict[str, Any]) -> None:
    """``marker``: the marker itself with the root, as the demo resumes; ``location``: its
    location as a string, without a root (as trainers resumed before roots existed)."""
    if how == "marker":
        load_checkpoint(state, marker, ds, root=root)
    else:
        load_checkpoint(state, marker.checkpoint_id, ds)


def _forged(uri: str, location: str, options: dict[str, str] | None = None) -> Any:
    """What a producer identity can do: commit a marker naming ``location``; returns the
    group's last marker, as a restarting trainer reads it."""
    lakestream.open(uri, storage_options=options).mark_checkpoint("train", 1, location)
    marker = lakestream.open(uri, storage_options=options).checkpoints("train")[-1]
    assert marker.checkpoint_id == location
    return marker


@pytest.mark.parametrize("how", ["marker", "location"])
def test_a_pickle_a_producer_wrote_in_its_folder_runs_nothing(tmp_path, how: str) -> None:
    s = _stream(str(tmp_path / "s"))
    root = str(tmp_path / "ckpt")
    _trained(s.uri, root)
    folder = tmp_path / "s" / "data" / "rollout-0" / "ckpt-9"
    folder.mkdir(parents=True)
    pwned = tmp_path / "pwned"
    (folder / ".metadata").write_bytes(pickle.dumps(_Payload(pwned)))
    marker = _forged(s.uri, str(folder))
    fresh, state = StreamDataset(s.uri, rank=0, world_size=1), {"model": torch.zeros(4)}
    with pytest.raises(CheckpointLocationError, match="inside the stream") as e:
        _resume(how, marker, fresh, root, state)
    assert not pwned.exists()
    assert fresh.start_step == 0 and state["model"].tolist() == [0.0] * 4
    if how == "marker":
        assert f"group 'train' at step 1 (log version {marker.version}), checkpoint_id " \
               f"'{folder}'" in str(e.value)


@pytest.mark.parametrize("how", ["marker", "location"])
def test_a_marker_on_another_scheme_connects_nowhere(tmp_path, how: str) -> None:
    s = _stream(str(tmp_path / "s"))
    root = str(tmp_path / "ckpt")
    _trained(s.uri, root)
    accepted: list[Any] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.05)
        done = threading.Event()

        def accept() -> None:  # records each connection and drops it (the client fails fast)
            while not done.is_set():
                try:
                    conn, peer = listener.accept()
                except TimeoutError:
                    continue
                accepted.append(peer)
                conn.close()

        thread = threading.Thread(target=accept)
        thread.start()
        try:
            marker = _forged(s.uri, f"ftp://127.0.0.1:{listener.getsockname()[1]}/ckpt")
            with pytest.raises(CheckpointLocationError, match="scheme ftp://"):
                _resume(how, marker, StreamDataset(s.uri, rank=0, world_size=1), root,
                        {"model": torch.zeros(4)})
        finally:
            done.set()
            thread.join()
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing waits in the backlog either
            listener.accept()
    assert accepted == []


def test_an_s3_marker_outside_the_root_is_not_read_with_the_streams_credentials(
        s3_options, monkeypatch) -> None:
    """Another trainer's checkpoint in the same bucket (one the stream's credentials can
    read) is named by a forged marker: the trainer opens nothing."""
    from tests.s3server import BUCKET

    run = f"s3://{BUCKET}/trust-{uuid.uuid4().hex[:12]}"
    s = _stream(f"{run}/stream", s3_options)
    root = f"{run}/ckpt"
    _trained(s.uri, root, s3_options)
    other = _stream(f"{run}/other-stream", s3_options)
    theirs = StreamDataset(other.uri, rank=0, world_size=1, max_steps=3,
                           storage_options=s3_options)
    assert [b["step"] for b in theirs] == [0, 1, 2]
    save_checkpoint({"model": torch.full((4,), 9.0)}, "secret", theirs,
                    root=f"{run}/other-team")
    opened: list[str] = []
    real = checkpoint_module.open_filesystem

    def spy(uri: str, options: Any = None) -> Any:
        opened.append(uri)
        return real(uri, options)

    monkeypatch.setattr(checkpoint_module, "open_filesystem", spy)
    marker = _forged(s.uri, f"{run}/other-team/secret", s3_options)
    fresh = StreamDataset(s.uri, rank=0, world_size=1, storage_options=s3_options)
    state = {"model": torch.zeros(4)}
    for checkpoint in (marker, marker.checkpoint_id):
        with pytest.raises(CheckpointLocationError, match="outside the checkpoint root"):
            load_checkpoint(state, checkpoint, fresh, root=root)
    assert opened == []
    assert state["model"].tolist() == [0.0] * 4 and fresh.start_step == 0
    # The trainer's own checkpoint, under the root, loads with the stream's options.
    load_checkpoint(state, f"{root}/step-2", fresh, root=root)
    assert state["model"].tolist() == [0.0, 1.0, 2.0, 3.0] and fresh.start_step == 2
    assert opened == [f"{root}/step-2"]


def test_a_metadata_naming_other_classes_runs_nothing(tmp_path) -> None:
    """Wherever it lies (a shared disk, a root someone else could write): ``.metadata`` is
    read admitting torch's checkpoint metadata classes only."""
    s = _stream(str(tmp_path / "s"))
    ckpt = tmp_path / "ckpt" / "step-2"
    _trained(s.uri, str(tmp_path / "ckpt"))
    pwned = tmp_path / "pwned"
    (ckpt / ".metadata").write_bytes(pickle.dumps(_Payload(pwned)))
    fresh = StreamDataset(s.uri, rank=0, world_size=1)
    with pytest.raises(IncompleteCheckpointError, match=r"names posix\.mkdir.*refused"):
        load_checkpoint({"model": torch.zeros(4)}, str(ckpt), fresh)
    assert not pwned.exists() and fresh.start_step == 0


def test_a_value_naming_other_classes_runs_nothing(tmp_path) -> None:
    """DCP loads a state's values other than tensors with ``torch.load(weights_only=False)``;
    here they load with ``weights_only=True``."""
    s = _stream(str(tmp_path / "s"))
    pwned = tmp_path / "pwned"
    ds = StreamDataset(s.uri, rank=0, world_size=1)
    dcp.save({"model": torch.arange(4.0), "extra": _Payload(pwned), "data": ds},
             checkpoint_id=str(tmp_path / "ckpt"))
    assert not pwned.exists()
    fresh, state = StreamDataset(s.uri, rank=0, world_size=1), {"model": torch.zeros(4),
                                                                "extra": "x"}
    with pytest.raises(IncompleteCheckpointError, match=r"value of extra was refused.*posix"):
        load_checkpoint(state, str(tmp_path / "ckpt"), fresh)
    assert not pwned.exists()


def test_a_metadata_naming_a_file_outside_its_folder_is_refused(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"))
    ckpt = tmp_path / "ckpt" / "step-2"
    _trained(s.uri, str(tmp_path / "ckpt"))
    meta = checkpoint_module._Reader(str(ckpt), None).read_metadata()
    for info in meta.storage_data.values():
        info.relative_path = "../../s/_delta_log/00000000000000000000.json"
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    with pytest.raises(IncompleteCheckpointError, match="not a plain file name"):
        load_checkpoint({"model": torch.zeros(4)}, str(ckpt),
                        StreamDataset(s.uri, rank=0, world_size=1))


def test_a_marker_needs_the_root_and_a_location(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"))
    root = str(tmp_path / "ckpt")
    ds = _trained(s.uri, root)
    marker = lakestream.open(s.uri).checkpoints("train")[-1]
    with pytest.raises(ValueError, match="pass root="):
        load_checkpoint({"model": torch.zeros(4)}, marker, ds)
    s.mark_checkpoint("train", 1)
    bare = lakestream.open(s.uri).checkpoints("train")[-1]
    with pytest.raises(CheckpointLocationError, match=r"step 1 \(log version \d+\) names no"):
        load_checkpoint({"model": torch.zeros(4)}, bare, ds, root=root)


@pytest.mark.parametrize("where, message", [
    ("s/data/rollout-0/ckpt", "inside the stream"),
    ("elsewhere/ckpt", "outside the checkpoint root"),
    ("ckpt/../elsewhere", "outside the checkpoint root"),
    ("ftp://127.0.0.1:1/ckpt", "scheme ftp://"),
])
def test_save_refuses_a_location_it_would_not_load(tmp_path, where: str, message: str) -> None:
    s = _stream(str(tmp_path / "s"))
    ds = StreamDataset(s.uri, rank=0, world_size=1, max_steps=1)
    assert [b["step"] for b in ds] == [0]
    location = where if "://" in where else str(tmp_path / where)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(CheckpointLocationError, match=message):
        save_checkpoint({"model": torch.zeros(4)}, location, ds, root=str(tmp_path / "ckpt"))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert lakestream.open(s.uri).checkpoints("train") == []


def test_a_checkpoint_under_the_root_saves_and_loads_its_state_whole(tmp_path) -> None:
    """Model and optimizer state of several dtypes and memory formats, and the loader's:
    what the metadata allowlist and ``weights_only`` must let through."""
    s = _stream(str(tmp_path / "s"))
    model = torch.nn.Linear(4, 3)
    optim = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optim.step()
    extra = {"cl": torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last),
             "bf16": torch.ones(3, dtype=torch.bfloat16), "flag": torch.tensor([True]),
             "plain": {"lr": 0.5, "name": "run-1", "ids": [1, 2], "none": None}}
    ds = StreamDataset(s.uri, rank=0, world_size=1, max_steps=3)
    assert [b["step"] for b in ds] == [0, 1, 2]
    root = tmp_path / "ckpt"
    root.mkdir()
    os.symlink(root, tmp_path / "ckpt-link")  # a root reached through a symlink
    save_checkpoint({"model": model.state_dict(), "optim": optim.state_dict(), **extra},
                    "step-3", ds, root=str(tmp_path / "ckpt-link"))
    marker = lakestream.open(s.uri).checkpoints("train")[-1]
    assert (marker.step, marker.checkpoint_id) == (3, str(root / "step-3"))  # resolved
    fresh_model = torch.nn.Linear(4, 3)
    fresh_optim = torch.optim.Adam(fresh_model.parameters())
    fresh_model(torch.randn(2, 4)).sum().backward()
    fresh_optim.step()
    state = {"model": fresh_model.state_dict(), "optim": fresh_optim.state_dict(),
             "cl": torch.zeros(2, 3, 4, 4).to(memory_format=torch.channels_last),
             "bf16": torch.zeros(3, dtype=torch.bfloat16), "flag": torch.tensor([False]),
             "plain": {"lr": 0.0, "name": "", "ids": [], "none": 1}}
    fresh = StreamDataset(s.uri, rank=0, world_size=1)
    load_checkpoint(state, marker, fresh, root=str(root))
    assert fresh.start_step == 3
    for k, v in model.state_dict().items():
        assert torch.equal(state["model"][k], v)
    assert torch.equal(state["optim"]["state"][0]["exp_avg"],
                       optim.state_dict()["state"][0]["exp_avg"])
    assert state["optim"]["param_groups"] == optim.state_dict()["param_groups"]
    assert all(torch.equal(state[k], extra[k]) for k in ("cl", "bf16", "flag"))
    assert state["plain"] == extra["plain"]


def test_a_symlink_under_the_root_leading_out_of_it_is_refused(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"))
    elsewhere = tmp_path / "elsewhere"
    _trained(s.uri, str(elsewhere))  # a real checkpoint, outside the root
    root = tmp_path / "ckpt"
    root.mkdir()
    os.symlink(elsewhere / "step-2", root / "step-2")
    fresh = StreamDataset(s.uri, rank=0, world_size=1)
    with pytest.raises(CheckpointLocationError, match="outside the checkpoint root"):
        load_checkpoint({"model": torch.zeros(4)}, "step-2", fresh, root=str(root))
    assert fresh.start_step == 0


def test_a_relative_root_from_another_folder_says_so_and_what_to_pass(
        tmp_path, monkeypatch) -> None:
    """The README's relative ``root="ckpt"``, resumed from another working directory: the
    marker's checkpoint lies under the first folder's root. The error says the root is
    relative and where it was taken from, not only that a marker names a strange place."""
    s = _stream(str(tmp_path / "s"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    _trained(s.uri, "ckpt")
    marker = lakestream.open(s.uri).checkpoints("train")[-1]
    assert marker.checkpoint_id == str((tmp_path / "a" / "ckpt" / "step-2").resolve())
    monkeypatch.chdir(tmp_path / "b")
    fresh = StreamDataset(s.uri, rank=0, world_size=1)
    with pytest.raises(CheckpointLocationError,
                       match=r"the root 'ckpt' is relative, taken from the working directory "
                             r".*/b: .* give the root as an absolute path") as e:
        load_checkpoint({"model": torch.zeros(4)}, marker, fresh, root="ckpt")
    assert "pass the root its checkpoints were saved under" in str(e.value)
    state = {"model": torch.zeros(4)}
    load_checkpoint(state, marker, fresh, root=str(tmp_path / "a" / "ckpt"))
    assert state["model"].tolist() == [0.0, 1.0, 2.0, 3.0]
