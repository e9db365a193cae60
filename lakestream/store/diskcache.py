"""A host's disk cache of fragment files, shared by every process on the host that reads
through it (the ranks, their DataLoader workers): a fragment is fetched from the store once
while the cache holds it, whichever process asks, and read from local disk after that (the
second epoch, the other ranks whose slices share the fragment).

Under the cache's folder:

    <store>/<key>~<size>-<crc32>   a fragment's bytes, whole (the store's URI hashed to <store>)
    <store>/<key>~...tmp-<pid>-<r> one being written; never read, removed once stale
    .locks/<n>                     1,024 lock files, each guarding the entries hashed to it
    .usage                         the bytes the entries hold, under .locks/usage

Every file is served only after its bytes match the CRC-32 the log recorded for it; one that
does not (a damaged disk) is deleted and fetched again. An entry is written under a
temporary name and renamed into place once whole, so a process killed while filling leaves
nothing a later one serves. A process that misses takes the entry's lock (``flock``) before
fetching, so processes that miss at once fetch once: the others wait, then read the file.
The entries hold at most ``limit`` bytes on disk: an insert that would pass it first deletes
the entries their readers' plans will not read again (``final``: a stream's only pass, the
last epoch of a mix), those read last time longest ago first, then the least recently used
(a hit touches its entry); where fills under way hold the room, the fragment is served and
not kept. A read for the last time sets the entry's time ``DONE_AGE_S``
back, so one order serves both, across processes: such an entry sorts before any in use.

Only fragments fetched whole go through it (up to 8 MB, or up to 256 MB when a read wants
half their rows: ``lakestream.log.fragments.read_whole``); a larger one read by row group,
the log and the index segments are read from the store as before.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from lakestream.failpoints import failpoint
from lakestream.store.base import Buffer, check_key
from lakestream.store.pool import buffer_pool, read_file, whole_pages
from lakestream.store.slots import cpu_slots

STRIPES = 1024
"""Lock files: entries hashed onto them, so one miss blocks only the misses of its stripe."""
STALE_TMP_S = 3600.0
"""A temporary file this old was left by a killed writer (a fill takes one GET)."""
RESCAN_INSERTS = 256
"""Inserts on the host between counts of the usage from the disk (what a killed process
reserved and never wrote, or wrote and never counted)."""
LOW_WATER = 0.9
"""An insert that would pass the limit evicts down to this share of it."""
DONE_AGE_S = 10 * 365 * 86400.0
"""How far back an entry read for the last time is dated: before every entry in use."""
_TMP = ".tmp-"


class DiskCache:
    """Fragments of any stream, cached under ``root`` (made if missing) within ``limit``
    bytes. Thread- and process-safe; nothing to close.

    ``direct`` (the default): entries are written and read around the page cache
    (``O_DIRECT``, where the file system allows; through it elsewhere, tmpfs say). Filling
    pages of the page cache cost 2.3 CPU-s per GB on this project's VMs; around it, two
    passes over S3 through the cache spent 0.80 and 0.30 CPU-s per GB, through it 1.57 and
    0.32, and the second pass ran at 0.65x tmpfs's rate (the disk's pace: 2.1-2.4 GB/s on
    this VM) against 1.15x, where spare memory held every file (``bench/s3cache.py``, 2
    cores). ``direct=False`` leaves the files to the page cache, for a host whose spare
    memory holds the whole cache."""

    def __init__(self, root: str, limit: int, *, direct: bool = True) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"cache_limit must be a number of bytes >= 0, got {limit!r}")
        self.root = os.path.abspath(root)
        self.limit = limit
        self.direct = bool(direct) and _DIRECT != 0
        os.makedirs(os.path.join(self.root, ".locks"), exist_ok=True)
        self.hits = self.misses = self.fetched_bytes = 0
        """Reads served from the disk, from the store, and the bytes the store served."""

    def __repr__(self) -> str:
        return f"DiskCache({self.root!r}, limit={self.limit})"

    def fetch(self, store: str, key: str, size: int, crc32: int,
              load: Callable[[], Buffer], check: Callable[[Buffer], None], *,
              final: bool = False) -> Buffer:
        """The fragment ``key`` of the store at URI ``store``, ``size`` bytes with CRC-32
        ``crc32``: from the disk if held and ``check`` passes on it, else ``load()``ed,
        checked and kept; if ``final`` (the reader's plan will not read it again), kept
        among the first to go. ``check`` raises (ValueError) on bytes that differ from the log's
        record; raised on what the store served, it reaches the caller. A failure of the
        cache's own disk (unreadable, full, read-only) is a miss: the store serves.

        Raises:
            ValueError: ``key`` is not a safe relative key (``check_key``), or the store's
                bytes fail ``check``.
        """
        path = os.path.join(self.root, hashlib.sha256(store.encode()).hexdigest()[:16],
                            f"{check_key(key)}~{size}-{crc32:08x}")  # never out of the root
        data = self._held(path, size, check, final)
        if data is not None:
            return data
        lock = self._lock(str(_stripe(path)))
        try:
            if lock is not None:
                data = self._held(path, size, check, final)  # filled by another meanwhile
                if data is not None:
                    return data
            data = load()
            check(data)
            self.misses += 1
            self.fetched_bytes += size
            if lock is not None and _padded(size) <= self.limit:
                self._insert(path, data, size, final)
            return data
        finally:
            if lock is not None:
                _unlock(lock)

    def _held(self, path: str, size: int, check: Callable[[Buffer], None], final: bool
              ) -> Buffer | None:
        try:
            data = _read(path, size, self.direct)
        except OSError:  # the cache's disk failed: a miss
            return None
        if data is None:
            return None
        try:
            if len(data) != size:
                raise ValueError("not the size the log records")
            check(data)
        except ValueError:
            with contextlib.suppress(OSError):
                os.unlink(path)  # damaged on disk: fetched again
            return None
        _touch(path, final)
        self.hits += 1
        return data

    def _lock(self, name: str) -> int | None:
        """The lock file ``name``, locked (``flock``): its descriptor, None if the cache's
        disk fails. Waited for out of the CPU slot: another process holds it."""
        try:
            fd = os.open(os.path.join(self.root, ".locks", name),
                         os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return None
        _HELD.add(fd)
        try:
            with cpu_slots().waiting():
                fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            _unlock(fd)
            return None
        except BaseException:
            _unlock(fd)
            raise
        return fd

    def _insert(self, path: str, data: Buffer, size: int, final: bool) -> None:
        """Keeps ``data`` at ``path``: its room reserved first (evicting what must go), then
        written under a temporary name and renamed into place; on a failing disk, nothing."""
        writing = _padded(size)  # a direct write's file, before its cut
        tmp = f"{path}{_TMP}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if not self._account(writing, tmp):
            return
        try:
            _write(tmp, data, size, self.direct)
            failpoint("during_cache_fill")
            os.replace(tmp, path)
            if final:
                _touch(path, final)
        except OSError:  # a full or read-only disk: serve what was fetched, keep nothing
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            self._account(-writing)

    def _account(self, n: int, placeholder: str | None = None) -> bool:
        """Adds ``n`` bytes to the usage, under the host's usage lock: a reservation
        (``n > 0``) first evicts the least recently used entries if it would pass the
        limit, down to ``LOW_WATER`` of it, so that the inserts after it need not; every
        ``RESCAN_INSERTS`` the usage is counted again from the disk. A reservation's
        temporary file (``placeholder``, named with its size) is made under the lock, so
        that a count of the disk by another process, before the bytes are written, sees
        the room it holds. False if the cache's disk fails, or if a reservation finds no
        room once all it may evict is gone (fills under way hold the rest: many processes
        filling at once under a small limit), and the fragment is served, not kept."""
        lock = self._lock("usage")
        if lock is None:
            return False
        try:
            usage, inserts = self._usage()
            if n > 0:
                inserts += 1
                over = usage is None or usage + n > self.limit
                if over or inserts >= RESCAN_INSERTS:
                    room = self.limit - n
                    usage = self._evict(min(room, int(self.limit * LOW_WATER)) if over
                                        else room)
                    inserts = 0
                    if usage > room:  # fills under way hold the rest: not kept
                        self._set_usage(usage, inserts)
                        return False
            if placeholder is not None:
                os.makedirs(os.path.dirname(placeholder), exist_ok=True)
                os.close(os.open(placeholder, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                                 | os.O_CLOEXEC, 0o600))
            self._set_usage(max(0, (usage or 0) + n), inserts)
            return True
        except OSError:
            return False
        finally:
            _unlock(lock)

    def _usage(self) -> tuple[int | None, int]:
        """(bytes the entries hold, inserts since the last count) as ``.usage`` says; None
        for the bytes where it cannot be read."""
        try:
            with open(os.path.join(self.root, ".usage")) as f:
                held, inserts = f.read(64).split()
            return int(held), int(inserts)
        except (OSError, ValueError):
            return None, 0

    def _set_usage(self, n: int, inserts: int) -> None:
        tmp = os.path.join(self.root, f".usage{_TMP}{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(f"{n} {inserts}")
        os.replace(tmp, os.path.join(self.root, ".usage"))

    def _evict(self, room: int) -> int:
        """Deletes entries until they hold at most ``room`` bytes, the earliest dated first
        (those read for the last time, then the least recently used), and temporary files
        left by killed writers; returns what the entries hold."""
        entries: list[tuple[float, int, str]] = []
        now = time.time()
        filling = 0  # temporary files of fills under way, at the size reserved for them
        for path, st in _files(self.root):
            if _TMP in os.path.basename(path):
                if now - st.st_mtime > STALE_TMP_S:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                else:
                    reserved = _RESERVED.search(os.path.basename(path))
                    filling += _padded(int(reserved.group(1))) if reserved else st.st_size
                continue
            entries.append((st.st_mtime, st.st_size, path))
        held = filling + sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if held <= room:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            held -= size
        return held


_DIRECT = getattr(os, "O_DIRECT", 0)
_ALIGN = 4096


_RESERVED = re.compile(r"~(\d+)-[0-9a-f]{8}" + re.escape(_TMP))
"""The size in a temporary file's name (its entry's, before the temporary suffix)."""
_HELD: set[int] = set()
"""Lock files this process has open: a forked child closes its copies, or a lock held here
when it forked would stay held until the child exits."""


def _unlock(fd: int) -> None:
    _HELD.discard(fd)
    os.close(fd)  # and the lock with it, once no forked copy holds it


def _close_held_after_fork() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_after_fork)


def _touch(path: str, final: bool) -> None:
    """Dates the entry at ``path`` now: recently used; ``DONE_AGE_S`` earlier if ``final``."""
    now = time.time()
    when = now - DONE_AGE_S if final else now
    with contextlib.suppress(OSError):
        os.utime(path, (when, when))


def _padded(size: int) -> int:
    """``size`` rounded up to what a direct read or write moves."""
    return -(-size // _ALIGN) * _ALIGN


def _write(path: str, data: Buffer, size: int, direct: bool) -> None:
    """Writes ``data`` (``size`` bytes) into the empty file at ``path``; with ``direct``, around
    the page cache where the file system allows: a buffered write of a fetched fragment took
    2.3 CPU-s per GB on this project's VMs (every page of the page cache faulted in and
    copied to), a direct one 0.03 from the pool block the fetch filled (``whole_pages``: its
    last page's tail written too, then cut off) and 0.17-0.30 from other memory, copied into
    an aligned block first (9.6 MB fragments, 2 cores). The disk's time is waited out of the
    CPU slot."""
    src = memoryview(data).cast("B")
    if direct:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | _DIRECT)
        except OSError:  # tmpfs and some others refuse O_DIRECT
            fd = -1
        if fd >= 0:
            try:
                padded = _padded(size)
                view = whole_pages(data, padded)  # a pool block from the fetch: as it is
                if view is None:
                    block = buffer_pool().array(padded)  # page-aligned, as O_DIRECT needs
                    block[:size] = np.frombuffer(src, np.uint8)
                    view = memoryview(block)  # type: ignore[arg-type]
                at = 0
                with cpu_slots().waiting():
                    while at < padded:
                        at += os.pwrite(fd, view[at:], at)
                    os.ftruncate(fd, size)
                return
            except OSError as e:
                if e.errno != errno.EINVAL:  # not a refusal of the direct write itself
                    raise
            finally:
                os.close(fd)
    with open(path, "wb") as f:  # from its start again after a refused direct write
        f.write(src)


def _read(path: str, size: int, direct: bool) -> Buffer | None:
    """The file at ``path``, None if it is not there, fewer bytes if it is not ``size``
    bytes long; with ``direct``, read around the page cache where the file system allows, into an
    aligned block of the process's pool (a file written around the page cache is not in
    it, and faulting it in cost what the write saved)."""
    if direct:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | _DIRECT)
        except FileNotFoundError:
            return None
        except OSError:  # refused: read through the page cache
            fd = -1
        if fd >= 0:
            try:
                if os.fstat(fd).st_size != size:
                    return b""
                with cpu_slots().waiting():  # the disk's time
                    return read_file(fd, size, _padded(size))  # short: refused by the caller
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
            finally:
                os.close(fd)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return read_file(fd, size) if os.fstat(fd).st_size == size else b""
    finally:
        os.close(fd)


def _files(root: str) -> Iterator[tuple[str, Any]]:
    """Every entry file under ``root`` (not its locks or usage), with its ``stat``."""
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == root:
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            continue
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                if _TMP not in name:
                    continue  # evicted meanwhile
                # A fill renamed into place since the listing, perhaps too late to be
                # listed under its own name: counted under it (twice at worst, never not).
                path = path[:path.rindex(_TMP)]
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
            yield path, st


def _stripe(path: str) -> int:
    """The lock stripe of the entry at ``path``."""
    return int.from_bytes(hashlib.blake2b(path.encode(), digest_size=4).digest(), "big") \
        % STRIPES
