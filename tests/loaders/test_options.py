"""A StreamDataset's options as one value: checked once, overridable by name, and a name
that is no option refused with the names there are."""

from __future__ import annotations

import pyarrow as pa
import pytest

import lakestream
from lakestream.loaders import ReadOptions, StreamDataset


def _stream(path: str) -> str:
    s = lakestream.create(path, pa.schema([("x", pa.int64())]), global_batch_size=4)
    return s.uri


def test_options_as_one_value_and_by_name_read_the_same(tmp_path) -> None:
    uri = _stream(str(tmp_path / "s"))
    options = ReadOptions(read_threads=2, prefetch=3, step_key="at", timeout=0.0)
    by_value = StreamDataset(uri, None, options)
    by_name = StreamDataset(uri, None, read_threads=2, prefetch=3, step_key="at", timeout=0.0)
    assert by_value.options == by_name.options == options
    overridden = StreamDataset(uri, None, options, read_threads=5)
    assert overridden.options.read_threads == 5 and overridden.options.prefetch == 3
    assert options.read_threads == 2  # the given value is not changed


def test_an_unknown_option_is_refused_with_the_options_there_are(tmp_path) -> None:
    uri = _stream(str(tmp_path / "s"))
    with pytest.raises(TypeError, match=r"no option 'read_thread'.*read_threads"):
        StreamDataset(uri, read_thread=2)
    with pytest.raises(TypeError, match="options must be a ReadOptions"):
        StreamDataset(uri, None, {"read_threads": 2})  # type: ignore[arg-type]


@pytest.mark.parametrize(("settings", "error", "match"), [
    ({"read_threads": 0}, ValueError, "read_threads must be a positive int"),
    ({"prefetch": True}, ValueError, "prefetch must be a non-negative int"),
    ({"keep_last": 0}, ValueError, "keep_last must be a positive int"),
    ({"start_step": -1}, ValueError, "start_step must be a non-negative int"),
    ({"collate": "stacked"}, ValueError, "collate must be 'padded', 'packed'"),
    ({"transform": 3}, TypeError, "transform must be a callable"),
    ({"columns": "x"}, TypeError, "columns must be a list of column names"),
    ({"accept_columns": "x"}, TypeError, "accept_columns must be a list"),
    ({"columns": ["x", 3]}, TypeError, "columns must be a list of column names"),
    ({"columns": 3}, TypeError, "columns must be a list of column names"),
    ({"disk_cache": "/tmp/cache"}, TypeError, "disk_cache must be a lakestream DiskCache"),
])
def test_each_option_is_checked_when_the_options_are_made(settings, error, match) -> None:
    with pytest.raises(error, match=match):
        ReadOptions(**settings)
