"""Producers and a reader through S3 faults injected on the wire: the history stays
consistent."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

import lakestream
from lakestream.errors import LakestreamError
from lakestream.producers import Producer, ProducerOptions
from tests.conftest import BUCKET, SOAK, seeds
from tests.faultproxy import FaultProxy, RandomFaults
from tests.helpers import SCHEMA, rows
from tests.reliability.history import History, check

B, GROUP = 8, 4
GROUPS = 80 if SOAK else 30
PRODUCERS = 3


def _produce(uri: str, options: dict[str, str], pid: int, history: History,
             faults: FaultProxy, deadline: float) -> None:
    """Writes groups ``pid, pid + PRODUCERS, ...`` with a cursor in the committed state,
    reopening after any failure, as a supervisor would restart a crashed worker."""
    while time.monotonic() < deadline:
        try:
            p = Producer(uri, f"w{pid}", storage_options=options,
                         options=ProducerOptions(max_interval_s=0.2))
        except LakestreamError:
            continue  # the fence itself met a fault: try again
        try:
            cursor = p.state["next"] if p.state else 0
            while cursor < GROUPS:
                g = pid + PRODUCERS * cursor
                history.invoke(f"w{pid}", list(range(g * GROUP, g * GROUP + GROUP)))
                p.write(rows(g * GROUP, GROUP), state={"next": cursor + 1})
                cursor += 1
                if cursor % 5 == 0:
                    p.flush()
                    history.settle(f"w{pid}", "ok")
            p.close()
            history.settle(f"w{pid}", "ok")
            return
        except LakestreamError:
            history.settle(f"w{pid}", "unknown")
            p.abort()
    raise AssertionError(f"producer w{pid} did not finish before the deadline")


class _Until:
    """How far the reader must read: unknown while producers run; then the steps committed,
    and a deadline by which it gives up (the test then fails on what it read)."""

    def __init__(self) -> None:
        self.deadline = float("inf")
        self.steps: int | None = None

    def set(self, steps: int, within_s: float) -> None:
        self.deadline = time.monotonic() + within_s
        self.steps = steps


def _read(uri: str, options: dict[str, str], history: History, faults: FaultProxy,
          until: _Until) -> None:
    """Reads every step in order, both ranks, as steps appear, until it has read
    ``until.steps`` of them: told to stop only once that number is known, never sooner."""
    s = lakestream.open(uri, storage_options=options)
    step = 0
    while until.steps is None or step < until.steps:
        if time.monotonic() > until.deadline:
            return
        try:
            s.refresh()
            if step >= s.num_steps:
                time.sleep(0.02)
                continue
            parts = [s.read_step(step, rank=rank, world_size=2).column("id").to_pylist()
                     for rank in range(2)]
        except LakestreamError:
            continue  # a read met a fault after the store's retries: read the step again
        for rank, ids in enumerate(parts):  # recorded once, when both ranks read it
            history.read("reader", step, rank, 2, ids)
        step += 1


@pytest.mark.parametrize("rate", [0.01, 0.05, 0.2])
@pytest.mark.parametrize("seed", seeds(1, 10))
def test_faults_lose_and_duplicate_nothing(s3_endpoint: str, s3_options: dict[str, str],
                                           rate: float, seed: int,
                                           tally: Counter[str]) -> None:
    uri = f"s3://{BUCKET}/faults-{rate}-{seed}-{time.time_ns()}"
    lakestream.create(uri, SCHEMA, global_batch_size=B, group_size=GROUP,
                      storage_options=s3_options)
    with FaultProxy(s3_endpoint, RandomFaults(rate, seed)) as faults:
        _run(uri, faults, rate, tally, s3_options)


def _run(uri: str, faults: FaultProxy, rate: float, tally: Counter[str],
         direct: dict[str, str]) -> None:
    s3_options = faults.options(direct)
    history = History()
    until = _Until()
    reader = threading.Thread(target=_read, args=(uri, s3_options, history, faults, until),
                              daemon=True)
    reader.start()
    deadline = time.monotonic() + 240
    workers = [threading.Thread(target=_produce,
                                args=(uri, s3_options, k, history, faults, deadline))
               for k in range(PRODUCERS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    faults.enabled = False
    steps = lakestream.open(uri, storage_options=direct).num_steps
    assert steps == PRODUCERS * GROUPS * GROUP // B
    until.set(steps, within_s=180)  # generous: only a stuck reader takes this long
    reader.join(timeout=240)
    assert not reader.is_alive(), "the reader is stuck in a store call"
    read = len(history.reads) // 2
    assert len(history.reads) == 2 * steps, f"the reader read {read} of {steps} steps in 180 s"
    verdict = check(history, uri, direct)
    assert verdict.violations == [], verdict.violations
    assert verdict.committed == PRODUCERS * GROUPS * GROUP
    tally["s3_faults_injected"] += faults.injected
    for kind, n in faults.counts.items():
        tally[f"s3_faults_injected.{kind}"] += n
    tally["s3_fault_runs"] += 1
    tally["samples_checked"] += verdict.committed
    tally["lost"] += verdict.lost
    tally["duplicated"] += verdict.duplicated
    assert faults.injected >= rate * 200, faults.counts  # the faults did happen
