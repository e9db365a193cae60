"""Request hooks: each request a store makes seen once, after it, with its outcome; a hook
may add latency or fail the request; with none set the store's methods are its own."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import lakestream
from lakestream.errors import NotFoundError, StoreError
from lakestream.store.hooks import Request, add_request_hook
from lakestream.store.local import LocalStore
from tests.helpers import SCHEMA, rows


def test_each_request_is_seen_once_with_its_outcome(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    seen: list[Request] = []
    remove = add_request_hook(seen.append)
    try:
        store.put("a/b", b"12345")
        assert store.get("a/b") == b"12345"
        assert store.get_range("a/b", 1, 3) == b"23"
        with pytest.raises(NotFoundError):
            store.get("a/missing")
        store.head("a/b")
        list(store.list("a/"))
        store.delete("a/b")
    finally:
        remove()
    assert [(r.op, r.key, r.nbytes) for r in seen] == [
        ("put", "a/b", 5), ("get", "a/b", 5), ("get_range", "a/b", 2), ("get", "a/missing", None),
        ("head", "a/b", None), ("list", "a/", None), ("delete", "a/b", None)]
    assert isinstance(seen[3].error, NotFoundError) and seen[0].error is None
    assert all(r.seconds >= 0 for r in seen)
    store.put("a/c", b"x")
    assert len(seen) == 7  # removed: seen no more


def test_without_a_hook_the_methods_are_the_stores_own() -> None:
    own = LocalStore.get
    remove = add_request_hook(lambda r: None)
    try:
        assert LocalStore.get is not own and LocalStore.get.__wrapped__ is own  # type: ignore[attr-defined]
    finally:
        remove()
    assert LocalStore.get is own
    remove()  # removing twice is harmless


def test_a_stream_counts_its_log_reads_and_a_hook_adds_latency(tmp_path: Path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 4))
    log_gets: list[str] = []

    def hook(r: Request) -> None:
        if r.op == "get" and r.key.startswith("_delta_log/"):
            log_gets.append(r.key)
        time.sleep(0.01)

    remove = add_request_hook(hook)
    try:
        t0 = time.monotonic()
        s.refresh()  # one GET: the next version, absent
        assert time.monotonic() - t0 >= 0.01
    finally:
        remove()
    assert log_gets and all(k.startswith("_delta_log/") for k in log_gets)


def test_a_raising_hook_fails_the_request_as_a_lost_reply(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))

    def lose(r: Request) -> None:
        if r.op == "put":
            raise StoreError(f"injected lost reply putting {r.key}")

    remove = add_request_hook(lose)
    try:
        with pytest.raises(StoreError, match="lost reply"):
            store.put("k", b"v", mode="create")
    finally:
        remove()
    assert store.get("k") == b"v"  # it landed


def test_a_hook_must_be_callable() -> None:
    with pytest.raises(TypeError, match="function of a Request"):
        add_request_hook("print")  # type: ignore[arg-type]


def test_keyword_calls_are_seen_as_positional_ones(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    seen: list[Request] = []
    remove = add_request_hook(seen.append)
    try:
        store.put(key="a/b", data=memoryview(b"123"))
        assert [m.key for m in store.list(prefix="a/")] == ["a/b"]
        assert store.get(key="a/b", max_bytes=10) == b"123"
    finally:
        remove()
    assert [(r.op, r.key, r.nbytes) for r in seen] == [
        ("put", "a/b", 3), ("list", "a/", None), ("get", "a/b", 3)]


def test_a_sleeping_hook_holds_no_cpu_slot(tmp_path: Path) -> None:
    """Regression: a hook ran in the reading thread's CPU slot (``lakestream.store.slots``),
    so a hook adding 50 ms a GET let one read wait at a time where the process had one slot:
    a stand-in trainer reading SeaweedFS so slowed ran at 0.57x synthetic, 0.93x once the
    hook waited out of the slot, as a remote store's answer is waited for."""
    from lakestream.store.slots import cpu_slots

    store = LocalStore(str(tmp_path))
    store.put("a", b"x")
    slots = cpu_slots()
    size = slots.size
    slots.resize(1)
    remove = add_request_hook(lambda r: time.sleep(0.2) if r.op == "get" else None)

    def read() -> None:
        with slots.held():  # a read thread's per-byte work, in its slot
            store.get("a")

    threads = [threading.Thread(target=read) for _ in range(3)]
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        remove()
        slots.resize(size)
    assert time.monotonic() - t0 < 0.45  # the three sleeps overlapped (0.6 s one by one)
