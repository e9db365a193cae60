"""Consumer groups as a trainer, an eval job and an operator see them: readers that only
read change nothing, groups hold data only through what they committed, `status` shows
every group with its lag, `group rm` releases what a group held, and two jobs in one
group are reported."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

import lakestream
from lakestream.loaders import StreamDataset
from lakestream.log.progress import read_progress
from tests.helpers import SCHEMA, rows

B = 4


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lakestream.ops.cli", *args], capture_output=True,
                          text=True, timeout=60)


def _stream(uri: str, steps: int) -> lakestream.Stream:
    s = lakestream.create(uri, SCHEMA, global_batch_size=B)
    for k in range(steps):
        s.append(rows(B * k, B))
    return s


def _files(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_an_eval_reader_beside_training_changes_nothing_and_rm_releases(tmp_path) -> None:
    s = _stream(str(tmp_path / "s"), 12)
    train = StreamDataset(s.uri, group="train", max_steps=9)
    assert [b["step"] for b in train] == list(range(9))
    train.commit_checkpoint()  # resumes at step 9
    s.refresh()
    before = (s.version, s.retention_point(keep_last=1).step, read_progress(s.store, "train"))
    assert before[1] == 9 and before[2] is not None and before[2].step == 9
    files = _files(tmp_path / "s")

    # A read-only eval job: reads, publishes nothing, registers nothing, holds nothing.
    evaluation = StreamDataset(s.uri, group=None, max_steps=3)
    assert [b["step"] for b in evaluation] == [0, 1, 2]
    evaluation.publish_progress()
    with pytest.raises(ValueError, match="group=None commits nothing"):
        evaluation.commit_checkpoint(2)
    s.refresh()
    assert (s.version, s.retention_point(keep_last=1).step,
            read_progress(s.store, "train")) == before
    assert _files(tmp_path / "s") == files

    # A job that asks to be a group joins it: registered at its first step, it holds from
    # there, and status shows both groups with their lag.
    assert [b["step"] for b in StreamDataset(s.uri, group="eval", max_steps=3)] == [0, 1, 2]
    s.refresh()
    assert s.registered_step("eval") == 0 and s.retention_point(keep_last=1).step == 0
    info = json.loads(_cli("status", s.uri, "--json", "--keep-last", "1").stdout)["groups"]
    assert set(info) == {"train", "eval"}
    assert info["train"]["lag_steps"] == 3 and info["eval"]["lag_steps"] == 9
    assert info["train"]["lag_seconds"] >= 0 and info["eval"]["lag_seconds"] >= 0
    assert info["train"]["holds_from_step"] == 9 and info["eval"]["holds_from_step"] == 0
    assert info["eval"]["progress"]["step"] == 3 and info["train"]["markers"][0]["step"] == 9
    listed = json.loads(_cli("group", "list", s.uri, "--json", "--keep-last", "1").stdout)
    def timeless(groups: dict) -> dict:
        return {g: {k: v for k, v in x.items() if k != "lag_seconds"} for g, x in groups.items()}

    assert timeless(listed) == timeless(info)

    # Removing it says what it releases; every handle and a fresh replay agree.
    out = _cli("group", "rm", s.uri, "eval", "--keep-last", "1")
    assert out.returncode == 0, out.stderr
    assert "held data from step 0" in out.stdout and "from step 0 to 9" in out.stdout
    fresh = lakestream.open(s.uri)
    s.refresh()
    for handle in (s, fresh):
        assert handle.groups == ["train"] and handle.retention_point(keep_last=1).step == 9
    assert read_progress(s.store, "eval") is None
    missing = _cli("group", "rm", s.uri, "eval")
    assert missing.returncode == 2 and "no consumer group 'eval'" in missing.stderr
    assert s.retain(keep_last=1) is not None


def test_two_jobs_publishing_into_one_group_are_reported(tmp_path, caplog) -> None:
    s = _stream(str(tmp_path / "s"), 4)
    trainer = StreamDataset(s.uri, group="train")
    careless = StreamDataset(s.uri, group="train")  # an eval job that kept the default
    # one process is one job: its datasets agree
    assert careless.membership.job == trainer.membership.job
    careless.membership.job = "another-job"  # as another process (or torchrun run) would be
    trainer.start_step = 3
    careless.start_step = 1
    with caplog.at_level(logging.WARNING, logger="lakestream"):
        trainer.publish_progress()
        careless.publish_progress()  # a predecessor, for all it knows yet
        assert careless.progress_conflicts == 0
        trainer.publish_progress()  # the trainer finds the other job's progress over its own
        careless.publish_progress()  # and the other job finds the trainer's again
    assert careless.progress_conflicts == 1 and trainer.progress_conflicts == 1
    warnings = [r.getMessage() for r in caplog.records if "two jobs in one group" in r.message]
    assert len(warnings) == 2
    assert trainer.membership.job in warnings[0] and careless.membership.job in warnings[0]
    assert read_progress(s.store, "train").job == careless.membership.job  # type: ignore[union-attr]


def test_a_resumed_job_is_not_taken_for_a_second_one(tmp_path, caplog) -> None:
    """A run that resumes seconds after its predecessor crashed finds that run's progress,
    fresh: it publishes over it without a report, and reports it only once the other run
    publishes again (alive after all)."""
    s = _stream(str(tmp_path / "s"), 4)
    crashed = StreamDataset(s.uri, group="train")
    crashed.membership.job = "the-crashed-run"
    crashed.start_step = 3
    crashed.publish_progress()
    resumed = StreamDataset(s.uri, group="train")  # at once: the progress is 0 s old
    resumed.start_step = 2  # its checkpoint is older than the crashed run's last step
    with caplog.at_level(logging.INFO, logger="lakestream"):
        for _ in range(3):
            resumed.publish_progress()
    assert resumed.progress_conflicts == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("takes over from job the-crashed-run" in r.getMessage() for r in caplog.records)
    crashed.publish_progress()  # ... unless it is alive after all
    assert crashed.progress_conflicts == 1
    resumed.publish_progress()
    assert resumed.progress_conflicts == 1
