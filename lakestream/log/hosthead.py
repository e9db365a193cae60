"""The log's head shared by the processes of one host: what one process read at a remote
stream's head (an entry's bytes, or the next version found absent) is left in a folder of
the host for the others, so that the host, not each process, sends one GET per new version
and one per pacing round.

Eight ranks a host each tailing the log through their own process's head
(``lakestream.log.head``) send eight times the host's requests, most of them polls that find
nothing: at 512 ranks, twice to four times what one S3 prefix serves
(``docs/design.md`` §12). Here, per stream, in ``<host dir>/heads/<stream>/``:

- ``<version>.json``: the bytes of an entry some process of the host read. Entries never
  change once written; the file is put in place whole (a temp file renamed), so a process
  killed while writing it leaves nothing read. The newest ``KEPT`` are kept.
- ``absent``: ``<version> <until>``: the version some process found absent, and until when
  (``time.monotonic()``, one clock for the host's processes) the others take it as absent
  without asking: the pause the in-process head would have made, dated from the GET's
  sending, shared. An end further off than a pause can be (a marker from before a reboot,
  another host's clock) is not trusted.
- ``budget``: ``<spent to>``: how far the host's reads that found nothing have spent its
  budget of them (``time.monotonic()``; ``lakestream.log.head.EMPTY_POLLS_PER_S``), read and
  moved on under ``locks/budget``, so that a host's processes together send what one would.
  A value further off than ``BUDGET_AHEAD_S`` is not trusted (a reboot's, another clock's).
- ``locks/<n>``: one process of the host reads a version from the store at a time (an
  ``flock`` per slot of versions); the others wait for its answer, at most ``WAIT_S``, then
  read for themselves. A child forked while its parent holds one closes its copy.

A damaged or unreadable file is a miss: the store is asked. Only readers at the head use
it, as the in-process head (a committer must see every rival at once); only for streams on
a remote store (a local one answers a poll for less than the folder does). The folder is
``LAKESTREAM_HOST_DIR`` (``off`` turns this off), by default ``/dev/shm`` (memory, not disk),
else the temp folder, under ``lakestream-<uid>``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator

from lakestream.log.entries import MAX_ENTRY_BYTES

KEPT = 128
"""Entries each stream's folder keeps (the newest): what a reader a few versions behind
catches up from; older ones it reads from the store."""
WAIT_S = 1.0
"""The longest a process waits for another of its host reading the same version."""
SLOTS = 16
"""Lock slots per stream: a catch-up reads several versions in parallel."""
STALE_S = 86_400.0
"""A stream's folder untouched this long is removed by the next process that sets up one."""
ENV = "LAKESTREAM_HOST_DIR"
BUDGET_AHEAD_S = 60.0
"""The furthest ahead of now the host's budget may have been spent: a ``budget`` further off
was not written by this host since it booted."""


