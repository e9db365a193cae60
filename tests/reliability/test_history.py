"""The history checker finds what it is there to find (a checker that cannot fail is no
check): lost acknowledged writes, duplicates, failed writes that appear, disagreeing or
backward readers."""

from __future__ import annotations

import lakestream
from tests.helpers import SCHEMA, rows
from tests.reliability.history import History, check


def _stream(tmp_path, *chunks: tuple[int, int]) -> str:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    for start, n in chunks:
        s.append(rows(start, n))
    return uri


def test_a_consistent_history_passes(tmp_path) -> None:
    uri = _stream(tmp_path, (0, 4), (4, 4))
    h = History()
    h.invoke("a", [0, 1, 2, 3])
    h.invoke("a", [4, 5, 6, 7])
    h.settle("a", "ok")
    h.read("r", 0, 1, 2, [2, 3])
    h.read("r", 1, 0, 1, [4, 5, 6, 7])
    verdict = check(h, uri)
    assert verdict.violations == [] and verdict.committed == 8 and verdict.acknowledged == 2


def test_each_kind_of_violation_is_reported(tmp_path) -> None:
    uri = _stream(tmp_path, (0, 4), (0, 4), (8, 4))  # ids 0..3 twice
    h = History()
    h.invoke("a", [0, 1, 2, 3])
    h.invoke("a", [4, 5, 6, 7])  # acknowledged, never committed: lost
    h.settle("a", "ok")
    h.invoke("b", [8, 9, 10, 11])
    h.settle("b", "failed")  # reported failed, yet committed
    h.read("r", 2, 0, 1, [8, 9, 10, 99])  # disagrees with the stream
    h.read("r", 1, 0, 1, [0, 1, 2, 3])  # went back
    problems = "\n".join(check(h, uri).violations)
    for expected in ("more than once", "acknowledged write of a lost", "failed write of b",
                     "read step 2 rank 0/1", "went back from step 2 to 1"):
        assert expected in problems, (expected, problems)
