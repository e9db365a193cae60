"""The canary for the S3 server under the suite: racing creates of one key from several
processes have exactly one winner, and the object holds the winner's bytes. Everything
Lakestream promises rests on this (SeaweedFS made conditional writes atomic in 4.18)."""

from __future__ import annotations

import multiprocessing as mp
import uuid
from typing import Any

from lakestream.errors import AlreadyExistsError
from lakestream.store import open_store
from tests.conftest import BUCKET

KEYS, PROCS = 120, 4


def _race(uri: str, options: dict[str, str], me: int, barrier: Any, out: Any) -> None:
    store = open_store(uri, options)
    won = []
    barrier.wait(60)
    for k in range(KEYS):
        try:
            store.put(f"race/{k}", f"{me}".encode(), mode="create")
            won.append(k)
        except AlreadyExistsError:
            pass
    out.put((me, won))


def test_racing_creates_have_exactly_one_winner(s3_options: dict[str, str]) -> None:
    uri = f"s3://{BUCKET}/canary-{uuid.uuid4().hex[:8]}"
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(PROCS), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(uri, s3_options, me, barrier, out))
             for me in range(PROCS)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    winners: dict[int, list[int]] = {}
    for me, won in results.items():
        for k in won:
            winners.setdefault(k, []).append(me)
    assert sorted(winners) == list(range(KEYS)), "some key has no winner"
    doubles = {k: w for k, w in winners.items() if len(w) > 1}
    assert doubles == {}, f"keys with more than one winner: {doubles}"
    store = open_store(uri, s3_options)
    assert all(store.get(f"race/{k}") == str(w[0]).encode() for k, w in winners.items())
    assert len({me for w in winners.values() for me in w}) > 1  # the races were real
