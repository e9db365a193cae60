"""A mix's positions as each source's own steps (``stream_steps``): what registration,
markers and progress are counted in."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lakestream.read.steps import stream_steps


@dataclass
class _Shape:
    global_batch_size: int


def test_an_offset_is_the_step_of_its_own_stream_that_holds_it() -> None:
    streams = [_Shape(4), _Shape(6)]
    assert stream_steps([0, 0], streams) == [0, 0]  # type: ignore[arg-type]
    assert stream_steps([3, 6], streams) == [0, 1]  # type: ignore[arg-type]
    assert stream_steps([4, 11], streams) == [1, 1]  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        stream_steps([4], streams)  # type: ignore[arg-type]
