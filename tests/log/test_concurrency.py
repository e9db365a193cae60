"""Racing writers: gapless versions and every appended row exactly once."""

from __future__ import annotations

import multiprocessing
import threading
import time

import lakestream
from lakestream.errors import NotFoundError
from lakestream.log.entries import Fence
from lakestream.log.keys import log_key, log_version
from tests.helpers import SCHEMA, HookedStore, delta_ids, ids, rows

WRITERS, APPENDS, ROWS = 4, 8, 2


def _append_many(uri: str, options: dict[str, str] | None, writer: int) -> None:
    s = lakestream.open(uri, storage_options=options)
    for k in range(APPENDS):
        s.append(rows(1000 * writer + ROWS * k, ROWS))


def _check(uri: str, options: dict[str, str] | None) -> None:
    s = lakestream.open(uri, storage_options=options)
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


def test_a_committer_behind_a_busy_writer_gets_through_in_few_attempts(tmp_path,
                                                                        monkeypatch) -> None:
    """Regression: after a lost race the commit loop caught up with the head and then slept
    its backoff, so the view it built its next put on was stale again and it lost again -
    40 races in a row behind writers committing every few milliseconds.

    The busy writer here commits exactly when the committer backs off, so the head always
    moves during the sleep: the loop must lose the one race its stale view sets up and no
    other, whatever the scheduling."""
    import types

    import lakestream.log.transaction
    from lakestream.log.entries import Checkpoint, Fence
    from lakestream.log.outcomes import CommitOptions

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=2)
    s.append(rows(0, 2))
    busy, me = lakestream.open(s.uri), lakestream.open(s.uri)
    epochs = iter(range(1, 1_000_000))
    backoffs: list[float] = []

    def busy_commits() -> None:  # catches up first: alone on this thread, it never races
        e = next(epochs)
        assert busy.commit(lambda _s, cid: Fence("busy", e, cid), catch_up=True) is not None

    def sleep(seconds: float) -> None:  # the committer's backoff
        backoffs.append(seconds)
        busy_commits()
        busy_commits()

    clock = types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep)
    monkeypatch.setattr(lakestream.log.transaction, "time", clock)
    conflicts = []
    for _ in range(20):
        busy_commits()  # the head moves past our view
        result = me.commit(lambda _s, cid: Checkpoint("train", 0, None, cid),
                           CommitOptions(max_attempts=5))
        assert result is not None
        conflicts.append(result.conflicts)
    assert conflicts == [1] * 20 and len(backoffs) == 20, (conflicts, backoffs)
    assert me.version == 1 + 60 + 20  # the append, the busy writer's, ours


def test_the_commit_window_leaves_out_catching_up(tmp_path) -> None:
    # Regression: the DAC controller read a commit's whole latency as its exposure to races.
    # A producer that had waited long spent long catching up, so its next wait grew, until
    # it sat at the cap (the log-growth run lost half its throughput to that spiral).
    uri = str(tmp_path / "s")
    ahead = lakestream.create(uri, SCHEMA, global_batch_size=2)
    behind = lakestream.open(uri)
    for epoch in range(1, 401):
        ahead.commit(lambda _s, cid, e=epoch: Fence("busy", e, cid))
    timed = _Timed(behind.store)
    behind.store = behind._view.store = timed  # type: ignore[assignment]
    result = behind.commit(lambda _s, cid: Fence("late", 1, cid), catch_up=True)
    assert result is not None and result.version == 401 and result.attempts == 1
    put = min((r for r in timed.requests if r[0] == "put"), key=lambda r: r[1])
    reads = [r for r in timed.requests if r[0] == "get" and r[2] <= put[1]]
    assert len(reads) >= 400  # it did catch up, before its put
    # The window's clock starts when catching up begins its last round of reads, so every
    # read of an earlier round ended before it. ``opened`` is no later than that start (the
    # clock that ends the window is read after the put returns). Reads slower than
    # SLOW_ROUND_S go in parallel rounds of up to TAIL_WIDTH, so which reads share the last
    # round depends on the machine's load: a quarter of them bounds it either way, where a
    # window counting all of catching up would hold every read.
    opened = put[2] - result.window_s
    inside = [r for r in reads if r[2] > opened]
    assert len(inside) <= len(reads) // 4, (result, len(inside), len(reads))
    assert result.window_s < result.latency_s / 4, result


def test_catching_up_stops_at_the_head_without_waiting_for_reads_past_it(tmp_path) -> None:
    # Regression: a round of parallel reads waited for every read in it, those past the
    # head included, so the state went stale while they finished and the commit's exposure
    # to races outgrew the window the controller saw.
    from lakestream.log.tail import catch_up

    uri = str(tmp_path / "s")
    ahead = lakestream.create(uri, SCHEMA, global_batch_size=2, snapshot_interval=100_000)
    behind = lakestream.open(uri)
    for epoch in range(1, 41):
        ahead.commit(lambda _s, cid, e=epoch: Fence("busy", e, cid))
    release, lock, waiting = threading.Event(), threading.Lock(), [0]

    def stuck_past_head(op: str, key: str, phase: str) -> None:
        # GETs up to version 41 (the first absent one) take 5 ms; those past it hang until
        # released.
        if op != "get" or phase != "before":
            return
        if log_version(key) <= 41:
            time.sleep(0.005)
            return
        with lock:
            waiting[0] += 1
        release.wait(10)
        with lock:
            waiting[0] -= 1

    try:
        state = behind._view.state
        t0 = time.monotonic()
        catch_up(HookedStore(behind.store, stuck_past_head), state)  # type: ignore[arg-type]
        assert state.version == 40
        assert waiting[0] > 0  # it returned while reads past the head still hung
        assert time.monotonic() - t0 < 5  # well before any of them was released
    finally:
        release.set()


