"""The host's disk cache of fragments: each fetched once while held, whichever process asks;
nothing served that does not match the log's CRC-32; a writer killed mid-fill leaves nothing
served; the entries held within the limit."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zlib_ng import zlib_ng

import lakestream
from lakestream.loaders import DiskCache, Source, StreamDataset
from lakestream.producers import Producer
from lakestream.store.pool import buffer_pool
from lakestream.store.s3 import S3Store
from tests.helpers import SCHEMA, rows
from tests.s3server import BUCKET

STORE = "s3://bucket/stream"


def _checker(body: bytes) -> Any:
    size, crc = len(body), zlib_ng.crc32(body)

    def check(data: Any) -> None:
        view = memoryview(data).cast("B")
        if view.nbytes != size or zlib_ng.crc32(view) != crc:
            raise ValueError("damaged")

    return check


def _fetch(cache: DiskCache, body: bytes, loads: list[int], key: str = "data/p/a.parquet",
           final: bool = False) -> bytes:
    def load() -> bytes:
        loads.append(1)
        return body

    return bytes(memoryview(cache.fetch(STORE, key, len(body), zlib_ng.crc32(body), load,
                                        _checker(body), final=final)).cast("B"))


def _entries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")
            and ".locks" not in p.parts]


@pytest.fixture(params=["disk", "disk direct", "tmpfs direct"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """(folder, direct): a cache on the disk through the page cache and around it, and on
    tmpfs, which refuses ``O_DIRECT`` (read and written through the page cache then)."""
    if not request.param.startswith("tmpfs"):
        yield tmp_path, request.param.endswith("direct")
        return
    if not Path("/dev/shm").is_dir():
        pytest.skip("no tmpfs at /dev/shm on this host")
    root = Path(tempfile.mkdtemp(dir="/dev/shm"))
    yield root, True
    shutil.rmtree(root, ignore_errors=True)


def test_a_fragment_is_fetched_once_then_served_from_disk(where: tuple[Path, bool]) -> None:
    folder, direct = where
    cache, loads = DiskCache(str(folder), 1 << 20, direct=direct), []
    body = os.urandom(5000)
    assert _fetch(cache, body, loads) == body
    again = DiskCache(str(folder), 1 << 20, direct=direct)  # another process
    assert _fetch(again, body, loads) == body
    assert loads == [1] and cache.misses == 1 and cache.fetched_bytes == 5000
    assert again.hits == 1
    # two log entries naming one key with other contents are two files to the cache
    other = os.urandom(5000)
    assert _fetch(cache, other, loads) == other and loads == [1, 1]
    [entry] = [p for p in _entries(folder) if p.name.endswith(f"-{zlib_ng.crc32(body):08x}")]
    assert entry.read_bytes() == body  # whole, cut to its size after a direct write


def test_a_fetched_pool_block_is_written_around_the_page_cache_as_it_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fragment fetched into a pool block (S3's direct reads, a local read) is written from
    that block, whole pages past its end cut off after: no copy into an aligned block, which
    cost 0.17-0.30 CPU-s per GB against 0.03 written as it is."""
    from lakestream.store import diskcache

    body = os.urandom(3 * 4096 + 123)
    block = buffer_pool().array(len(body) + 1)
    block[:] = 0xAB  # what the block's tail holds must not reach the entry
    data = block[:len(body)]
    data[:] = np.frombuffer(body, np.uint8)

    def no_block(nbytes: int) -> Any:
        raise AssertionError(f"copied into a block of {nbytes} bytes")

    try:
        os.close(os.open(tmp_path / "probe", os.O_CREAT | os.O_WRONLY | diskcache._DIRECT))
    except (OSError, TypeError):
        pytest.skip("no O_DIRECT on this host's temporary folder")
    writes: list[tuple[int, int]] = []
    real_pwrite = os.pwrite

    def pwrite(fd: int, buf: Any, at: int) -> int:
        writes.append((np.frombuffer(buf, np.uint8).ctypes.data, memoryview(buf).nbytes))
        return real_pwrite(fd, buf, at)

    monkeypatch.setattr(diskcache.buffer_pool(), "array", no_block)
    monkeypatch.setattr(diskcache.os, "pwrite", pwrite)
    cache = DiskCache(str(tmp_path / "cache"), 1 << 20)
    got = cache.fetch(STORE, "data/p/a.parquet", len(body), zlib_ng.crc32(body),
                      lambda: data, _checker(body))
    assert bytes(memoryview(got).cast("B")) == body
    assert writes == [(data.ctypes.data, diskcache._padded(len(body)))]  # one direct write
    (entry,) = _entries(tmp_path / "cache")
    assert entry.read_bytes() == body


