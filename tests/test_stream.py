"""The Stream handle on every backend: appends, steps, rank slices, the Delta view."""

from __future__ import annotations

import pyarrow as pa
import pytest

import lakestream
from lakestream.errors import (
    AlreadyExistsError,
    NotFoundError,
    SchemaMismatchError,
    StepNotAvailableError,
)
from tests.helpers import SCHEMA, delta_ids, ids, rows


def test_steps_and_rank_slices(backend) -> None:
    s = lakestream.create(backend.uri(), SCHEMA, global_batch_size=8,
                          storage_options=backend.options)
    for i in range(5):
        s.append(rows(4 * i, 4))
    assert (s.version, s.num_samples, s.num_steps) == (5, 20, 2)
    assert ids(s.read_step(1, rank=1, world_size=2)) == [12, 13, 14, 15]
    for step in range(2):
        parts = [ids(s.read_step(step, rank=r, world_size=4)) for r in range(4)]
        assert sum(parts, []) == list(range(8 * step, 8 * step + 8))
        assert ids(s.read_step(step)) == list(range(8 * step, 8 * step + 8))
    with pytest.raises(StepNotAvailableError, match="not visible yet"):
        s.read_step(2)
    reopened = lakestream.open(backend.uri(), storage_options=backend.options)
    assert (reopened.version, reopened.num_samples) == (5, 20)
    assert reopened.read_step(0, columns=["reward"]).column_names == ["reward"]


def test_delta_lake_reads_exactly_the_committed_rows(backend) -> None:
    s = lakestream.create(backend.uri(), SCHEMA, global_batch_size=8,
                          storage_options=backend.options)
    for i in range(3):
        s.append(rows(10 * i, 4))
    assert delta_ids(backend.uri(), backend.options) == sorted(
        [10 * i + k for i in range(3) for k in range(4)])


def test_a_handle_sees_other_writers_after_refresh(backend) -> None:
    a = lakestream.create(backend.uri(), SCHEMA, global_batch_size=4,
                          storage_options=backend.options)
    b = lakestream.open(backend.uri(), storage_options=backend.options)
    b.append(rows(0, 4))
    a.append(rows(4, 4))  # a folds b's commit before its own
    assert a.num_samples == 8 and b.num_samples == 4
    assert b.refresh() == 2 and ids(b.read_step(1)) == [4, 5, 6, 7]
    assert ids(a.read_step(0)) == [0, 1, 2, 3]


def test_create_twice_and_open_missing_raise(backend) -> None:
    lakestream.create(backend.uri(), SCHEMA, global_batch_size=4, storage_options=backend.options)
    with pytest.raises(AlreadyExistsError, match="already exists"):
        lakestream.create(backend.uri(), SCHEMA, global_batch_size=4,
                          storage_options=backend.options)
    with pytest.raises(NotFoundError, match="no Lakestream stream"):
        lakestream.open(backend.uri("missing"), storage_options=backend.options)


def test_world_size_must_divide_the_batch_and_keep_groups(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=8, group_size=4)
    s.append(rows(0, 8))
    assert ids(s.read_step(0, rank=1, world_size=2)) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="does not divide"):
        s.read_step(0, rank=0, world_size=3)
    with pytest.raises(ValueError, match="splits a group"):
        s.read_step(0, rank=0, world_size=4)


@pytest.mark.parametrize("bad, match", [
    (rows(0, 4).drop_columns(["reward"]), "missing columns \\['reward'\\]"),
    (rows(0, 4).append_column("extra", pa.array([1, 2, 3, 4])), "unexpected columns \\['extra'\\]"),
    (rows(0, 4).select(["reward", "id", "tokens"]), "out of order"),
    (rows(0, 4).set_column(0, "id", pa.array([1, 2, 3, 4], pa.int32())), "id: int32"),
    ([{"id": 1, "tokens": [1], "reward": "high"}] * 4, "does not fit"),
])
def test_schema_mismatch_is_typed_and_changes_nothing(tmp_path, bad, match) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    with pytest.raises(SchemaMismatchError, match=match):
        s.append(bad)
    assert s.version == 0 and not list(s.store.list("data/"))


def test_non_nullable_columns_reject_nulls(tmp_path) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    s = lakestream.create(str(tmp_path / "s"), schema, global_batch_size=2)
    with pytest.raises(SchemaMismatchError, match="non-nullable columns \\['id'\\]"):
        s.append({"id": [1, None]})
    s.append({"id": [1, 2]})
    assert s.num_samples == 2


def test_rows_must_fill_whole_groups(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=8, group_size=4)
    with pytest.raises(ValueError, match="multiple of the group size 4"):
        s.append(rows(0, 3))
    with pytest.raises(ValueError, match="multiple of the group size"):
        s.append(rows(0, 0))
    assert s.version == 0


def test_dict_and_row_inputs(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=2)
    s.append([{"id": 0, "tokens": [1], "reward": 0.5}, {"id": 1, "tokens": [], "reward": 1.0}])
    s.append({"id": [2, 3], "tokens": [[2], [3, 3]], "reward": [0.0, 0.0]})
    assert ids(s.read_step(0)) == [0, 1] and ids(s.read_step(1)) == [2, 3]
    with pytest.raises(TypeError):
        s.append("not data")


def test_checkpoint_markers(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 8))
    s.mark_checkpoint("train", 1, "ckpt-1")
    s.mark_checkpoint("train", 2)
    with pytest.raises(ValueError, match="past the 2 steps"):
        s.mark_checkpoint("train", 3)
    reopened = lakestream.open(str(tmp_path / "s"))
    assert [(m.step, m.checkpoint_id) for m in reopened.checkpoints("train")] == [
        (1, "ckpt-1"), (2, None)]
    assert reopened.checkpoints("eval") == []


@pytest.mark.parametrize("schema, match", [
    (pa.schema([]), "at least one column"),
    (pa.schema([("a", pa.uint32())]), "no Delta Lake equivalent"),
    (pa.schema([("a", pa.int64()), ("a", pa.int32())]), "duplicate"),
])
def test_bad_schemas_are_refused(tmp_path, schema, match) -> None:
    with pytest.raises(ValueError, match=match):
        lakestream.create(str(tmp_path / "s"), schema, global_batch_size=4)


def test_bad_batch_and_group_sizes_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="global_batch_size"):
        lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=0)
    for size in (2**40, True):  # a typo no producer fills: readers waited for ever
        with pytest.raises(ValueError, match="global_batch_size must be an int from 1 to "
                                             "16,777,216"):
            lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=size)
    assert not (tmp_path / "s").exists()
    with pytest.raises(ValueError, match="group_size"):
        lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=8, group_size=3)
