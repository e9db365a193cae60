"""The processes of one host share the log's head through a host folder: a version one of
them read, or found absent a pause ago, the others take from there instead of the store;
what is damaged or held too long there is a miss, never a wrong entry or a stall."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import lakestream
from lakestream.log import hosthead
from lakestream.log.head import SharedHead
from lakestream.log.hosthead import HostHead
from lakestream.log.tail import read_entry
from lakestream.store import Request, add_request_hook
from lakestream.store.local import LocalStore
from tests.helpers import SCHEMA, rows
from tests.s3server import BUCKET


def _counted() -> tuple[Counter[str], Any]:
    gets: Counter[str] = Counter()

    def count(r: Request) -> None:
        if r.op == "get" and r.key.startswith("_delta_log/"):
            gets["empty" if isinstance(r.error, lakestream.NotFoundError) else "found"] += 1
    return gets, add_request_hook(count)


def test_a_version_read_or_found_absent_by_one_is_not_asked_by_another(tmp_path: Path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 4))
    store = LocalStore(s.uri)
    folder = str(tmp_path / "host")
    a, b = SharedHead(HostHead(folder)), SharedHead(HostHead(folder))  # two processes
    gets, remove = _counted()
    try:
        first = a.entry(store, 1)
        assert first is not None and gets == {"found": 1}
        second = b.entry(store, 1)
        assert second is not None and second.commit_id == first.commit_id
        assert gets == {"found": 1}  # from the host's copy
        assert a.entry(store, 2) is None and gets["empty"] == 1
        assert b.entry(store, 2) is None and b.entry(store, 3) is None
        assert gets["empty"] == 1  # absent for the host until a's pause runs out
        time.sleep(a.pause_s() + 0.01)
        c = SharedHead(HostHead(folder))
        assert c.entry(store, 2) is None and gets["empty"] == 2  # asked again after it
    finally:
        remove()


def test_a_damaged_copy_is_read_from_the_store(tmp_path: Path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 4))
    store = LocalStore(s.uri)
    host = HostHead(str(tmp_path / "host"))
    host.found(1, b'{"not": "an entry"}')
    entry = SharedHead(host).entry(store, 1)
    assert entry is not None and entry.commit_id == read_entry(store, 1).commit_id


def test_a_copy_larger_than_any_entry_is_a_miss(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hosthead, "MAX_ENTRY_BYTES", 64)
    host = HostHead(str(tmp_path / "host"))
    host.found(1, b"x" * 65)
    assert host.entry(1) is None  # read no further than the bound, then refused
    host.found(2, b"x" * 64)
    assert host.entry(2) == b"x" * 64


def test_stray_old_entries_and_dead_writers_temp_files_are_trimmed(tmp_path: Path) -> None:
    host = HostHead(str(tmp_path / "host"))
    host.found(450, b"x")
    host.found(5, b"old")  # a reader catching up far behind: nothing 128 above it comes
    stale = Path(host.folder, f"{400:020d}.json.tmp-1-dead")
    stale.write_bytes(b"torn")
    os.utime(stale, (time.time() - 120, time.time() - 120))
    host.found(2 * hosthead.KEPT * 2, b"y")  # a multiple of KEPT: the folder is trimmed
    assert host.entry(5) is None and host.entry(450) == b"x" and not stale.exists()


def test_a_removed_folder_is_made_again(tmp_path: Path) -> None:
    import shutil

    host = HostHead(str(tmp_path / "host"))
    shutil.rmtree(host.folder)
    host.found(1, b"x")
    assert host.entry(1) == b"x"


def test_an_absence_longer_than_a_pause_is_not_trusted(tmp_path: Path) -> None:
    host = HostHead(str(tmp_path / "host"))
    now = time.monotonic()
    host.found_absent(5, now + 0.04)
    assert host.absent_until(5, 0.05) == pytest.approx(now + 0.04)
    assert host.absent_until(4, 0.05) is None  # only it and the versions after it
    host.found_absent(5, now + 3600.0)  # from before a reboot, or another host's clock
    assert host.absent_until(5, 0.05) is None
    host.found_absent(5, float("inf"))
    assert host.absent_until(6, 0.05) is None


def test_a_child_forked_while_a_slot_is_held_does_not_keep_it(tmp_path: Path) -> None:
    import fcntl
    import signal

    host = HostHead(str(tmp_path / "host"))
    with host.reading(1):
        child = os.fork()
        if child == 0:  # the child lives on past its parent's read
            time.sleep(30)
            os._exit(0)
    try:
        fd = os.open(os.path.join(host.folder, "locks", str(1 % hosthead.SLOTS)), os.O_RDWR)
        try:
            deadline = time.monotonic() + 5  # the child closes its copy once it runs
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break  # free: the child let go of it
                except BlockingIOError:
                    assert time.monotonic() < deadline, "the forked child kept the lock"
                    time.sleep(0.01)
        finally:
            os.close(fd)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_a_held_lock_is_waited_for_a_bounded_time(tmp_path: Path, monkeypatch) -> None:
    import fcntl

    monkeypatch.setattr(hosthead, "WAIT_S", 0.2)
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 4))
    host = HostHead(str(tmp_path / "host"))
    fd = os.open(os.path.join(host.folder, "locks", str(1 % hosthead.SLOTS)),
                 os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a process of the host stuck in its read
    try:
        t0 = time.monotonic()
        assert SharedHead(host).entry(LocalStore(s.uri), 1) is not None
        assert 0.2 <= time.monotonic() - t0 < 5
    finally:
        os.close(fd)


def test_old_entries_go_and_the_folder_can_be_turned_off(tmp_path: Path, monkeypatch) -> None:
    host = HostHead(str(tmp_path / "host"))
    for v in range(hosthead.KEPT + 3):
        host.found(v, b"x")
    assert host.entry(2) is None and host.entry(3) == b"x"
    monkeypatch.setenv(hosthead.ENV, "off")
    assert HostHead.for_stream("s3://b/s", 1) is None
    monkeypatch.setenv(hosthead.ENV, str(tmp_path / "base"))
    made = HostHead.for_stream("s3://b/s", 1)
    assert made is not None and made.folder.startswith(str(tmp_path / "base"))
    assert HostHead.for_stream("s3://b/s", 2).folder != made.folder  # type: ignore[union-attr]


def _poll(uri: str, options: dict[str, str], until: float, out: Any) -> None:
    gets, _ = _counted()
    s = lakestream.open(uri, storage_options=options)
    gets.clear()
    while time.time() < until:
        s.poll()
        time.sleep(max(0.0, s.poll_wait_s()))
    out.put(sum(gets.values()))


def _host_gets(uri: str, options: dict[str, str], processes: int) -> int:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    until = time.time() + 3.0
    procs = [ctx.Process(target=_poll, args=(uri, options, until, out))
             for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        return sum(out.get(timeout=60) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def test_processes_of_a_host_poll_a_stream_at_rest_as_one(s3_options, monkeypatch) -> None:
    uri = f"s3://{BUCKET}/hosthead-{uuid.uuid4().hex[:12]}"
    lakestream.create(uri, SCHEMA, global_batch_size=4, storage_options=s3_options)
    shared = _host_gets(uri, s3_options, 4)
    monkeypatch.setenv(hosthead.ENV, "off")
    alone = _host_gets(uri, s3_options, 4)
    assert alone > 0 and shared <= 0.5 * alone, (shared, alone)


def test_the_host_budget_is_one_for_every_handle_and_distrusts_a_far_value(tmp_path) -> None:
    """Two handles on one stream's folder (two processes of the host) spend one budget of
    reads finding nothing; a value far past now (before a reboot, another clock) restarts
    it, as does a damaged one; a folder that fails leaves the process its own budget (None)."""
    from lakestream.log.hosthead import BUDGET_AHEAD_S

    a, b = HostHead(str(tmp_path / "s")), HostHead(str(tmp_path / "s"))
    now = time.monotonic()
    assert a.spend(now, 0.05) == pytest.approx(now + 0.05)
    assert b.spend(now, 0.05) == pytest.approx(now + 0.10)  # after a's, not beside it
    assert a.spend(now + 1.0, 0.05) == pytest.approx(now + 1.05)  # an idle budget refills
    (tmp_path / "s" / "budget").write_text(repr(now + 2 * BUDGET_AHEAD_S))
    assert b.spend(now, 0.05) == pytest.approx(now + 0.05)
    (tmp_path / "s" / "budget").write_text("nan")  # damaged: not a budget spent for ever
    assert b.spend(now, 0.05) == pytest.approx(now + 0.05)
    (tmp_path / "s" / "locks").rename(tmp_path / "gone")
    (tmp_path / "s" / "locks").write_text("not a folder")
    assert a.spend(now, 0.05) is None