@pytest.mark.parametrize("direct", [False, True])
def test_a_damaged_entry_is_fetched_again_not_served(tmp_path: Path, direct: bool) -> None:
    cache, loads = DiskCache(str(tmp_path), 1 << 20, direct=direct), []
    body = os.urandom(5000)
    _fetch(cache, body, loads)
    [entry] = _entries(tmp_path)
    damaged = bytearray(entry.read_bytes())
    damaged[100] ^= 0xFF
    entry.write_bytes(bytes(damaged))
    assert _fetch(cache, body, loads) == body and loads == [1, 1]
    entry.write_bytes(body[:10])  # cut short
    assert _fetch(cache, body, loads) == body and loads == [1, 1, 1]
    assert entry.read_bytes() == body


def test_damaged_bytes_from_the_store_raise_and_are_not_kept(tmp_path: Path) -> None:
    cache = DiskCache(str(tmp_path), 1 << 20)
    body = os.urandom(5000)
    with pytest.raises(ValueError, match="damaged"):
        cache.fetch(STORE, "data/p/a.parquet", 5000, zlib_ng.crc32(body),
                    lambda: body[:-1] + bytes([body[-1] ^ 1]), _checker(body))
    assert _entries(tmp_path) == []


@pytest.mark.parametrize("direct", [False, True])
def test_the_entries_stay_within_the_limit_least_recently_used_first(tmp_path: Path,
                                                                     direct: bool) -> None:
    limit = 3 * 4096 + 100  # three entries of a page each
    cache, loads = DiskCache(str(tmp_path), limit, direct=direct), []
    bodies = [os.urandom(4096) for _ in range(5)]
    for i in range(3):
        _fetch(cache, bodies[i], loads, key=f"data/p/{i}.parquet")
        time.sleep(0.02)  # distinct access times
    _fetch(cache, bodies[0], loads, key="data/p/0.parquet")  # 0 used last: 1 is oldest
    assert len(loads) == 3
    _fetch(cache, bodies[3], loads, key="data/p/3.parquet")
    assert sum(p.stat().st_size for p in _entries(tmp_path)) <= limit
    assert len(loads) == 4
    _fetch(cache, bodies[0], loads, key="data/p/0.parquet")
    assert len(loads) == 4  # kept
    _fetch(cache, bodies[1], loads, key="data/p/1.parquet")
    assert len(loads) == 5  # evicted
    big = os.urandom(20_000)  # larger than the limit: served, never kept
    assert _fetch(cache, big, loads, key="data/p/big.parquet") == big
    assert sum(p.stat().st_size for p in _entries(tmp_path)) <= limit


def test_fills_under_way_that_hold_the_room_keep_a_fetch_from_passing_the_limit(
        tmp_path: Path) -> None:
    limit = 3 * 4096
    cache, loads = DiskCache(str(tmp_path), limit), []
    # Three other processes are filling entries of a page each (their reservations' temp
    # files, named with their sizes): nothing is left to evict for a fourth.
    folder = tmp_path / "fills"
    folder.mkdir()
    for i in range(3):
        (folder / f"data~{4000 + i}-0000000{i}.tmp-{90_000 + i}-abcdef0{i}").touch()
    body = os.urandom(4000)
    assert _fetch(cache, body, loads) == body  # served
    assert len(loads) == 1 and len(_entries(tmp_path)) == 3  # not kept: the fills' only


