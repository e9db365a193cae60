"""Readers waiting at the head share one poll per process: the GETs on the log prefix do not
grow with the number of readers, and every reader still sees each step."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
import uuid
from collections import Counter
from typing import Any

import lakestream
from lakestream.loaders.reader import StepReader
from lakestream.store.local import LocalStore
from tests.helpers import SCHEMA, rows

B = 4
STEPS = 12


def _tail(tmp_path, readers: int, monkeypatch) -> tuple[int, list[list[int]]]:
    """``readers`` threads, each with its own handle, read steps 0..STEPS-1 while a writer
    appends one step every 20 ms; returns the log GETs and what each reader got."""
    gets: Counter[str] = Counter()
    real_get = LocalStore.get

    def counted(self: LocalStore, key: str, **kwargs: object) -> bytes:
        if key.startswith("_delta_log/"):
            gets["log"] += 1
        return real_get(self, key, **kwargs)  # type: ignore[arg-type]

    s = lakestream.create(str(tmp_path / f"s{readers}"), SCHEMA, global_batch_size=B)
    got: list[list[int]] = [[] for _ in range(readers)]

    def read(k: int) -> None:
        reader = StepReader(lakestream.open(s.uri), 0, 1, prefetch=0, timeout=30)
        got[k] = [step for step, _ in reader.read(range(STEPS))]

    monkeypatch.setattr(LocalStore, "get", counted)
    threads = [threading.Thread(target=read, args=(k,)) for k in range(readers)]
    for t in threads:
        t.start()
    for step in range(STEPS):
        time.sleep(0.02)
        s.append(rows(B * step, B))
    for t in threads:
        t.join(60)
    monkeypatch.setattr(LocalStore, "get", real_get)
    return gets["log"], got


def test_log_gets_do_not_grow_with_the_readers(tmp_path, monkeypatch) -> None:
    one, got_one = _tail(tmp_path, 1, monkeypatch)
    many, got_many = _tail(tmp_path, 32, monkeypatch)
    assert got_one == [list(range(STEPS))]
    assert got_many == [list(range(STEPS))] * 32
    assert many <= 4 * one, (one, many)



def test_a_stream_created_again_in_the_same_place_is_not_served_old_entries(tmp_path) -> None:
    import shutil

    uri = str(tmp_path / "s")
    first = lakestream.create(uri, SCHEMA, global_batch_size=B)
    old = lakestream.open(uri)
    first.append(rows(0, B))
    assert old.poll() == 1 and old.num_samples == B  # version 1 came through the head
    shutil.rmtree(uri)
    time.sleep(0.01)  # another creation time
    second = lakestream.create(uri, SCHEMA, global_batch_size=B)
    fresh = lakestream.open(uri)  # at version 0: its next poll asks for version 1
    second.append(rows(100, 2 * B))
    fresh.poll()
    assert fresh.num_samples == 2 * B
    assert fresh.read_step(0).column("id").to_pylist() == list(range(100, 100 + B))


def test_a_commit_after_a_quiet_spell_is_seen_within_the_rest_poll(tmp_path,
                                                                  monkeypatch) -> None:
    """Regression: a version found absent was asked for again after a backoff that grew to
    half a second, and the reader slept its own growing backoff on top: a commit after a
    quiet spell was seen up to ~1 s late. Now the pause is half the gap between arrivals,
    10 to 50 ms, and the reader sleeps until the process's head asks again."""
    from lakestream.loaders.reader import StepReader
    from lakestream.log.head import POLL_REST_S

    gets: Counter[str] = Counter()
    real_get = LocalStore.get

    def counted(self: LocalStore, key: str, **kwargs: object) -> bytes:
        if key.startswith("_delta_log/"):
            gets["log"] += 1
        return real_get(self, key, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LocalStore, "get", counted)
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    reader = StepReader(lakestream.open(s.uri), 0, 1, timeout=10)
    lags = []
    for step in range(3):
        quiet = 1.5
        timer = threading.Timer(quiet, lambda k=step: s.append(rows(B * k, B)))
        t0 = time.monotonic()
        timer.start()
        before = gets["log"]
        assert reader.wait_visible(step)
        lags.append(time.monotonic() - t0 - quiet)
        # At rest the process polls at most every POLL_REST_S (plus the read that finds it).
        assert gets["log"] - before <= quiet / POLL_REST_S + 5
    assert max(lags) < POLL_REST_S + 0.05, lags


def test_a_busy_log_is_polled_within_the_budget(tmp_path, monkeypatch) -> None:
    """Polls (reads that find nothing) stay within 100 a second however fast commits come;
    the reads that find entries are one per version committed."""
    from lakestream.loaders.reader import StepReader
    from lakestream.log.head import POLL_MIN_S

    misses: Counter[str] = Counter()
    real_get = LocalStore.get

    def counted(self: LocalStore, key: str, **kwargs: object) -> bytes:
        try:
            return real_get(self, key, **kwargs)  # type: ignore[arg-type]
        except lakestream.NotFoundError:
            if key.startswith("_delta_log/"):
                misses["log"] += 1
            raise

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    stop = threading.Event()

    def write() -> None:
        k = 0
        while not stop.is_set():
            s.append(rows(B * k, B))
            k += 1
            time.sleep(0.003)

    monkeypatch.setattr(LocalStore, "get", counted)
    writer = threading.Thread(target=write)
    writer.start()
    reader = StepReader(lakestream.open(s.uri), 0, 1, timeout=10)
    t0 = time.monotonic()
    step = 0
    try:
        while time.monotonic() - t0 < 2.0:
            assert reader.wait_visible(step)
            step += 1
    finally:
        stop.set()
        writer.join()
    assert step > 100  # it kept up with the writer
    assert misses["log"] <= (time.monotonic() - t0) / POLL_MIN_S + 5, misses



