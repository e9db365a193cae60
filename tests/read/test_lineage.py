"""Step lineage: which producers, fragments, versions, policy versions and markers are behind
a step, across a producer restart and a retention pass, from the API and the CLI."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

import lakestream
from lakestream.errors import StepNotAvailableError
from lakestream.log.replay import Marker
from lakestream.ops.cli import main
from lakestream.producers import Producer
from lakestream.read.lineage import StepLineage
from lakestream.read.offsets import OffsetReader
from tests.helpers import SCHEMA, rows

RL = pa.schema([("id", pa.int64()), ("policy_version", pa.int64())])


def _rl(start: int, n: int, policy: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + n)), "policy_version": [policy] * n},
                    schema=RL)


def _writers(lin: StepLineage) -> list[tuple[Any, ...]]:
    return [(x.offset, x.producer, x.epoch, x.seq, x.version, x.policy_version)
            for x in lin.samples]


def _restarted(uri: str) -> lakestream.Stream:
    """Step 0: seq 0 of rollout-0 at epoch 1, then seq 1 at epoch 2 (after a restart);
    step 1: a plain append, then seq 2. Versions: 1 and 3 fence, 2, 4, 5 and 6 append."""
    s = lakestream.create(uri, RL, global_batch_size=4, group_size=2)
    with Producer(uri, "rollout-0") as p:
        p.write(_rl(0, 2, policy=7))
    with Producer(uri, "rollout-0") as p:
        p.write(_rl(2, 2, policy=8))
        p.flush()
        s.append(_rl(4, 2, policy=8))
        p.write(_rl(6, 2, policy=9))
    s.refresh()
    return s


def test_a_step_names_both_epochs_of_a_restarted_producer(tmp_path) -> None:
    s = _restarted(str(tmp_path / "s"))
    zero = s.lineage(0)
    assert _writers(zero) == [(0, "rollout-0", 1, 0, 2, 7), (1, "rollout-0", 1, 0, 2, 7),
                              (2, "rollout-0", 2, 1, 4, 8), (3, "rollout-0", 2, 1, 4, 8)]
    assert [x.path.split("/")[:2] for x in zero.samples] == [["data", "rollout-0"]] * 4
    assert [x.path.rsplit("/", 1)[1][:4] for x in zero.samples] == ["1-0-", "1-0-", "2-1-",
                                                                    "2-1-"]
    assert not zero.reclaimed and zero.markers == () and zero.offsets == (0, 4)
    # A plain append has no producer; its epoch and seq are those of its path.
    assert _writers(s.lineage(1)) == [(4, None, 0, 0, 5, 8), (5, None, 0, 0, 5, 8),
                                      (6, "rollout-0", 2, 2, 6, 9), (7, "rollout-0", 2, 2, 6, 9)]
    assert {x.policy_version_min for x in s.lineage(1).samples} == {None}
    s.mark_checkpoint("train", 1, "ckpt-1")
    assert lakestream.open(s.uri).lineage(1).markers == (
        Marker("train", 1, "ckpt-1", 7),)


def test_only_the_policy_columns_are_read(tmp_path, monkeypatch) -> None:
    s = _restarted(str(tmp_path / "rl"))
    reads: list[Any] = []
    real = OffsetReader.read

    def counting(self: OffsetReader, spans: Any, columns: Any = None, **kw: Any) -> pa.Table:
        reads.append((list(spans), columns))
        return real(self, spans, columns, **kw)

    monkeypatch.setattr(OffsetReader, "read", counting)  # every read of a handle's rows
    assert [x.policy_version for x in s.lineage(1).samples] == [8, 8, 9, 9]
    assert reads == [([(4, 8)], ["policy_version"])]
    plain = lakestream.create(str(tmp_path / "plain"), SCHEMA, global_batch_size=2)
    plain.append(rows(0, 2))
    lin = plain.lineage(0)
    assert [(x.policy_version, x.policy_version_min, x.policy_version_max)
            for x in lin.samples] == [(None, None, None)] * 2
    assert len(reads) == 1  # no such column: nothing read but the log
    ranged = pa.schema([("id", pa.int64()), ("policy_version_min", pa.int32()),
                        ("policy_version_max", pa.int32())])
    r = lakestream.create(str(tmp_path / "ranged"), ranged, global_batch_size=2)
    r.append(pa.table({"id": [0, 1], "policy_version_min": [3, 4],
                       "policy_version_max": [5, 6]}, schema=ranged))
    assert [(x.policy_version, x.policy_version_min, x.policy_version_max)
            for x in r.lineage(0).samples] == [(None, 3, 5), (None, 4, 6)]


def _retained(uri: str) -> lakestream.Stream:
    """Six steps of B=4, two fragments each; train marks 2 and 4, eval 3; keep_last=1 keeps
    train@4 and eval@3, so retention reclaims below step 3."""
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    for k in range(12):
        s.append(rows(2 * k, 2))
    s.mark_checkpoint("train", 2, "t2")
    s.mark_checkpoint("eval", 3, "e3")
    s.mark_checkpoint("train", 4, "t4")
    assert s.retain(keep_last=1) is not None and s.state.reclaimed_below == 12
    return s


def test_retention_reclaims_a_step_and_leaves_the_markers_that_replay_the_rest(
        tmp_path) -> None:
    s = _retained(str(tmp_path / "s"))
    gone = s.lineage(1)
    assert gone.reclaimed and gone.samples == () and gone.markers == ()
    assert gone.to_json()["reclaimed"] is True
    assert s.lineage(3).markers == (Marker("eval", 3, "e3", 14),)
    five = lakestream.open(s.uri).lineage(5)
    # train@2 still is in the log but its data is reclaimed: resuming there fails.
    assert five.markers == (Marker("eval", 3, "e3", 14), Marker("train", 4, "t4", 15))
    assert [x.offset for x in five.samples] == [20, 21, 22, 23]
    assert [x.version for x in five.samples] == [11, 11, 12, 12]


def test_a_step_not_committed_raises_and_a_new_one_is_seen(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 4))
    other = lakestream.open(s.uri)
    with pytest.raises(StepNotAvailableError, match="step 1 of .* not committed yet: 1 steps"):
        s.lineage(1)
    with pytest.raises(ValueError, match="non-negative int, got -1"):
        s.lineage(-1)
    s.append(rows(4, 4))
    assert [x.offset for x in other.lineage(1).samples] == [4, 5, 6, 7]  # refreshed once


def test_the_cli_prints_a_table_per_fragment_and_json_per_sample(tmp_path, capsys) -> None:
    s = _restarted(str(tmp_path / "rl"))
    s.mark_checkpoint("train", 0, "c0")
    assert main(["lineage", s.uri, "--step", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"step 0 of {s.uri}: offsets [0, 4), as of version 7"
    table = [line.split() for line in lines[2:4]]
    assert [row[:8] for row in table] == [["[0,", "2)", "2", "rollout-0", "1", "0", "2", "7"],
                                          ["[2,", "4)", "2", "rollout-0", "2", "1", "4", "8"]]
    assert table[0][8].startswith("data/rollout-0/1-0-")
    assert lines[4:] == ["markers that replay it (resume at or before step 0):",
                         "  train            step 0        checkpoint c0 (version 7)"]
    assert main(["lineage", s.uri, "--step", "1"]) == 0
    assert "(append)" in capsys.readouterr().out.splitlines()[2]
    assert main(["lineage", s.uri, "--step", "1", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info == s.lineage(1).to_json()
    assert [(x["offset"], x["producer"], x["seq"], x["policy_version"])
            for x in info["samples"]] == [(4, None, 0, 8), (5, None, 0, 8),
                                          (6, "rollout-0", 2, 9), (7, "rollout-0", 2, 9)]
    assert info["markers"] == [{"group": "train", "step": 0, "checkpoint_id": "c0",
                                "version": 7}]


def test_the_cli_says_reclaimed_and_not_committed(tmp_path, capsys) -> None:
    s = _retained(str(tmp_path / "s"))
    assert main(["lineage", s.uri, "--step", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == \
        "reclaimed by retention: its samples are gone and no marker replays it"
    assert main(["lineage", s.uri, "--step", "0", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["reclaimed"], info["samples"], info["markers"]) == (True, [], [])
    assert main(["lineage", s.uri, "--step", "3"]) == 0  # the first step retention kept
    assert capsys.readouterr().out.splitlines()[1].split() == [
        "offsets", "samples", "producer", "epoch", "seq", "version", "policy", "fragment"]
    assert main(["lineage", s.uri, "--step", "6"]) == 2
    assert capsys.readouterr().err == (f"lakestream lineage: step 6 of {s.uri} is not "
                                       "committed yet: 6 steps are committed (version 16); "
                                       "ask for a step below 6\n")