def test_a_fill_renamed_while_the_cache_is_counted_is_counted(tmp_path: Path,
                                                               monkeypatch) -> None:
    from lakestream.store import diskcache

    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "data~10-00000000").write_bytes(b"x" * 10)
    listed = [(str(tmp_path), ["s"], []),
              (str(folder), [], ["data~10-00000000.tmp-1-abcdef01"])]  # before its rename
    monkeypatch.setattr(diskcache.os, "walk", lambda root: iter(listed))
    assert [(Path(p).name, st.st_size) for p, st in diskcache._files(str(tmp_path))] == [
        ("data~10-00000000", 10)]


@pytest.mark.parametrize("on", ["hit", "miss"])
def test_an_entry_read_for_the_last_time_goes_before_the_least_recently_used(
        tmp_path: Path, on: str) -> None:
    """A reader whose plan will not read a fragment again (``final``) lets it go first: an
    insert past the limit evicts it, not the least recently used entry, whether the last
    read found it on disk or filled it."""
    limit = 3 * 4096 + 100  # three entries of a page each
    cache, loads = DiskCache(str(tmp_path), limit), []
    bodies = [os.urandom(4096) for _ in range(4)]
    for i in range(3):
        _fetch(cache, bodies[i], loads, key=f"data/p/{i}.parquet", final=on == "miss" and i == 2)
        time.sleep(0.02)  # distinct access times
    if on == "hit":
        _fetch(cache, bodies[2], loads, key="data/p/2.parquet", final=True)
    assert len(loads) == 3
    _fetch(cache, bodies[3], loads, key="data/p/3.parquet")  # past the limit: one must go
    assert sorted(p.name.split("~")[0] for p in _entries(tmp_path)) == \
        ["0.parquet", "1.parquet", "3.parquet"]  # 2 went, not 0, the least recently used
    _fetch(cache, bodies[0], loads, key="data/p/0.parquet")
    assert len(loads) == 4


def test_a_last_pass_marks_what_it_reads_and_an_earlier_epoch_does_not(
        tmp_path: Path) -> None:
    """Read through a dataset, the cache's entries are dated back (read for the last time)
    by a stream's only pass and by a mix's last epoch, never by an epoch that a later one
    reads again. (12 steps, a step ahead: the second epoch finds none of the first's
    fragments still in the reader's memory, so it reads them through the cache.)"""
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=8)
    with Producer(uri, "p") as p:
        for k in range(12):
            p.write(rows(8 * k, 8))
    lakestream.open(uri).seal()

    def dated_back(root: Path) -> int:
        now = time.time()
        return sum(1 for e in _entries(root) if e.stat().st_mtime < now - 86400)

    def read(cache: DiskCache, **kw: Any) -> int:
        return len(list(StreamDataset(kw.pop("source", uri), group=None, disk_cache=cache,
                                      prefetch=1, read_threads=1, **kw)))

    once = DiskCache(str(tmp_path / "once"), 1 << 30)
    assert read(once) == 12
    assert len(_entries(tmp_path / "once")) == 12 and dated_back(tmp_path / "once") == 12
    twice = DiskCache(str(tmp_path / "twice"), 1 << 30)
    assert read(twice, source=[Source(uri, 8)], epochs=2, max_steps=12) == 12
    assert len(_entries(tmp_path / "twice")) == 12 and dated_back(tmp_path / "twice") == 0
    assert read(twice, source=[Source(uri, 8)], epochs=2) == 24
    assert dated_back(tmp_path / "twice") == 12 and twice.misses == 12


