"""Racing writers: gapless versions and every appended row exactly once."""

from __future__ import annotations

import multiprocessing
import threading
import time

import lakestream
from lakestream.errors import NotFoundError
from lakestream.log import Fence, log_key
from tests.helpers import SCHEMA, delta_ids, ids, rows

WRITERS, APPENDS, ROWS = 4, 8, 2


def _append_many(uri: str, options: dict[str, str] | None, writer: int) -> None:
    s = lakestream.open(uri, options)
    for k in range(APPENDS):
        s.append(rows(1000 * writer + ROWS * k, ROWS))


def _check(uri: str, options: dict[str, str] | None) -> None:
    s = lakestream.open(uri, options)
    total = WRITERS * APPENDS
    assert s.version == total
    for v in range(total + 1):
        s.store.head(log_key(v))  # gapless: every version exists ...
    try:
        s.store.head(log_key(total + 1))
        raise AssertionError("a version past the last commit exists")
    except NotFoundError:
        pass  # ... and nothing after the last
    expected = sorted(1000 * w + i for w in range(WRITERS) for i in range(APPENDS * ROWS))
    got = sorted(i for step in range(s.num_steps) for i in ids(s.read_step(step)))
    assert got == expected
    assert delta_ids(uri, options) == expected


def test_threads_race_to_append(backend) -> None:
    uri = backend.uri()
    lakestream.create(uri, SCHEMA, global_batch_size=2, storage_options=backend.options)
    threads = [threading.Thread(target=_append_many, args=(uri, backend.options, w))
               for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _check(uri, backend.options)


def test_processes_race_to_append(backend) -> None:
    uri = backend.uri()
    lakestream.create(uri, SCHEMA, global_batch_size=2, storage_options=backend.options)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(uri, backend.options, w))
             for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    _check(uri, backend.options)


def test_a_committer_behind_a_busy_writer_gets_through_in_few_attempts(tmp_path) -> None:
    """Regression: after a lost race the commit loop caught up with the head and then slept
    its backoff, so the view it built its next put on was stale again and it lost again -
    40 races in a row behind writers committing every few milliseconds."""
    from lakestream.log import Checkpoint, Fence

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=2)
    s.append(rows(0, 2))
    busy = lakestream.open(s.uri)
    stop = threading.Event()

    def hammer() -> None:
        e = 0
        while not stop.is_set():
            e += 1
            busy.commit(lambda _s, cid, e=e: Fence("busy", e, cid))
            time.sleep(0.003)

    t = threading.Thread(target=hammer)
    t.start()
    me = lakestream.open(s.uri)
    try:
        conflicts = []
        for _ in range(20):
            time.sleep(0.02)  # let the busy writer move the head past our view
            result = me.commit(lambda _s, cid: Checkpoint("train", 0, None, cid))
            assert result is not None
            conflicts.append(result.conflicts)
    finally:
        stop.set()
        t.join()
    assert max(conflicts) <= 8 and sum(conflicts) / len(conflicts) <= 2, conflicts


def test_the_commit_window_leaves_out_catching_up(tmp_path) -> None:
    # Regression: the DAC controller read a commit's whole latency as its exposure to races.
    # A producer that had waited long spent long catching up, so its next wait grew, until
    # it sat at the cap (the log-growth run lost half its throughput to that spiral).
    uri = str(tmp_path / "s")
    ahead = lakestream.create(uri, SCHEMA, global_batch_size=2)
    behind = lakestream.open(uri)
    for epoch in range(1, 401):
        ahead.commit(lambda _s, cid, e=epoch: Fence("busy", e, cid))
    result = behind.commit(lambda _s, cid: Fence("late", 1, cid), catch_up=True)
    assert result is not None and result.version == 401 and result.attempts == 1
    assert result.window_s < result.latency_s / 5, (result.window_s, result.latency_s)


def test_a_producer_far_behind_catches_up_in_parallel(tmp_path) -> None:
    # Regression: catching up read one entry per request. A producer 150 versions behind on
    # a loaded endpoint spent 9 s in one commit chasing a head that another producer moved
    # as fast as it read; with 10 ms requests, 300 entries one by one take at least 3 s.
    from lakestream.snapshot import read_tail

    uri = str(tmp_path / "s")
    ahead = lakestream.create(uri, SCHEMA, global_batch_size=2, snapshot_interval=100_000)
    behind = lakestream.open(uri)
    for epoch in range(1, 301):
        ahead.commit(lambda _s, cid, e=epoch: Fence("busy", e, cid))
    state = behind._state
    t0 = time.monotonic()
    read_tail(_Slow(behind.store, 0.01), state)  # type: ignore[arg-type]
    assert state.version == 300
    assert time.monotonic() - t0 < 1.5


class _Slow:
    """Every store request takes ``delay_s`` longer, as on a remote object store."""

    def __init__(self, inner: object, delay_s: float) -> None:
        self._inner, self._delay_s = inner, delay_s

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._inner, name)
        if name not in ("put", "get", "get_range", "head", "list", "delete"):
            return attr

        def slowed(*args: object, **kwargs: object) -> object:
            time.sleep(self._delay_s)
            return attr(*args, **kwargs)

        return slowed


def test_no_producer_captures_the_log(tmp_path) -> None:
    # Regression: a producer put its next entry the moment its last one landed. A rival that
    # lost a race needs two requests before it can put again, so it lost every race; the
    # winner saw no rival commits, read that as low load, dropped its interval to zero and
    # starved the others (one of three producers committed 2% of the fragments).
    from lakestream.producers import Producer

    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=8, group_size=4)
    producers = [Producer(uri, f"w{k}") for k in range(3)]
    for p in producers:
        p.stream.store = _Slow(p.stream.store, 0.01)  # type: ignore[assignment]
    stop = time.monotonic() + 3.0

    def write(p: Producer, k: int) -> None:
        i = 0
        while time.monotonic() < stop:
            p.write(rows(10_000_000 * k + 4 * i, 4))
            i += 1

    threads = [threading.Thread(target=write, args=(p, k)) for k, p in enumerate(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shares = [p.stats.fragments_committed for p in producers]
    for p in producers:
        p.abort()
    assert min(shares) >= 0.15 * sum(shares), shares
