"""The command line: create and status, as a user runs them."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import lakestream
import lakestream.ops.status
from lakestream.ops.args import parse_schema
from lakestream.ops.cli import main
from lakestream.producers import Producer
from tests.helpers import SCHEMA, ids, rows


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lakestream.ops.cli", *args], capture_output=True,
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
    assert parse_schema("a:timestamp<ms,+01:00>").field("a").type.tz == "+01:00"
    nested = parse_schema("at:timestamp<us,UTC>!,t:timestamp<ns>,d:date,p:decimal<10,2>,"
                          "meta:struct<source:string,scores:list<float32>,at:timestamp<ms>>,"
                          "image:tensor<uint8,224,224,3>!")
    assert nested.field("at") == pa.field("at", pa.timestamp("us", tz="UTC"), nullable=False)
    assert nested.field("t").type == pa.timestamp("ns") and nested.field("d").type == pa.date32()
    assert nested.field("p").type == pa.decimal128(10, 2)
    assert nested.field("meta").type == pa.struct([
        ("source", pa.string()), ("scores", pa.list_(pa.float32())), ("at", pa.timestamp("ms"))])
    assert nested.field("image") == lakestream.tensor_field("image", (224, 224, 3), "uint8")
    for bad, said in (("a:tensor<uint8>", "not tensor<dtype,d0,d1,...>"),
                      ("a:tensor<uint8,x>", "not tensor<dtype,d0,d1,...>"),
                      ("a:tensor<complex,2>", "tensor dtype 'complex'"),
                      ("a:list<tensor<uint8,2>>", "a tensor is a top-level column"),
                      ("a:timestamp<hours>", "unknown column type 'timestamp<hours>'"),
                      ("a:timestamp<us,>", "unknown column type 'timestamp<us,>'"),
                      ("a:timestamp<us,Not/AZone>", "unknown column type"),
                      ("a:struct<t:tensor<uint8,2>>", "a tensor is a top-level column"),
                      ("a:struct<b:int64", "unbalanced"),
                      ("a:struct<>", "column '' is not name:type")):
        with pytest.raises(ValueError, match=re.escape(said)):
            parse_schema(bad)


def test_create_makes_tensor_timestamp_and_struct_columns(tmp_path) -> None:
    uri = str(tmp_path / "s")
    assert main(["create", uri, "--schema", "image:tensor<uint8,2,3>,at:timestamp<us,UTC>,"
                 "meta:struct<source:string,n:int32>", "--global-batch-size", "2"]) == 0
    s = lakestream.open(uri)
    images = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    s.append({"image": images, "at": [0, 10**6],
              "meta": [{"source": "a", "n": 1}, {"source": "b", "n": 2}]})
    step = s.read_step(0)
    assert step.column("meta").to_pylist()[1] == {"source": "b", "n": 2}
    assert str(step.column("at").type) == "timestamp[us, tz=UTC]"
    assert np.frombuffer(step.column("image")[1].as_py(), np.uint8).reshape(2, 3).tolist() \
        == images[1].tolist()


def test_tail_follows_new_steps_and_the_lag(tmp_path) -> None:
    from lakestream.log.progress import publish_progress

    uri = str(tmp_path / "s")
    s = lakestream.create(uri, parse_schema("id:int64,tokens:list<int32>,reward:float32"),
                          global_batch_size=4)
    s.append(rows(0, 8))
    publish_progress(s.store, "train", step=1)
    out = _cli("tail", uri, "--interval", "0.1", "--count", "2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and "steps 2 samples 8" in lines[0], lines
    assert "; group train lag 1 steps; producers none" in lines[0], lines
    with Producer(uri, "p0") as p:
        p.write(rows(8, 4))
    out = _cli("tail", uri, "--interval", "0.1", "--count", "1")
    assert re.search(r"; group train lag 2 steps; producers p0 epoch \d+ seq 0$", out.stdout), \
        out.stdout
    out = _cli("tail", uri, "--interval", "0.1", "--count", "1", "--group", "eval")
    assert "; group eval: not in this stream (no registration, marker or progress);" \
        in out.stdout, out.stdout
    s.mark_checkpoint("eval", 1)
    out = _cli("tail", uri, "--interval", "0.1", "--count", "1", "--group", "eval")
    assert "; group eval: no progress published yet;" in out.stdout, out.stdout


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
    assert f"damaged: fragment {victim}" in out and out.endswith("fragments: 1 problem\n")


@pytest.mark.parametrize("args, message", [
    (["status", "URI", "-o", "FOO"], "storage option 'FOO' is not KEY=VALUE"),
    (["tail", "URI", "--interval", "-1"], "not a positive number of seconds: '-1'"),
    (["tail", "URI", "--interval", "nan"], "not a positive number of seconds: 'nan'"),
    (["group", "rm", "URI"], "group rm needs the group to remove"),
    (["group", "rm", "URI", "../x"], "consumer group '../x' is not valid"),
    (["tail", "URI", "--group", "bad name"], "consumer group 'bad name' is not valid"),
    (["demo", "-o", "KEY=value"], "unrecognized arguments: -o KEY=..."),
    (["gc", "URI", "--grace", "soon"], "not a duration: 'soon' (seconds, or e.g. 30s"),
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
    proc = subprocess.Popen([sys.executable, "-m", "lakestream.ops.cli", "tail", s.uri,
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


@pytest.mark.parametrize("args", [
    ["-o", "AWS_SECRET_ACCESS_KEY=hunter2-secret"], ["-o", "aws_session_token=hunter2-secret"],
    ["--option=AWS_SECRET_ACCESS_KEY=hunter2-secret"],
    ["-o", "AWS_SECRET_ACCESS_KEY:hunter2-secret"],  # a typo: no '='
    ["-O", "AWS_SECRET_ACCESS_KEY=hunter2-secret"],  # a typo: no such flag
    ["AWS_SECRET_ACCESS_KEY=hunter2-secret"],  # the -o left out
])
def test_a_secret_on_the_command_line_is_refused_and_never_echoed(tmp_path, args) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    out = _cli("status", s.uri, *args)
    assert out.returncode == 2 and "hunter2" not in out.stdout + out.stderr, out.stderr
    if "-o" in args or args[0].startswith("--option") and "=" in args[0][9:]:
        assert "not KEY=VALUE" in out.stderr or "export AWS_" in out.stderr, out.stderr


def test_s3_credentials_come_from_the_environment(tmp_path, s3_options) -> None:
    import os
    import uuid

    from tests.conftest import BUCKET

    uri = f"s3://{BUCKET}/cli-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({k: v for k, v in s3_options.items() if "KEY" in k})
    plain = [x for k, v in s3_options.items() if "KEY" not in k for x in ("-o", f"{k}={v}")]
    created = subprocess.run(
        [sys.executable, "-m", "lakestream.ops.cli", "create", uri, "--schema", "id:int64",
         "--global-batch-size", "4", *plain], capture_output=True, text=True, timeout=60,
        env={**env, "HOME": str(tmp_path)})
    assert created.returncode == 0 and f"created {uri}" in created.stdout, created.stderr
    secret = ["-o", f"AWS_SECRET_ACCESS_KEY={s3_options['AWS_SECRET_ACCESS_KEY']}"]
    refused = _cli("status", uri, *plain, *secret)
    assert refused.returncode == 2 and "export AWS_SECRET_ACCESS_KEY" in refused.stderr
    assert s3_options["AWS_SECRET_ACCESS_KEY"] not in refused.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path) -> None:
    """``lakestream tail --json | head -1``: no BrokenPipeError traceback, the status of a
    command its pipe's reader left (141, as for SIGPIPE)."""
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    proc = subprocess.Popen([sys.executable, "-m", "lakestream.ops.cli", "tail", s.uri,
                             "--interval", "0.02", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert json.loads(proc.stdout.readline())["steps"] == 0
        proc.stdout.close()
        proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 141 and err == "", err


def test_help_shows_the_defaults_and_units() -> None:
    assert "(default: 1h)" in _cli("gc", "--help").stdout
    assert "seconds, or e.g. 30s, 10m, 1h" in " ".join(_cli("gc", "--help").stdout.split())
    for command in ("status", "retain", "group"):
        helped = " ".join(_cli(command, "--help").stdout.split())
        assert "retention keeps (default: 2)" in helped, helped
    helped = " ".join(_cli("tail", "--help").stdout.split())
    assert "(default: train)" in helped and "(default: 1 s)" in helped
    assert "credentials come from the environment" in " ".join(_cli("--help").stdout.split())
    helped = " ".join(_cli("create", "--help").stdout.split())
    for said in ("W must divide B, and B/W be a multiple of G", "G divides B. Default: 1",
                 "struct<name:T,...>; timestamp<us> (s, ms, us, ns)",
                 "tensor<dtype,d0,d1,...> (a top-level column",
                 "opening reads at most about K log entries. Default: 100"):
        assert said in helped, helped


def test_sizes_are_for_people_and_exact_in_json(tmp_path, capsys) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    for k in range(3):
        s.append(rows(4 * k, 4))
    s.mark_checkpoint("train", 2)
    assert main(["status", s.uri, "--keep-last", "1"]) == 0
    text = capsys.readouterr().out
    assert "train                    1 marker (newest: - reads from step 2)" in text, text
    assert re.search(r"reclaimable below step 2, 2 fragments, \d\.\d KiB\n", text), text
    assert main(["retain", s.uri, "--keep-last", "1"]) == 0
    assert "reclaimed below step 2 (offset 8) at version 5" in capsys.readouterr().out
    assert main(["gc", s.uri, "--grace", "0s"]) == 0
    text = capsys.readouterr().out
    assert re.match(r"deleted 2 data files \(\d\.\d KiB\), 0 log entries, 0 Delta "
                    r"checkpoints, ", text), text
    assert "kept for the grace period (0 s)" in text
    s.append(rows(12, 4))
    s.mark_checkpoint("train", 3)
    size = next(f.size for f in s.state.all_fragments() if f.offset == 8)
    s.retain(keep_last=1)
    assert main(["gc", s.uri, "--grace", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["data_files"], report["data_bytes"]) == (1, size)


def test_status_after_a_manual_retain_says_what_the_log_reclaimed(tmp_path, capsys) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    for k in range(6):
        s.append(rows(4 * k, 4))
    s.mark_checkpoint("train", 2, "c2")
    s.mark_checkpoint("train", 4, "c4")
    assert main(["retain", s.uri, "--keep-last", "1"]) == 0
    capsys.readouterr()
    assert main(["status", s.uri]) == 0  # the keep_last=2 view, after a keep_last=1 retain
    text = capsys.readouterr().out
    assert "fragments   2  reclaimed below step 4 (offset 16)" in text, text
    # A what-if, not the stream's configuration: nothing configures retention.
    assert "retention   if retain(keep_last=2) ran now: nothing more to reclaim (below step 4)" \
        in text, text
    assert "(newest: c2 reads from step 2 (reclaimed), c4 reads from step 4); progress -; " \
        "lag 2 steps" in text, text
    assert "holds from step 4" in text and "holds from step 2" not in text, text
    assert main(["status", s.uri, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["retention"]["step"] == 4 and info["reclaimed_below_step"] == 4
    assert info["groups"]["train"]["holds_from_step"] == 4
    assert [m["reclaimed"] for m in info["groups"]["train"]["markers"]] == [True, False]


HOSTILE = "\x1b[2J\x1b]0;owned\x07\u202e\x9b31m"


def test_names_and_states_from_the_store_reach_the_terminal_escaped(tmp_path, capsys) -> None:
    """A producer may write any bytes into its state and a marker's checkpoint id, and a
    log written by another tool may hold any group name (its entry is void): none reaches
    the terminal raw."""
    from lakestream.log.entries import Checkpoint
    from lakestream.log.progress import publish_progress
    from lakestream.producers import Producer

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    with Producer(s.uri, "p0") as p:
        p.write(rows(0, 4), state=HOSTILE)
    with Producer(s.uri, "p1") as p:
        p.write(rows(4, 4), state={"k": HOSTILE})
    s.refresh()
    s.mark_checkpoint("train", 1, HOSTILE)
    s.commit(lambda state, cid: Checkpoint("evil" + HOSTILE, 1, HOSTILE, cid))
    publish_progress(s.store, "train", 1, job=HOSTILE)
    outputs = []
    for args in (["status", s.uri], ["group", "list", s.uri], ["lineage", s.uri, "--step", "1"],
                 ["tail", s.uri, "--count", "1"], ["status", str(tmp_path / HOSTILE)]):
        main(args)
        out = capsys.readouterr()
        outputs.append(out.out + out.err)
    for text in outputs:
        assert not any(c in text for c in "\x1b\x07\u202e\x9b"), repr(text)
    assert "evil" not in outputs[1] and "train" in outputs[1], outputs[1]  # void
    assert "state \\x1b[2J" in outputs[0] and "state {'k': '\\x1b[2J" in outputs[0]
    assert "job \\x1b[2J" in outputs[1]
    assert "checkpoint \\x1b[2J" in outputs[2], outputs[2]
    # JSON escapes them itself, and reads back exact.
    for args in (["status", s.uri, "--json"], ["lineage", s.uri, "--step", "1", "--json"]):
        main(args)
        text = capsys.readouterr().out
        assert not any(c in text for c in "\x1b\x07\u202e\x9b"), repr(text)
        assert any(HOSTILE in x for x in _strings(json.loads(text)))


def _strings(value: object) -> list[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in (k, *_strings(v))]
    if isinstance(value, list):
        return [x for v in value for x in _strings(v)]
    return []


def test_the_cli_status_and_a_reader_name_one_first_retained_step(tmp_path, capsys) -> None:
    """Retention removes whole fragments below the resume step; with fragments of 6 rows and
    steps of 8 the fragment holding the step's start stays. The CLI, ``status`` and a
    reader name the same first readable step, from one definition
    (``ReplayState.first_retained_step``)."""
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=8, group_size=2)
    for k in range(6):
        s.append(rows(6 * k, 6))  # 36 rows: steps 0-3 whole
    s.mark_checkpoint("train", 2)  # holds from offset 16: fragments [0, 6) and [6, 12) go
    assert main(["retain", s.uri, "--keep-last", "1"]) == 0
    out = capsys.readouterr().out
    s.refresh()
    assert s.state.first_retained_step == 2
    assert [f.offset for f in s.state.all_fragments()][0] == 12
    assert "reclaimed below step 2 (offset 16)" in out, out
    assert lakestream.ops.status.status(s)["reclaimed_below_step"] == 2
    with pytest.raises(lakestream.StepNotAvailableError, match="steps below 2 cannot be read"):
        s.read_step(1)
    assert ids(s.read_step(2)) == list(range(16, 24))