def _fill(root: str, body: bytes, log: str, start: Any) -> None:
    cache = DiskCache(root, 1 << 20)
    start.wait()

    def load() -> bytes:
        with open(log, "a") as f:
            f.write("load\n")
        time.sleep(0.3)
        return body

    got = cache.fetch(STORE, "data/p/a.parquet", len(body), zlib_ng.crc32(body), load,
                      _checker(body))
    assert bytes(memoryview(got).cast("B")) == body


def test_processes_that_miss_at_once_fetch_once(tmp_path: Path) -> None:
    body = os.urandom(100_000)
    ctx = mp.get_context("fork")
    start = ctx.Event()
    log = str(tmp_path / "loads.txt")
    procs = [ctx.Process(target=_fill, args=(str(tmp_path / "c"), body, log, start))
             for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert Path(log).read_text() == "load\n"


_KILLED_WHILE_FILLING = r"""
import os, sys, time
from zlib_ng import zlib_ng
from lakestream.store import diskcache
from lakestream.store.diskcache import DiskCache
body = bytes(range(256)) * 4000
def stalled(src, dst):
    print("writing", flush=True)
    time.sleep(60)
diskcache.os.replace = stalled  # the entry's bytes are written, not yet in place
def check(data):
    if zlib_ng.crc32(data) != zlib_ng.crc32(body):
        raise ValueError("damaged")
DiskCache(sys.argv[1], 1 << 30).fetch("s3://bucket/stream", "data/p/a.parquet", len(body),
                                      zlib_ng.crc32(body), lambda: body, check)
"""


def test_a_reader_killed_while_filling_leaves_nothing_served(tmp_path: Path) -> None:
    root = tmp_path / "c"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WHILE_FILLING, str(root)],
                             stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[2])
    try:
        assert child.stdout is not None and child.stdout.readline() == "writing\n"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    left = [p.name for p in root.rglob("*") if p.is_file() and ".locks" not in p.parts]
    assert any(".tmp-" in name for name in left)  # the torn fill is there, unnamed
    body = bytes(range(256)) * 4000
    loads: list[int] = []
    assert _fetch(DiskCache(str(root), 1 << 30), body, loads) == body
    assert loads == [1]  # fetched again (the dead writer's lock went with it), no error


def test_a_cache_limit_must_be_a_byte_count(tmp_path: Path) -> None:
    for bad in (-1, True, 1.5, "20GB"):
        with pytest.raises(ValueError, match="cache_limit must be a number of bytes"):
            DiskCache(str(tmp_path), bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="disk_cache must be a lakestream DiskCache"):
        StreamDataset(str(tmp_path), group=None, disk_cache=str(tmp_path))  # type: ignore