def test_a_catch_up_told_what_is_due_reads_little_past_the_head(tmp_path) -> None:
    """Regression: a reader's catch-up on a remote store sent up to 15 reads past the head
    at once (the doubling rounds of one far behind), each a billed request that finds
    nothing. Told how many versions are due (``SharedHead.due``), it reads most of them at
    once and past them one at a time: one read past the head where 39 were due, against
    several without."""
    from lakestream.log.tail import catch_up

    uri = str(tmp_path / "s")
    ahead = lakestream.create(uri, SCHEMA, global_batch_size=2, snapshot_interval=100_000)
    behind = lakestream.open(uri)._view.state
    for epoch in range(1, 41):
        ahead.commit(lambda _s, cid, e=epoch: Fence("busy", e, cid))
    head = ahead._view.state.version
    past: list[int] = []

    def slow(op: str, key: str, phase: str) -> None:  # a remote store's 5 ms a GET
        if op == "get" and phase == "before":
            time.sleep(0.005)
            if log_version(key) > head:
                past.append(log_version(key))

    for due, most_past in ((0.0, None), (float(head - 1), 1)):
        past.clear()
        state = behind.copy()
        catch_up(HookedStore(ahead.store, slow), state, due=due)  # type: ignore[arg-type]
        assert state.version == head > behind.version + 30
        time.sleep(0.2)  # the reads past the head a round left running have ended
        if most_past is None:
            assert len(past) > 1, past  # doubling rounds reach well past the head
        else:
            assert len(past) <= most_past, past


class _Slow:
    """Every store request takes ``delay_s`` longer, as on a remote object store. Counts
    the GETs, and the longest chain of them each begun after the one before it ended."""

    def __init__(self, inner: object, delay_s: float) -> None:
        self._inner, self._delay_s = inner, delay_s
        self._lock = threading.Lock()
        self.reads = self.chain = 0

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._inner, name)
        if name not in ("put", "get", "get_range", "head", "list", "delete"):
            return attr

        def slowed(*args: object, **kwargs: object) -> object:
            with self._lock:
                depth = self.chain + 1  # after the longest chain of reads ended so far
                self.reads += name == "get"
            try:
                time.sleep(self._delay_s)
                return attr(*args, **kwargs)
            finally:
                if name == "get":
                    with self._lock:
                        self.chain = max(self.chain, depth)

        return slowed


class _Timed:
    """Records each store request as (name, start, end), in ``time.monotonic`` seconds."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.requests: list[tuple[str, float, float]] = []

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._inner, name)
        if name not in ("put", "get", "get_range", "head", "list", "delete"):
            return attr

        def timed(*args: object, **kwargs: object) -> object:
            start = time.monotonic()
            try:
                return attr(*args, **kwargs)
            finally:
                self.requests.append((name, start, time.monotonic()))

        return timed


def test_no_producer_captures_the_log(tmp_path) -> None:
    # Regression: a producer put its next entry the moment its last one landed. A rival that
    # lost a race needs two requests before it can put again, so it lost every race; the
    # winner saw no rival commits, read that as low load, dropped its interval to zero and
    # starved the others (one of three producers committed 2% of the fragments).
    # Writers far faster than the log, with a small budget, keep every producer's budget
    # full, so a share reflects the race for the log, not how fast a thread got to write; the
    # run lasts a number of commits, not seconds (without the gap: 1 to 3 of 98 commits).
    from lakestream.producers import Producer, ProducerOptions

    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=8, group_size=4)
    options = ProducerOptions(max_inflight_fragments=16)
    producers = [Producer(uri, f"w{k}", options=options) for k in range(3)]
    for p in producers:
        p.stream.store = _Slow(p.stream.store, 0.01)  # type: ignore[assignment]
    commits, deadline = 120, time.monotonic() + 300

    def write(p: Producer, k: int) -> None:
        i = 0
        while sum(q.stats.commits for q in producers) < commits:
            assert time.monotonic() < deadline, "the producers stopped committing"
            p.write(rows(10_000_000 * k + 4 * i, 4))
            i += 1

    threads = [threading.Thread(target=write, args=(p, k)) for k, p in enumerate(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shares = [p.stats.fragments_committed for p in producers]
    counts = [p.stats.commits for p in producers]
    for p in producers:
        p.abort()
    assert sum(counts) >= commits, ("a writer failed", counts)
    assert min(counts) >= 0.15 * sum(counts), counts
    assert min(shares) >= 0.15 * sum(shares), shares
