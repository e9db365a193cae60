"""Crash points: each one named in the code is a known name and each known name is placed
somewhere, and an environment that arms an unknown point (a typo) fails loudly instead of
never firing, which let a crash test pass having crashed nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lakestream.failpoints import NAMES, failpoint

ROOT = Path(__file__).resolve().parents[1]


def test_every_placed_point_is_known_and_every_known_point_is_placed() -> None:
    placed = set()
    for folder in ("lakestream", "producers", "loaders"):
        for path in (ROOT / folder).rglob("*.py"):
            placed |= set(re.findall(r'\bfailpoint\("(\w+)"\)', path.read_text()))
    assert placed == set(NAMES)


@pytest.mark.parametrize("armed", ["before_comit", "after_commit@0", "after_commit@x"])
def test_arming_a_point_that_does_not_exist_fails_loudly(monkeypatch, armed: str) -> None:
    monkeypatch.setenv("LAKESTREAM_FAILPOINT", armed)
    with pytest.raises(ValueError, match="arms no crash point: use one of before_upload"):
        failpoint("before_commit")


def test_a_point_armed_for_a_later_hit_passes_the_earlier_ones(monkeypatch) -> None:
    monkeypatch.setenv("LAKESTREAM_FAILPOINT", "during_gc@1000000")
    for _ in range(3):
        failpoint("during_gc")  # not killed: the millionth hit is far off
    failpoint("after_commit")  # another point: nothing