def test_a_second_pass_over_s3_fetches_no_fragment(tmp_path: Path, s3_options: dict[str, str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two passes over a stream on SeaweedFS through the cache: the second fetches no
    fragment from the store (counted at the store), and both give the uncached batches."""
    uri = f"s3://{BUCKET}/diskcache-{os.getpid()}-{time.monotonic_ns()}"
    lakestream.create(uri, SCHEMA, global_batch_size=8, storage_options=s3_options)
    with Producer(uri, "p", storage_options=s3_options) as p:
        for k in range(6):
            p.write(rows(8 * k, 8))
    fetched: list[str] = []
    real = S3Store.get_buffer

    def counted(self: S3Store, key: str, size: int) -> Any:
        fetched.append(key)
        return real(self, key, size)

    monkeypatch.setattr(S3Store, "get_buffer", counted)

    def one_pass(cache: DiskCache | None) -> list[list[int]]:
        ds = StreamDataset(uri, group=None, storage_options=s3_options, max_steps=6,
                           disk_cache=cache)
        return [b["id"].tolist() for b in ds]

    plain = one_pass(None)
    assert len(fetched) == 6
    cache = DiskCache(str(tmp_path / "cache"), 1 << 30)
    assert one_pass(cache) == plain and len(fetched) == 12
    assert one_pass(cache) == plain and len(fetched) == 12  # all from the disk
    assert cache.hits == 6 and cache.misses == 6
    assert np.array_equal(sorted(sum(plain, [])), np.arange(48))


def test_a_child_forked_during_a_fill_does_not_keep_its_lock(tmp_path: Path) -> None:
    """A reader forking (a DataLoader's workers) while one of its threads fills an entry:
    the child's copy of the lock file is closed, so the lock goes when the fill ends, not
    when the child exits."""
    cache = DiskCache(str(tmp_path), 1 << 20)
    body = os.urandom(5000)
    child: list[int] = []
    started, ready = os.pipe()

    def load() -> bytes:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child outlives the fill
            os.write(ready, b"x")  # past fork's handlers: its copies of the locks are closed
            time.sleep(5)
            os._exit(0)
        child.append(pid)
        return body

    try:
        cache.fetch(STORE, "data/p/a.parquet", len(body), zlib_ng.crc32(body), load,
                    _checker(body))
        assert os.read(started, 1) == b"x"
        stripes = list((tmp_path / ".locks").iterdir())
        assert stripes
        for lock in stripes:
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no one holds it
            finally:
                os.close(fd)
    finally:
        for pid in child:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(started)
        os.close(ready)


def test_a_failing_cache_disk_is_a_miss_not_an_error(tmp_path: Path) -> None:
    """The cache's own folder broken (here its locks are a file, not a folder): the store
    serves every read, and nothing says the fragment is damaged."""
    cache, loads = DiskCache(str(tmp_path), 1 << 20), []
    shutil.rmtree(tmp_path / ".locks")
    (tmp_path / ".locks").write_text("not a folder")
    body = os.urandom(5000)
    assert _fetch(cache, body, loads) == body
    assert _fetch(cache, body, loads) == body
    assert loads == [1, 1]


def test_a_key_that_would_leave_the_cache_folder_is_refused(tmp_path: Path) -> None:
    cache = DiskCache(str(tmp_path / "c"), 1 << 20)
    body = b"x" * 10
    for key in ("../outside", "/etc/passwd", "data/../../x"):
        with pytest.raises(ValueError, match="object key"):
            cache.fetch(STORE, key, 10, zlib_ng.crc32(body), lambda: body, _checker(body))
    assert not (tmp_path / "outside").exists() and not (tmp_path / "x").exists()


def test_a_count_of_the_disk_keeps_the_room_of_a_fill_not_written_yet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Process A has reserved room for an entry and not written it yet; B's inserts pass the
    limit and count the disk again. That count must see A's reservation, or the two together
    end one entry over the limit (seen as a 4-rank run holding 250 KB under a 200 KB
    limit)."""
    import threading

    from lakestream.store import diskcache

    limit = 3 * 4096 + 100
    real_write = diskcache._write
    reserved, release = threading.Event(), threading.Event()

    def held_in_a(path: str, data: Any, size: int, direct: bool) -> None:
        if threading.current_thread().name == "A":
            reserved.set()
            assert release.wait(30)
        real_write(path, data, size, direct)

    monkeypatch.setattr(diskcache, "_write", held_in_a)
    body_a = os.urandom(4096)
    a = threading.Thread(name="A", target=_fetch,
                         args=(DiskCache(str(tmp_path), limit), body_a, []),
                         kwargs={"key": "data/p/a.parquet"})
    a.start()
    try:
        assert reserved.wait(30)
        b, loads = DiskCache(str(tmp_path), limit), []
        for i in range(3):
            _fetch(b, os.urandom(4096), loads, key=f"data/p/b{i}.parquet")
        done = sum(p.stat().st_size for p in _entries(tmp_path) if ".tmp-" not in p.name)
        assert done + 4096 <= limit, done
    finally:
        release.set()
        a.join(30)
    assert sum(p.stat().st_size for p in _entries(tmp_path)) <= limit
