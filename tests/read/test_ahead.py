"""Fetching ahead: where whole fetches wait on the store, a step of many fragments fetches
them at once (about one round trip, not one per fragment); on a store that answers at once,
one after another, in the reading thread, as before; a fetch ahead that fails fails the step
as its own fetch would."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import lakestream
from lakestream.errors import NotFoundError
from lakestream.read.cache import FragmentCache
from tests.helpers import SCHEMA, ids, rows

DELAY_S = 0.03


class _Distant:
    """A store whose whole-file GETs take ``DELAY_S`` more (an S3 first byte), counting how
    many are under way at once."""

    def __init__(self, inner: Any, delay_s: float = DELAY_S) -> None:
        self.inner, self.delay_s = inner, delay_s
        self.now = self.most = 0
        self.lock = threading.Lock()

    @property
    def uri(self) -> str:
        return str(self.inner.uri)

    def get_buffer(self, key: str, size: int) -> Any:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            time.sleep(self.delay_s)
            return self.inner.get_buffer(key, size)
        finally:
            with self.lock:
                self.now -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _stream(tmp_path: Any) -> lakestream.Stream:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=8)
    for k in range(24):  # 3 steps of 8 one-sample fragments
        s.append(rows(k, 1))
    return s


def _step(handle: lakestream.Stream, cache: FragmentCache, step: int) -> tuple[list[int], float]:
    t0 = time.perf_counter()
    table = handle.read_offsets([(8 * step, 8 * step + 8)], cache=cache)
    return ids(table), time.perf_counter() - t0


def test_a_step_of_many_fragments_waits_about_one_round_trip(tmp_path) -> None:
    s = _stream(tmp_path)
    store = _Distant(s.store)
    handle = lakestream.stream.Stream(s.uri, store, s.state)
    cache = FragmentCache(64 << 20)
    got, first = _step(handle, cache, 0)  # the waits are not known yet: one by one
    assert got == list(range(8)) and first >= 8 * DELAY_S and store.most == 1
    got, second = _step(handle, cache, 1)
    assert got == list(range(8, 16))
    assert store.most >= 4 and second < 4 * DELAY_S, (store.most, second)


def test_a_store_that_answers_at_once_is_read_one_fragment_after_another(tmp_path) -> None:
    s = _stream(tmp_path)
    store = _Distant(s.store, delay_s=0.0)
    handle = lakestream.stream.Stream(s.uri, store, s.state)
    cache = FragmentCache(64 << 20)
    for step in range(3):
        assert _step(handle, cache, step)[0] == list(range(8 * step, 8 * step + 8))
    assert store.most == 1


def test_a_fetch_ahead_that_fails_fails_the_step(tmp_path) -> None:
    s = _stream(tmp_path)
    handle = lakestream.stream.Stream(s.uri, _Distant(s.store), s.state)
    cache = FragmentCache(64 << 20)
    _step(handle, cache, 0)
    gone = next(f for f in s.state.all_fragments() if f.offset == 12)
    s.store.delete(gone.path)
    with pytest.raises(NotFoundError):
        _step(handle, cache, 1)


@pytest.mark.parametrize("later", ["steps over", "row groups decoded"])
def test_a_fetch_ahead_that_starts_after_its_step_read_the_file_fetches_nothing(
        tmp_path, later: str) -> None:
    """Regression: a fetch ahead queued behind a busy pool (another test's slow fetches
    ahead, in a loaded run) ran after its step had fetched the file itself and let it go,
    and fetched it again: once every read that needed the file was over, or once its row
    groups were decoded (the bytes are discarded then, while the rows are kept)."""
    from lakestream.plan.mix import MixPlan, SourcePlan
    from lakestream.read import ahead
    from lakestream.read.steps import StepPass

    s = _stream(tmp_path)
    distant = _Distant(s.store)
    gets: list[str] = []
    real = distant.get_buffer

    def counted(key: str, size: int) -> Any:
        gets.append(key)
        return real(key, size)

    distant.get_buffer = counted  # type: ignore[method-assign]
    handle = lakestream.stream.Stream(s.uri, distant, s.state)
    cache, plan = FragmentCache(64 << 20), MixPlan([SourcePlan(take=8)])

    def step(k: int) -> list[int]:
        cache.begin(k)
        try:
            return ids(handle.read_offsets([(8 * k, 8 * k + 8)], cache=cache,
                                           last_step=StepPass(plan, 0, k)))
        finally:
            cache.end(k)

    assert step(0) == list(range(8))  # its waits say the store is far: step 1 fetches ahead
    release = threading.Event()
    blockers = [ahead._executor().submit(release.wait) for _ in range(ahead.THREADS)]
    try:
        assert step(1) == list(range(8, 16))  # its own read fetched all 8; 7 ahead queued
        if later == "steps over":
            for k in range(2, 9):  # later steps: the cache lets step 1's fragments go
                cache.begin(k)
                cache.end(k)
        assert not cache.holds(*[(f.path, f.size, f.crc32) for f in s.state.all_fragments()])
        before = len(gets)
    finally:
        release.set()
    for b in blockers:
        b.result(timeout=10)
    time.sleep(0.3)  # the queued fetches ahead have run
    assert len(gets) == before == 16, gets


def test_a_last_step_given_as_a_plain_function_still_reads(tmp_path) -> None:
    """``Stream.read_offsets`` takes any ``last_step(lo, hi)``; only a plan's ``StepPass``
    also says whether the pass is the last (a function is taken as not)."""
    s = _stream(tmp_path)
    handle = lakestream.stream.Stream(s.uri, _Distant(s.store, 0.0), s.state)
    cache = FragmentCache(64 << 20)
    for k in range(3):
        cache.begin(k)
        table = handle.read_offsets([(8 * k, 8 * k + 8)], cache=cache,
                                    last_step=lambda lo, hi, k=k: k)
        cache.end(k)
        assert ids(table) == list(range(8 * k, 8 * k + 8))
