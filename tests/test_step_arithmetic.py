"""The stream's step arithmetic (``StreamMeta.offset``, ``step_of``, ``first_whole_step``)
seen from every side at once: on streams of random batch and group sizes, fragments and
retention, the command line, ``status``, the readers (``read_step``, ``StreamDataset``,
``lineage``) and retention agree on the steps there are, the first one retained, and what
each group holds."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lakestream
from lakestream.errors import StepNotAvailableError
from lakestream.loaders import StreamDataset
from lakestream.ops.cli import main
from lakestream.ops.status import status
from tests.helpers import SCHEMA, ids, rows


@dataclass(frozen=True)
class Case:
    group: int
    batch: int
    fragments: list[int]
    markers: list[int]
    keep_last: int


@st.composite
def streams(draw: st.DrawFn) -> Case:
    group = draw(st.sampled_from([1, 2, 3]))
    batch = group * draw(st.integers(1, 4))
    fragments = draw(st.lists(st.integers(1, 5).map(lambda n: n * group), min_size=1,
                              max_size=12))
    markers = draw(st.lists(st.integers(0, sum(fragments) // batch), max_size=3))
    return Case(group, batch, fragments, markers, draw(st.integers(1, 2)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=streams())
def test_every_side_agrees_on_the_steps(case: Case) -> None:
    with tempfile.TemporaryDirectory() as root:
        _check(f"{root}/s", case)


def _check(uri: str, case: Case) -> None:
    b = case.batch
    s = lakestream.create(uri, SCHEMA, global_batch_size=b, group_size=case.group)
    offset = 0
    for n in case.fragments:
        s.append(rows(offset, n))
        offset += n
    for step in case.markers:
        s.mark_checkpoint("train", step)
    s.retain(keep_last=case.keep_last)
    s.refresh()
    meta, state = s.state.stream_meta, s.state
    steps, first = offset // b, -(-state.reclaimed_below // b)  # the arithmetic, by hand
    assert (s.num_steps, state.first_retained_step, s.undelivered_samples) == \
        (steps, first, offset - steps * b)
    assert all(meta.offset(meta.step_of(o)) <= o < meta.offset(meta.step_of(o) + 1)
               for o in range(offset))
    # status, in Python and on the command line, says the same.
    info = status(s)
    assert (info["num_steps"], info["reclaimed_below_step"]) == (steps, first)
    held = s.group_holds(keep_last=case.keep_last)
    for name, group in info["groups"].items():
        assert group["holds_from_step"] == (max(held[name], first) if name in held else None)
    # Retention never reclaimed what a kept marker resumes at.
    assert all(first <= h for h in held.values())
    # The readers: every step from the first retained on reads its own offsets, the one
    # before it is gone, and a dataset starting there reads the same.
    for step in range(first, steps):
        assert ids(s.read_step(step)) == list(range(step * b, step * b + b))
        assert s.lineage(step).offsets == (step * b, step * b + b)
    if first:
        with pytest.raises(StepNotAvailableError):
            s.read_step(first - 1)
        assert s.lineage(first - 1).reclaimed
    if first < steps:
        ds = StreamDataset(uri, group=None, rank=0, world_size=1, start_step=first,
                           max_steps=steps, timeout=5)
        assert [int(x["step"]) for x in ds] == list(range(first, steps))


def test_the_command_line_says_what_status_says(tmp_path, capsys) -> None:
    uri = str(tmp_path / "s")
    _check(uri, Case(group=2, batch=6, fragments=[4, 2, 6, 4, 2, 4], markers=[2, 3],
                     keep_last=1))
    assert main(["status", uri, "--json", "--keep-last", "1"]) == 0
    said = json.loads(capsys.readouterr().out)
    s = lakestream.open(uri)
    assert (said["num_steps"], said["reclaimed_below_step"]) == (s.num_steps, 3)
    assert said["groups"]["train"]["holds_from_step"] == 3 == s.state.first_retained_step
