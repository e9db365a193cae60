"""A mix's positions as each source's own steps (``stream_steps``): what registration,
markers and progress are counted in; and the fragments its steps share, fetched and decoded
once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

import lakestream
from lakestream.log.entries import StreamMeta
from lakestream.read.steps import MixSteps, Source, Steps, mix_steps, stream_steps
from tests.helpers import SCHEMA, count_reads, rows


@dataclass
class _Shape:
    global_batch_size: int

    @property
    def meta(self) -> StreamMeta:
        return StreamMeta(SCHEMA, self.global_batch_size, 1)


def test_an_offset_is_the_step_of_its_own_stream_that_holds_it() -> None:
    streams = [_Shape(4), _Shape(6)]
    assert stream_steps([0, 0], streams) == [0, 0]  # type: ignore[arg-type]
    assert stream_steps([3, 6], streams) == [0, 1]  # type: ignore[arg-type]
    assert stream_steps([4, 11], streams) == [1, 1]  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        stream_steps([4], streams)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["log order", "mix", "shuffled mix"])
def test_each_fragment_is_fetched_and_decoded_once_however_many_steps_draw_on_it(
        tmp_path: Any, kind: str) -> None:
    # Single-sample groups written 64 to a fragment (a producer's flush), read 45 + 15 a
    # step: a fragment holds more than a step takes of it, and a shuffled step draws on
    # every fragment of its window (10 steps). One of b's fragments ends two samples into
    # its second window, which the first step of that window does not draw on (seed 3).
    a = lakestream.create(str(tmp_path / "a"), SCHEMA, global_batch_size=45)
    b = lakestream.create(str(tmp_path / "b"), SCHEMA, global_batch_size=15)
    plain = lakestream.create(str(tmp_path / "plain"), SCHEMA, global_batch_size=60)
    for stream, sizes, first in ((a, [64] * 15, 0), (b, [100, 52, 64, 64, 64], 10_000)):
        for n in sizes:
            stream.append(rows(first, n))
            plain.append(rows(first, n))
            first += n
    steps: Steps
    if kind == "log order":
        steps = MixSteps.single(lakestream.open(plain.uri))
    else:
        steps = mix_steps([Source(a.uri, 45), Source(b.uri, 15)],
                          [lakestream.open(a.uri), lakestream.open(b.uri)],
                          shuffle_window=10 if kind == "shuffled mix" else None, seed=3,
                          keyed=False)
    with count_reads() as (gets, decoded):
        ids = [i for step in range(20)  # two windows
               for i in steps.read(step, 0, 1, ["id"]).column("id").to_pylist()]
    a_read = 900 if kind != "log order" else 960  # in log order, all of a, then b
    assert sorted(ids) == list(range(a_read)) + list(range(10_000, 10_000 + 1200 - a_read))
    assert set(gets.values()) == {1}, "a fragment fetched more than once"
    assert decoded[0] == len(gets)  # one row group each, decoded once
