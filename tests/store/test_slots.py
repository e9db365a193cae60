"""The CPU slots of a process's reads: never more threads in them than slots, taken first come
first served, given up while waiting on a remote store or on another thread's load, and a
forked child's are its own."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import obstore
import pyarrow as pa
import pytest

from lakestream.read.cache import FragmentCache
from lakestream.store import open_store
from lakestream.store.s3direct import DirectReads
from lakestream.store.slots import CpuSlots, cpu_slots
from tests.s3server import BUCKET


class _Census:
    """How many threads are in a block at once, at most."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self.order: list[int] = []
        self._lock = threading.Lock()

    def visit(self, who: int, seconds: float) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.order.append(who)
        time.sleep(seconds)
        with self._lock:
            self.now -= 1


def _run(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a thread never got a slot"


def test_no_more_threads_than_slots_run_at_once_and_they_run_in_the_order_they_asked() -> None:
    slots, census = CpuSlots(2), _Census()

    def work(who: int) -> None:
        with slots.held():
            census.visit(who, 0.05)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(6)]
    with slots.held():  # one slot taken: the threads queue in the order they arrive
        for t in threads:
            t.start()
            time.sleep(0.02)
    _run([])
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive()
    assert census.most == 2  # both slots were used, never three at once
    assert census.order == list(range(6))


def test_a_thread_waiting_on_a_remote_answer_lets_another_use_its_slot() -> None:
    slots, census = CpuSlots(1), _Census()
    answered = threading.Event()

    def fetcher() -> None:
        with slots.held():
            with slots.waiting():  # the request is out: another thread computes meanwhile
                assert not slots.holds()
                assert answered.wait(10)
            assert slots.holds()

    def computer() -> None:
        time.sleep(0.05)
        with slots.held():
            census.visit(1, 0.0)
        answered.set()

    _run([threading.Thread(target=f, daemon=True) for f in (fetcher, computer)])
    assert census.order == [1]


def test_held_is_reentrant_and_resize_admits_the_waiting() -> None:
    slots = CpuSlots(1)
    entered = threading.Event()

    def second() -> None:
        with slots.held():
            entered.set()

    with slots.held():
        with slots.held():  # a nested read in the same thread does not wait on itself
            assert slots.holds()
        assert slots.holds()
        t = threading.Thread(target=second, daemon=True)
        t.start()
        assert not entered.wait(0.2)
        slots.resize(2)
        assert entered.wait(10)
        t.join()
    assert not slots.holds() and slots.size == 2


def test_a_load_waited_for_gives_the_slot_back_to_the_thread_loading_it() -> None:
    """One slot: thread A loads a fragment and waits for the store without its slot; B takes
    the slot and asks the cache for the same fragment. B must wait without the slot, or A
    never gets one back to finish the load (both would hang)."""
    slots = cpu_slots()
    before = slots.size
    slots.resize(1)
    cache = FragmentCache(1 << 20)
    asked = threading.Event()
    got: list[Any] = []

    def load() -> Any:
        with slots.waiting():  # as S3Store does around a request
            asked.set()
            time.sleep(0.1)
        return pa.py_buffer(b"x" * 10)

    def reader() -> None:
        with slots.held():
            got.append(cache.fetch("k", load))

    try:
        a, b = (threading.Thread(target=reader, daemon=True) for _ in range(2))
        a.start()
        assert asked.wait(10)
        b.start()
        _run([])
        for t in (a, b):
            t.join(timeout=10)
            assert not t.is_alive(), "the load and its waiter hung on the one slot"
        assert len(got) == 2 and got[0] is got[1]
    finally:
        slots.resize(before)


def test_a_forked_child_has_its_own_slots() -> None:
    """A DataLoader worker forked while the parent's read threads hold every slot must not
    inherit them held: its reads would never start."""
    slots = cpu_slots()
    before = slots.size
    slots.resize(1)
    release = threading.Event()
    inside = threading.Event()

    def hold() -> None:
        with slots.held():
            inside.set()
            release.wait(30)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    try:
        assert inside.wait(10)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            done = threading.Event()

            def child() -> None:
                with cpu_slots().held():
                    done.set()

            threading.Thread(target=child, daemon=True).start()
            os._exit(0 if done.wait(10) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        t.join()
        slots.resize(before)


@pytest.mark.parametrize("call", ["get_buffer", "get_range", "get", "head"])
def test_s3_requests_are_made_out_of_the_slot(s3_options: dict[str, str],
                                              monkeypatch: pytest.MonkeyPatch,
                                              call: str) -> None:
    """A read thread waiting on S3 holds no slot, so the threads a remote store's latency
    needs cost no CPU slot (observed at each request the client makes, to a real server)."""
    store = open_store(f"s3://{BUCKET}/slots-{call}", s3_options)
    store.put("k", b"0123456789")
    seen: list[bool] = []
    for name in ("get", "get_range", "head"):
        real = getattr(obstore, name)

        def probe(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            seen.append(cpu_slots().holds())
            return _real(*args, **kwargs)

        monkeypatch.setattr(f"lakestream.store.s3.obstore.{name}", probe)
    direct = DirectReads._get  # a fragment's GET received outside the client

    def probe_direct(*args: Any) -> Any:
        seen.append(cpu_slots().holds())
        return direct(*args)

    monkeypatch.setattr(DirectReads, "_get", probe_direct)
    with cpu_slots().held():
        if call == "get_buffer":
            assert bytes(store.get_buffer("k", 10)) == b"0123456789"
        elif call == "get_range":
            assert store.get_range("k", 2, 5) == b"234"
        elif call == "get":
            assert store.get("k") == b"0123456789"
        else:
            assert store.head("k").size == 10
        assert cpu_slots().holds()
    assert seen and not any(seen)
    assert (store.direct.reads == 1) == (call == "get_buffer")


def test_a_thread_s_time_waiting_is_counted_out_of_its_slot_and_only_its_own() -> None:
    slots = CpuSlots(2)
    seen: list[float] = []

    def other() -> None:
        with slots.held(), slots.waiting():
            time.sleep(0.2)
        seen.append(slots.waited_s())

    with slots.held():
        before = slots.waited_s()
        t = threading.Thread(target=other)
        t.start()
        t.join()
        with slots.waiting():
            time.sleep(0.02)
        time.sleep(0.2)  # in the slot: not waiting
        mine = slots.waited_s() - before
    assert 0.02 <= mine < 0.15, mine
    assert seen[0] >= 0.2


def test_a_wait_inside_a_wait_counts_once_and_an_uncounted_one_not_at_all() -> None:
    """A request hook's own request waits inside the hook's wait; a wait for another
    thread's load (which may be a decode) is not the store's."""
    slots = CpuSlots(1)
    with slots.held():
        before = slots.waited_s()
        with slots.waiting(), slots.waiting():
            time.sleep(0.05)
        nested = slots.waited_s() - before
        with slots.waiting(counted=False):
            time.sleep(0.05)
        uncounted = slots.waited_s() - before - nested
    assert 0.05 <= nested < 0.095, nested
    assert uncounted == 0.0
