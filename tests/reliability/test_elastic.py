"""The elastic resume matrix: stop a run of world size W1 at step k, resume with world size
W2 from the saved state, and the steps read equal those of an uninterrupted run, for every
pair of world sizes dividing B = 24, interrupt points 0, 1, the middle and the end, with
0 or 2 DataLoader workers. ``make soak`` runs every combination; ``make test`` every pair at
one of the points (each point meeting every world size), and a few pairs with workers at
two points each."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

import lakestream
from tests.conftest import SOAK
from tests.helpers import SCHEMA, read_ranks, rows

B, STEPS = 24, 6
WORLDS = [1, 2, 3, 4, 6, 8, 12]
POINTS = [0, 1, STEPS // 2, STEPS]


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    u = str(tmp_path_factory.mktemp("elastic") / "s")
    s = lakestream.create(u, SCHEMA, global_batch_size=B)
    for k in range(STEPS * 3):
        s.append(rows(8 * k, 8))  # fragments that straddle rank slices
    return u


def _read(uri: str, world: int, workers: int, state: dict[str, Any] | None,
          stop: int) -> tuple[list[list[int]], dict[str, Any]]:
    return read_ranks(uri, world, state=state, stop=stop, workers=workers)


def _cases() -> list[tuple[int, int, int, int]]:
    pairs = list(itertools.product(WORLDS, WORLDS))
    if SOAK:
        return [(a, b, k, w) for a, b in pairs for k in POINTS for w in (0, 2)]
    # Every pair at one of the points, taken in turn so that each point meets every world
    # size (49 pairs over 4 points); with workers, a few small pairs at two points each (a
    # rank's loader with two workers costs ~0.4 s: the pairs of 12 ranks took 6 s each).
    with_workers = [(2, 3), (4, 1), (1, 4), (3, 2)]
    return [(a, b, POINTS[i % len(POINTS)], 0) for i, (a, b) in enumerate(pairs)] + [
        (a, b, POINTS[(i + j) % len(POINTS)], 2)
        for i, (a, b) in enumerate(with_workers) for j in (0, 2)]


def test_every_elastic_resume_equals_the_uninterrupted_run(uri, tally: Counter[str]) -> None:
    whole, _ = _read(uri, 1, 0, None, STEPS)
    assert len(whole) == STEPS and sorted(sum(whole, [])) == list(range(B * STEPS))
    mismatches = []
    cases = _cases()
    for before, after, k, workers in cases:
        head, state = _read(uri, before, workers, None, k)
        assert state["next_step"] == k
        tail, _ = _read(uri, after, workers, state, STEPS)
        if head + tail != whole:
            mismatches.append((before, after, k, workers))
    tally["elastic_cases"] += len(cases)
    tally["elastic_mismatches"] += len(mismatches)
    assert mismatches == []
