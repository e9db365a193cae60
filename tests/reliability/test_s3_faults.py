"""Producers and a reader through S3 faults injected on the wire: the history stays
consistent."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

import lakestream
from lakestream.errors import LakestreamError
from lakestream.ops.verify import verify
from lakestream.producers import Producer, ProducerOptions
from lakestream.store import open_store
from tests.conftest import BUCKET, SOAK, seeds
from tests.faultproxy import FaultProxy, RandomFaults
from tests.helpers import SCHEMA, rows
from tests.reliability.history import History, check

B, GROUP = 8, 4
GROUPS = 80 if SOAK else 30
PRODUCERS = 3
GRACE_S = 1.0
"""gc runs all along with this grace, so that the log is compacted under producers and
readers whose handles are older than it (a second stands for the default hour)."""
IDLE_S = 2.5
"""How long producers pause now and then, and the slow reader between its bursts: past the
grace, so their views are older than the log gc keeps."""


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
                if cursor % 12 == pid:  # idle past the grace: gc compacts under this view
                    time.sleep(IDLE_S)
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
          until: _Until, name: str = "reader", pause_s: float = 0.02) -> None:
    """Reads every step in order, both ranks, as steps appear, until it has read
    ``until.steps`` of them: told to stop only once that number is known, never sooner.
    Once it has read what it saw, it waits ``pause_s`` before looking again."""
    s = None
    while s is None:  # opening meets faults too: a reader opens again, as it reads again
        if time.monotonic() > until.deadline:
            return
        try:
            s = lakestream.open(uri, storage_options=options)
        except LakestreamError:
            time.sleep(pause_s)
    step = 0
    while until.steps is None or step < until.steps:
        if time.monotonic() > until.deadline:
            return
        try:
            if step >= s.num_steps:
                s.refresh()
            if step >= s.num_steps:
                time.sleep(pause_s)
                continue
            parts = [s.read_step(step, rank=rank, world_size=2).column("id").to_pylist()
                     for rank in range(2)]
        except LakestreamError:
            continue  # a read met a fault after the store's retries: read the step again
        for rank, ids in enumerate(parts):  # recorded once, when both ranks read it
            history.read(name, step, rank, 2, ids)
        step += 1


def _collect(uri: str, options: dict[str, str], stop: threading.Event,
             compacted: list[int]) -> None:
    """gc with a short grace, again and again, beside the producers and readers (not
    through the faults: what is tested is the log compacted under their handles)."""
    while not stop.wait(0.5):
        try:
            compacted.append(lakestream.open(uri, storage_options=options)
                             .gc(grace_seconds=GRACE_S).log_entries)
        except LakestreamError:
            continue  # met a fault: the next round tries again


@pytest.mark.parametrize("rate", [0.01, 0.05, 0.2] if SOAK else [0.05, 0.2])
@pytest.mark.parametrize("seed", seeds(1, 10))
def test_faults_lose_and_duplicate_nothing(s3_endpoint: str, s3_options: dict[str, str],
                                           rate: float, seed: int,
                                           tally: Counter[str]) -> None:
    uri = f"s3://{BUCKET}/faults-{rate}-{seed}-{time.time_ns()}"
    # gc compacts below the older of the two newest snapshots it reads whole, and at 20% of
    # requests failing many snapshot writes fail: snapshots every 5 versions keep two near.
    lakestream.create(uri, SCHEMA, global_batch_size=B, group_size=GROUP,
                      storage_options=s3_options, snapshot_interval=5)
    with FaultProxy(s3_endpoint, RandomFaults(rate, seed)) as faults:
        _run(uri, faults, rate, tally, s3_options)


def _run(uri: str, faults: FaultProxy, rate: float, tally: Counter[str],
         direct: dict[str, str]) -> None:
    s3_options = faults.options(direct)
    history = History()
    until = _Until()
    readers = [threading.Thread(target=_read, args=(uri, s3_options, history, faults, until,
                                                    name, pause), daemon=True)
               for name, pause in (("reader", 0.02), ("slow", IDLE_S))]
    for reader in readers:
        reader.start()
    stop, compacted = threading.Event(), []
    gc = threading.Thread(target=_collect, args=(uri, direct, stop, compacted), daemon=True)
    gc.start()
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
    for reader in readers:
        reader.join(timeout=240)
        assert not reader.is_alive(), "a reader is stuck in a store call"
    stop.set()
    gc.join(timeout=120)
    read = len(history.reads) // 4
    assert len(history.reads) == 4 * steps, f"the readers read {read} of {steps} steps"
    assert sum(compacted) > 0, "gc compacted nothing while they ran"
    verdict = check(history, uri, direct)
    assert not verify(open_store(uri, direct)).problems
    assert verdict.violations == [], verdict.violations
    assert verdict.committed == PRODUCERS * GROUPS * GROUP
    tally["s3_faults_injected"] += faults.injected
    for kind, n in faults.counts.items():
        tally[f"s3_faults_injected.{kind}"] += n
    tally["s3_fault_runs"] += 1
    tally["log_entries_compacted_under_live_handles"] += sum(compacted)
    tally["samples_checked"] += verdict.committed
    tally["lost"] += verdict.lost
    tally["duplicated"] += verdict.duplicated
    assert faults.injected >= rate * 200, faults.counts  # the faults did happen
