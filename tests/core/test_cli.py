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
    assert info["groups"]["train"]["markers"][0]["step"] == 1 and info["snapshot_version"] == 0
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


@pytest.mark.parametrize("args, message", [
    (["status", "URI", "-o", "FOO"], "storage option 'FOO' is not KEY=VALUE"),
    (["tail", "URI", "--interval", "-1"], "not a positive number of seconds: '-1'"),
    (["tail", "URI", "--interval", "nan"], "not a positive number of seconds: 'nan'"),
    (["group", "rm", "URI"], "group rm needs the group to remove"),
    (["group", "rm", "URI", "../x"], "consumer group '../x' is not valid"),
])
def test_bad_arguments_are_named_and_change_nothing(tmp_path, args, message) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 4))
    before = sorted(p.name for p in (tmp_path / "s").rglob("*"))
    out = _cli(*[s.uri if a == "URI" else a for a in args])
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert sorted(p.name for p in (tmp_path / "s").rglob("*")) == before


def test_verify_of_a_path_without_a_stream_says_so(tmp_path) -> None:
    out = _cli("verify", str(tmp_path / "nothing"))
    assert out.returncode == 2 and "no stream at" in out.stderr and "damaged" not in out.stdout


def test_version_help_and_json_for_scripts(tmp_path) -> None:
    out = _cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"lakestream {lakestream.__version__}"
    helped = _cli("--help").stdout
    for command in ("create", "status", "group", "tail", "lineage", "verify", "retain", "gc",
                    "demo"):
        assert command in helped
    assert "``" not in helped
    uri = str(tmp_path / "s")
    created = json.loads(_cli("create", uri, "--schema", "id:int64,tokens:list<int32>,"
                              "reward:float32", "--global-batch-size", "4", "--json").stdout)
    assert created["global_batch_size"] == 4
    s = lakestream.open(uri)
    s.append(rows(0, 4))
    s.append(rows(4, 4))
    s.mark_checkpoint("train", 1)
    assert json.loads(_cli("retain", uri, "--keep-last", "1", "--json").stdout)["version"] == 4
    assert json.loads(_cli("gc", uri, "--grace", "0", "--json").stdout)["data_files"] == 1
    checked = json.loads(_cli("verify", uri, "--json").stdout)
    assert checked["problems"] == [] and checked["fragments"] == 1
    lines = _cli("tail", uri, "--interval", "0.05", "--count", "2", "--json").stdout.splitlines()
    assert [json.loads(x)["steps"] for x in lines] == [2, 2]
    assert json.loads(_cli("group", "list", uri, "--json").stdout)["train"]["markers"][0][
        "step"] == 1


def test_ctrl_c_ends_tail_quietly(tmp_path) -> None:
    import signal
    import time

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    proc = subprocess.Popen([sys.executable, "-m", "lakestream.cli", "tail", s.uri,
                             "--interval", "0.05"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while time.monotonic() < deadline and not proc.stdout.readline():
            pass
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