class HostHead:
    """One stream's shared head in the host folder ``folder``."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        os.makedirs(os.path.join(folder, "locks"), mode=0o700, exist_ok=True)

    @classmethod
    def for_stream(cls, uri: str, created_ms: int) -> HostHead | None:
        """The host's head of the stream at ``uri`` created at ``created_ms``; None if the
        host folder is turned off or cannot be made (each process then reads alone)."""
        folder = stream_folder("heads", uri, created_ms)
        try:
            return None if folder is None else cls(folder)
        except OSError:
            return None

    def entry(self, version: int) -> bytes | None:
        """The bytes of ``version`` if a process of the host read them (a file larger than
        any entry may be is not one: a miss)."""
        try:
            with open(self._path(version), "rb") as f:
                data = f.read(MAX_ENTRY_BYTES + 1)
        except OSError:
            return None
        return data if len(data) <= MAX_ENTRY_BYTES else None

    def absent_until(self, version: int, longest_s: float) -> float | None:
        """When the pause runs out that a process of the host set on finding ``version``
        (or one before it) absent, if it has not yet; None if none holds. A pause longer
        than ``longest_s`` from now is none a process sets (a marker from before a reboot,
        or another host's clock): not trusted."""
        try:
            with open(os.path.join(self.folder, "absent"), "rb") as f:
                seen, until = f.read(64).split()
            now, end = time.monotonic(), float(until)
        except (OSError, ValueError):
            return None
        return end if int(seen) <= version and now < end <= now + longest_s else None

    def found(self, version: int, data: bytes) -> None:
        """Leaves the entry read at ``version`` for the host, dropping the one ``KEPT``
        versions older first (and, every ``KEPT`` versions, all older ones and temp files
        of writers killed mid-write)."""
        with contextlib.suppress(OSError):
            if version >= KEPT:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(version - KEPT))
            if version % KEPT == 0:
                self._trim(version - KEPT)
            self._put(self._path(version), data)

    def spend(self, sent: float, cost_s: float) -> float | None:
        """Spends ``cost_s`` of the host's budget of reads that find nothing, for one sent
        at ``sent`` (monotonic): returns how far the budget is now spent (at least
        ``sent + cost_s``); None if the folder fails (the process keeps its own budget)."""
        path = os.path.join(self.folder, "budget")
        with self._lock_file("budget") as fd:
            if fd is None:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    with open(path, "rb") as f:
                        spent = float(f.read(64))
                except (OSError, ValueError):
                    spent = 0.0
                if not math.isfinite(spent) or spent > time.monotonic() + BUDGET_AHEAD_S:
                    spent = 0.0  # damaged, or not this boot's: a fresh budget
                spent = max(spent, sent) + cost_s
                self._put(path, repr(spent).encode())
                return spent
            except OSError:
                return None

    def found_absent(self, version: int, until: float) -> None:
        """Leaves "``version`` is absent until ``until``" for the host."""
        with contextlib.suppress(OSError):
            self._put(os.path.join(self.folder, "absent"), f"{version} {until!r}".encode())

    @contextlib.contextmanager
    def reading(self, version: int) -> Iterator[None]:
        """Holds the host's read of ``version`` (its slot's lock) while the store is asked;
        after ``WAIT_S`` behind another process, goes on without it."""
        with self._lock_file(str(version % SLOTS)) as fd:
            deadline = time.monotonic() + WAIT_S
            while fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EACCES) or \
                            time.monotonic() >= deadline:
                        break  # read alone
                    time.sleep(0.002)
            yield

    @contextlib.contextmanager
    def _lock_file(self, name: str) -> Iterator[int | None]:
        """The lock file ``locks/<name>``, open and not yet locked (None if it cannot be
        opened), closed afterwards, which releases a lock taken on it."""
        try:
            fd = os.open(os.path.join(self.folder, "locks", name), os.O_RDWR | os.O_CREAT,
                         0o600)
        except OSError:
            yield None
            return
        _held.add(fd)
        try:
            yield fd
        finally:
            _held.discard(fd)
            os.close(fd)

    def _path(self, version: int) -> str:
        return os.path.join(self.folder, f"{version:020d}.json")

    def _put(self, path: str, data: bytes) -> None:
        put_whole(path, data, os.path.join(self.folder, "locks"))

    def _trim(self, below: int) -> None:
        """Removes the entries of versions below ``below`` and temp files a minute old."""
        now = time.time()
        for entry in os.scandir(self.folder):
            name = entry.name
            with contextlib.suppress(OSError, ValueError):
                if ".tmp-" in name and now - entry.stat().st_mtime > 60 or \
                        name.endswith(".json") and int(name[:-5]) < below:
                    os.unlink(entry.path)


_held: set[int] = set()
"""The descriptors of the lock slots this process holds now."""


def _release_in_child() -> None:
    """A forked child shares its parent's locks: it closes its copies of those held at the
    fork, or a slot stays locked while the child lives (every read of it waiting
    ``WAIT_S``)."""
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_release_in_child)


def put_whole(path: str, data: bytes, folder: str) -> None:
    """Puts ``data`` at ``path`` whole: written under a temporary name, then renamed, so a
    process killed meanwhile leaves nothing read there. ``folder`` (holding ``path``) is made
    again if it was removed (pruned, or by the OS).

    Raises:
        OSError: the file could not be written.
    """
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        try:
            f = open(tmp, "wb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            f = open(tmp, "wb")  # noqa: SIM115
        with f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def stream_folder(kind: str, uri: str, created_ms: int) -> str | None:
    """``<host dir>/<kind>/<stream>``, the folder of the host where its processes share
    ``kind`` for the stream at ``uri`` created at ``created_ms`` (the folders of streams
    untouched for ``STALE_S`` pruned); None if the host folder is turned off (``ENV``), cannot
    be made, or is another user's."""
    base = os.environ.get(ENV)
    if base is not None and base.strip().lower() in ("", "0", "off", "none"):
        return None
    if base is None:
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    root = os.path.join(base, f"lakestream-{os.getuid()}")
    folders = os.path.join(root, kind)
    name = hashlib.sha256(f"{uri}\0{created_ms}".encode()).hexdigest()[:32]
    try:
        os.makedirs(folders, mode=0o700, exist_ok=True)
        if os.stat(root).st_uid != os.getuid():
            return None  # another user's folder: never trust its files
        _prune(folders, keep=name)
    except OSError:
        return None
    return os.path.join(folders, name)


def _prune(heads: str, keep: str) -> None:
    """Removes the folders of streams no process of the host has touched for ``STALE_S``."""
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(heads):
            if entry.name != keep and entry.is_dir(follow_symlinks=False) \
                    and now - entry.stat(follow_symlinks=False).st_mtime > STALE_S:
                shutil.rmtree(entry.path, ignore_errors=True)
