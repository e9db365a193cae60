"""``accept=`` is recorded by name in checkpoints: a filter its name does not find again (a
lambda, a nested function, a partial) is refused when the dataset is made."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import lakestream
from lakestream.loaders import StreamDataset


def varied(group: pa.Table) -> bool:
    return len(set(group.column("reward").to_pylist())) > 1


def _nested() -> Any:
    def inner(group: pa.Table) -> bool:
        return True
    return inner


def _stream(tmp_path: Path) -> str:
    schema = pa.schema([("id", pa.int64()), ("reward", pa.float32())])
    s = lakestream.create(str(tmp_path / "s"), schema, global_batch_size=2, group_size=2)
    s.append({"id": [0, 1], "reward": [0.0, 1.0]})
    return s.uri


@pytest.mark.parametrize("accept, what", [
    (lambda group: True, "a lambda"),
    (_nested(), "a nested function"),
    (functools.partial(varied), "functools.partial"),
], ids=["lambda", "nested", "partial"])
def test_an_unnamed_filter_is_refused(tmp_path: Path, accept: Any, what: str) -> None:
    uri = _stream(tmp_path)
    with pytest.raises(ValueError, match=f"accept= got {what}.*recorded by name.*top level"):
        StreamDataset(uri, group=None, accept=accept)


def test_a_module_level_filter_is_taken(tmp_path: Path) -> None:
    ds = StreamDataset(_stream(tmp_path), group=None, timeout=5, max_steps=1, accept=varied,
                       accept_columns=["reward"])
    assert [int(b["step"]) for b in ds] == [0]
