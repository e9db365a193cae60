"""The command line: create and status, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest

import lakestream
from lakestream.cli import main, parse_schema
from tests.helpers import SCHEMA, rows


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lakestream.cli", *args], capture_output=True,
                          text=True, timeout=60)


def test_create_then_status(tmp_path) -> None:
    uri = str(tmp_path / "s")
    out = _cli("create", uri, "--schema", "id:int64,tokens:list<int32>,reward:float32",
               "--global-batch-size", "4")
    assert out.returncode == 0, out.stderr
    s = lakestream.open(uri)
    s.append(rows(0, 4))
    s.mark_checkpoint("train", 1, "c1")
    info = json.loads(_cli("status", uri, "--json").stdout)
    assert (info["version"], info["num_samples"], info["num_steps"]) == (2, 4, 1)
    assert info["groups"]["train"][0]["step"] == 1 and info["snapshot_version"] == 0
    text = _cli("status", uri).stdout
    assert "samples     4  steps 1" in text and "train" in text


def test_errors_are_one_line_and_exit_2(tmp_path, capsys) -> None:
    assert main(["status", str(tmp_path / "missing")]) == 2
    assert "no Lakestream stream" in capsys.readouterr().err
    assert main(["create", str(tmp_path / "s"), "--schema", "a:uint8",
                 "--global-batch-size", "4"]) == 2
    assert "unknown column type 'uint8'" in capsys.readouterr().err


def test_schema_grammar() -> None:
    assert parse_schema("a:int64!,b:list<float32>,c:string") == pa.schema([
        pa.field("a", pa.int64(), nullable=False), ("b", pa.list_(pa.float32())),
        ("c", pa.string())])
    with pytest.raises(ValueError, match="not name:type"):
        parse_schema("a")


def test_tail_follows_new_steps_and_the_lag(tmp_path) -> None:
    from lakestream.progress import publish_progress

    uri = str(tmp_path / "s")
    s = lakestream.create(uri, parse_schema("id:int64,tokens:list<int32>,reward:float32"),
                          global_batch_size=4)
    s.append(rows(0, 8))
    publish_progress(s.store, "train", step=1)
    out = _cli("tail", uri, "--interval", "0.1", "--count", "2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and "steps 2 samples 8" in lines[0] and "train lag 1" in lines[0]


def test_verify_reads_everything_and_names_what_is_damaged(tmp_path, capsys) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4, snapshot_interval=2)
    for k in range(5):
        s.append(rows(4 * k, 4))
    assert main(["verify", uri]) == 0
    assert "checked 6 log entries, 3 snapshots, 5 fragments: sound" in capsys.readouterr().out
    victim = s.state.all_fragments()[0].path
    data = bytearray(s.store.get(victim))
    data[len(data) // 2] ^= 0x10
    s.store.put(victim, bytes(data))
    assert main(["verify", uri]) == 1
    out = capsys.readouterr().out
    assert f"damaged: fragment {victim}" in out and "1 problems" in out