def _append_for(uri: str, options: dict[str, str], seconds: float, count: Any) -> None:
    """A writer process: appends a step after another for ``seconds``; ``count`` is how many."""
    s = lakestream.open(uri, storage_options=options)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        s.append(rows(B * count.value, B))
        count.value += 1


def test_a_busy_log_on_a_remote_store_draws_at_most_the_budget_of_empty_reads(
        s3_options) -> None:
    """Regression: on a remote store a read that finds nothing is a billed request on the
    log's prefix, and a busy log drew 65-75 a second of them here (45-75 in
    ``bench/freshness.py``): parallel rounds reaching past the head, and the 10 ms pause.
    Now a reader sends at most ``EMPTY_POLLS_PER_S`` a second (a few ahead, and one round's
    reads past the head), and still sees the last commit soon after it lands."""
    from lakestream.log.head import EMPTY_POLLS_AHEAD, EMPTY_POLLS_PER_S, POLL_REST_S
    from lakestream.log.tail import TAIL_WIDTH
    from lakestream.store import Request, add_request_hook
    from tests.s3server import BUCKET

    uri = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/busy"
    lakestream.create(uri, SCHEMA, global_batch_size=B, storage_options=s3_options)
    reads: Counter[str] = Counter()

    def counted(r: Request) -> None:
        if r.op == "get" and r.key.startswith("_delta_log/"):
            reads["empty" if isinstance(r.error, lakestream.NotFoundError) else "found"] += 1

    reader = StepReader(lakestream.open(uri, storage_options=s3_options), 0, 1, timeout=30)
    ctx = mp.get_context("spawn")
    count = ctx.Value("i", 0)
    writer = ctx.Process(target=_append_for, args=(uri, s3_options, 3.0, count))
    writer.start()
    try:
        assert reader.wait_visible(0)  # the writer is up
        remove = add_request_hook(counted)
        t0 = time.monotonic()
        step = 1
        while writer.is_alive() and time.monotonic() - t0 < 2.0:
            assert reader.wait_visible(step)
            step += 1
        elapsed = time.monotonic() - t0
        remove()
        writer.join(timeout=30)
        t1 = time.monotonic()
        assert reader.wait_visible(count.value - 1)
        caught_up = time.monotonic() - t1
    finally:
        if writer.is_alive():
            writer.kill()
    assert step > 20, step  # the log was busy
    # The budget, what may be sent ahead of it, and one round's reads past the head.
    budget = elapsed * EMPTY_POLLS_PER_S + EMPTY_POLLS_AHEAD + TAIL_WIDTH
    assert reads["empty"] <= budget, (reads, elapsed)
    assert caught_up < POLL_REST_S + 0.5, caught_up


def _tail_counting(uri: str, options: dict[str, str], host_dir: str, seconds: float,
                   go: Any, empties: Any, steps: Any) -> None:
    """A reader process of the host at ``host_dir``: follows the log for ``seconds`` once
    ``go`` is set, counting its reads of the log that found nothing."""
    import os

    os.environ["LAKESTREAM_HOST_DIR"] = host_dir
    from lakestream.store import Request, add_request_hook

    reader = StepReader(lakestream.open(uri, storage_options=options), 0, 1, timeout=30)
    assert reader.wait_visible(0)
    go.wait()

    def counted(r: Request) -> None:
        if r.op == "get" and r.key.startswith("_delta_log/") \
                and isinstance(r.error, lakestream.NotFoundError):
            with empties.get_lock():
                empties.value += 1

    add_request_hook(counted)
    t0, step = time.monotonic(), 1
    while time.monotonic() - t0 < seconds:
        reader.wait_visible(step)
        step += 1
    steps.value = step


def test_the_readers_of_a_host_share_one_budget_of_empty_reads(s3_options, tmp_path) -> None:
    """Regression: each process kept its own budget of reads finding nothing, so the host
    sent its processes' sum (8 ranks of a host drew 42 a second in ``bench/requests.py``).
    Three reader processes sharing the host's head now draw about one budget between them
    (a few ahead, and some of a round's reads past the head for each)."""
    from lakestream.log.head import EMPTY_POLLS_AHEAD, EMPTY_POLLS_PER_S
    from lakestream.log.tail import TAIL_WIDTH
    from tests.s3server import BUCKET

    uri = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/host"
    lakestream.create(uri, SCHEMA, global_batch_size=B, storage_options=s3_options)
    lakestream.open(uri, storage_options=s3_options).append(rows(0, B))
    ctx = mp.get_context("spawn")
    go, empties, count = ctx.Event(), ctx.Value("i", 0), ctx.Value("i", 1)
    seconds, n = 3.0, 3
    steps = [ctx.Value("i", 0) for _ in range(n)]
    readers = [ctx.Process(target=_tail_counting,
                           args=(uri, s3_options, str(tmp_path), seconds, go, empties, k))
               for k in steps]
    writer = ctx.Process(target=_append_for, args=(uri, s3_options, seconds + 1.0, count))
    for p in readers:
        p.start()
    try:
        time.sleep(2.0)  # the readers are up (each waits for step 0, committed above)
        writer.start()
        go.set()
        for p in readers:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in [*readers, writer]:
            if p.is_alive():
                p.kill()
        writer.join(timeout=30)
    assert min(k.value for k in steps) > 10, [k.value for k in steps]  # the log was busy
    # 64-66 here; 107-110 with a budget per process.
    budget = seconds * EMPTY_POLLS_PER_S + EMPTY_POLLS_AHEAD + n * TAIL_WIDTH / 2
    assert empties.value <= budget, (empties.value, budget)
