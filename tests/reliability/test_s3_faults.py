"""Producers and a reader through injected S3 faults: the history stays consistent."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

import lakestream
from lakestream.errors import LakestreamError
from lakestream.producers import Producer, ProducerOptions
from tests.conftest import BUCKET, SOAK, seeds
from tests.helpers import SCHEMA, rows
from tests.reliability.faults import FaultInjector
from tests.reliability.history import History, check

B, GROUP = 8, 4
GROUPS = 80 if SOAK else 30
PRODUCERS = 3


def _produce(uri: str, options: dict[str, str], pid: int, history: History,
             faults: FaultInjector, deadline: float) -> None:
    """Writes groups ``pid, pid + PRODUCERS, ...`` with a cursor in the committed state,
    reopening after any failure, as a supervisor would restart a crashed worker."""
    while time.monotonic() < deadline:
        try:
            p = Producer(uri, f"w{pid}", storage_options=options,
                         options=ProducerOptions(max_interval_s=0.2))
        except LakestreamError:
            continue  # the fence itself met a fault: try again
        faults.attach(p.stream.store.client)  # type: ignore[attr-defined]
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


def _read(uri: str, options: dict[str, str], history: History, faults: FaultInjector,
          stop: threading.Event) -> None:
    s = lakestream.open(uri, options)
    faults.attach(s.store.client)  # type: ignore[attr-defined]
    step = 0
    while not stop.is_set() or step < s.num_steps:
        try:
            s.refresh()
            if step >= s.num_steps:
                time.sleep(0.02)
                continue
            for rank in range(2):
                ids = s.read_step(step, rank=rank, world_size=2).column("id").to_pylist()
                history.read("reader", step, rank, 2, ids)
            step += 1
        except LakestreamError:
            continue  # a read met a fault after the store's retries: read it again


@pytest.mark.parametrize("rate", [0.01, 0.05, 0.2])
@pytest.mark.parametrize("seed", seeds(1, 10))
def test_faults_lose_and_duplicate_nothing(s3_options: dict[str, str], rate: float, seed: int,
                                           tally: Counter[str]) -> None:
    uri = f"s3://{BUCKET}/faults-{rate}-{seed}-{time.time_ns()}"
    lakestream.create(uri, SCHEMA, global_batch_size=B, group_size=GROUP,
                      storage_options=s3_options)
    faults = FaultInjector(rate, seed)
    history = History()
    stop = threading.Event()
    reader = threading.Thread(target=_read, args=(uri, s3_options, history, faults, stop))
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
    stop.set()
    reader.join(timeout=60)
    verdict = check(history, uri, s3_options)
    assert verdict.violations == [], verdict.violations
    assert verdict.committed == PRODUCERS * GROUPS * GROUP
    assert len(history.reads) == 2 * PRODUCERS * GROUPS * GROUP // B
    tally["s3_faults_injected"] += faults.injected
    for kind, n in faults.counts.items():
        tally[f"s3_faults_injected.{kind}"] += n
    tally["s3_fault_runs"] += 1
    tally["samples_checked"] += verdict.committed
    tally["lost"] += verdict.lost
    tally["duplicated"] += verdict.duplicated
    assert faults.injected >= rate * 200, faults.counts  # the faults did happen
