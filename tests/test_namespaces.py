"""``s.groups`` and ``s.retention``: a stream's consumer groups and what they hold, read as
namespaces of the handle, the same calls as its flat methods."""

from __future__ import annotations

import pytest

import lakestream
from lakestream.errors import StepNotAvailableError
from tests.helpers import SCHEMA, ids, rows

B = 4


def _filled(uri: str, steps: int) -> lakestream.Stream:
    s = lakestream.create(uri, SCHEMA, global_batch_size=B)
    for k in range(steps * 2):
        s.append(rows(2 * k, 2))  # two fragments per step
    return s


def test_groups_read_as_the_sorted_list_of_names(tmp_path) -> None:
    s = _filled(str(tmp_path / "s"), 4)
    assert s.groups == [] and len(s.groups) == 0 and not s.groups
    s.groups.register("train", 1)
    s.groups.mark_checkpoint("eval", 2, "ck-2")
    assert s.groups == ["eval", "train"] and list(s.groups) == ["eval", "train"]
    assert "train" in s.groups and "other" not in s.groups and s.groups[-1] == "train"
    assert repr(s.groups) == "['eval', 'train']" and s.groups != ["train"]
    assert s.groups.registered_step("train") == 1 and s.registered_step("eval") is None
    assert [(m.step, m.checkpoint_id) for m in s.groups.checkpoints("eval")] == [(2, "ck-2")]
    assert s.groups.checkpoints("eval") == s.checkpoints("eval")
    with pytest.raises(TypeError):
        hash(s.groups)  # a value that changes with the log: not a key


def test_groups_is_a_snapshot_the_next_refresh_replaces(tmp_path) -> None:
    uri = str(tmp_path / "s")
    s = _filled(uri, 2)
    other = lakestream.open(uri)
    names = other.groups
    s.groups.register("train")
    assert names == [] and other.groups == []  # as of its last refresh
    other.refresh()
    assert other.groups == ["train"] and names == []


def test_remove_commits_and_refuses_an_unknown_group(tmp_path) -> None:
    s = _filled(str(tmp_path / "s"), 2)
    s.groups.register("eval")
    version = s.version
    assert s.groups.remove("eval") == version + 1 and s.groups == []
    with pytest.raises(ValueError, match="eval"):
        s.groups.remove("eval")
    assert s.version == version + 1  # the refusal committed nothing


def test_retention_namespace_is_the_flat_calls(tmp_path) -> None:
    s = _filled(str(tmp_path / "s"), 8)
    s.groups.mark_checkpoint("train", 4)
    s.groups.mark_checkpoint("train", 6)
    assert s.retention.holds(keep_last=1) == s.group_holds(keep_last=1) == {"train": 6}
    assert s.retention.point(keep_last=1) == s.retention_point(keep_last=1)
    assert s.retention.point(keep_last=1).step == 6
    assert s.retention.retain(keep_last=1) is not None
    assert s.retention.retain(keep_last=1) is None  # nothing left to reclaim
    assert ids(s.read_step(6)) == list(range(24, 28))
    with pytest.raises(StepNotAvailableError):
        s.read_step(5)
    report = s.retention.gc(grace_seconds=0, delta_checkpoint=False)
    assert report.data_files == 12  # six steps of two fragments
