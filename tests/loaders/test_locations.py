"""Checkpoint locations checked against the trainer's root and the streams it reads, before
anything is opened (pure: no store, no torch)."""

from __future__ import annotations

import os

import pytest

from lakestream.loaders.locations import CheckpointLocationError, check_location
from lakestream.log.replay import Marker

S3 = "s3://bucket/job"


def test_a_name_is_taken_under_the_root_and_recorded_whole(tmp_path) -> None:
    root = str(tmp_path / "ckpt")
    loc = check_location("step-1", root, [str(tmp_path / "s")])
    assert (loc.uri, loc.remote) == (f"{root}/step-1", False)
    assert check_location(f"{root}/a/../step-2", root, []).uri == f"{root}/step-2"
    assert check_location(f"file://{root}/step-3", root, []).uri == f"{root}/step-3"
    assert check_location(root, root, []).uri == root  # the root itself is under it
    s3 = check_location("step-1", f"{S3}/ckpt/", [f"{S3}/stream"])
    assert (s3.uri, s3.remote) == (f"{S3}/ckpt/step-1", True)
    assert check_location("s3a://bucket/job/ckpt/x", f"{S3}/ckpt", []).uri == \
        f"{S3}/ckpt/x"


@pytest.mark.parametrize("location, message", [
    ("../elsewhere", "outside the checkpoint root"),
    ("/etc", "outside the checkpoint root"),
    ("{root}-evil/step-1", "outside the checkpoint root"),  # a prefix, not a folder
    ("s3://bucket/job/ckpt/x", "outside the checkpoint root"),
    ("file://host/x", "names a host"),
    ("ftp://127.0.0.1:1/x", "scheme ftp://"),
    ("simplecache::s3://bucket/job/ckpt/x", "scheme simplecache::s3://"),
    ("", "not a non-empty str"),
])
def test_a_local_root_refuses(tmp_path, location: str, message: str) -> None:
    root = str(tmp_path / "ckpt")
    with pytest.raises(CheckpointLocationError, match=message):
        check_location(location.format(root=root), root, [])


@pytest.mark.parametrize("location, message", [
    ("s3://bucket/job/ckpt/../stream/x", r"no empty, '\.' or '\.\.' segment"),
    ("s3://bucket/job/ckpt//x", "segment"),
    ("../stream", "segment"),
    ("s3://other/job/ckpt/x", "outside the checkpoint root"),
    ("s3://bucket/job/ckpt-evil/x", "outside the checkpoint root"),
    ("/tmp/x", "outside the checkpoint root"),
    ("s3://bucket/job/stream/data/p/x", "inside the stream s3://bucket/job/stream"),
])
def test_an_s3_root_refuses(location: str, message: str) -> None:
    with pytest.raises(CheckpointLocationError, match=message):
        check_location(location, f"{S3}/ckpt", [f"{S3}/stream"])


def test_nothing_inside_a_stream_with_or_without_a_root(tmp_path) -> None:
    stream = tmp_path / "s"
    (stream / "data" / "p").mkdir(parents=True)
    os.symlink(stream / "data" / "p", tmp_path / "link")
    for location in (f"{stream}/data/p/ckpt", f"{tmp_path}/link/ckpt", str(stream)):
        with pytest.raises(CheckpointLocationError, match=f"inside the stream {stream}"):
            check_location(location, None, [str(stream)])
    with pytest.raises(CheckpointLocationError, match="inside the stream s3://bucket/job"):
        check_location("s3a://bucket/job/data/p/ckpt", None, ["s3://bucket/job"])
    # A root holding the stream: the stream is still refused, the rest is the root's.
    with pytest.raises(CheckpointLocationError, match="inside the stream"):
        check_location("s/data/p/ckpt", str(tmp_path), [str(stream)])
    assert check_location("ckpt/1", str(tmp_path), [str(stream)]).uri == \
        f"{tmp_path}/ckpt/1"


def test_a_root_inside_a_stream_is_refused(tmp_path) -> None:
    with pytest.raises(CheckpointLocationError, match="checkpoint root .* is inside the stream"):
        check_location("step-1", f"{S3}/stream/ckpt", [f"{S3}/stream"])
    with pytest.raises(CheckpointLocationError, match="checkpoint root 'ftp://h/x'"):
        check_location("step-1", "ftp://h/x", [])


def test_an_error_names_the_marker_and_what_to_do() -> None:
    marker = Marker("train", 7, "s3://bucket/job/stream/data/p/ckpt-9", 42)
    with pytest.raises(CheckpointLocationError) as e:
        check_location(marker.checkpoint_id or "", f"{S3}/ckpt", [f"{S3}/stream"],
                       marker=marker)
    message = str(e.value)
    assert "group 'train' at step 7 (log version 42), checkpoint_id " \
           "'s3://bucket/job/stream/data/p/ckpt-9'" in message
    assert "nothing was opened" in message and "Stream.checkpoints(group)" in message
