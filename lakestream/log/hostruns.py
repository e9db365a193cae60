"""Runs waiting for a host's shared commit: where the producers of one host leave the
fragments they uploaded for whichever of them commits for the host, and the lock that makes
one of them that committer (docs/design.md §5, *Commits shared by a host*).

Per stream, in ``<host dir>/commits/<stream>/`` (``lakestream.log.hosthead.stream_folder``):

- ``<epoch>-<first>-<last>-<producer>.json``: a run of one producer's uploaded
  fragments, contiguous seqs ``first..last``, with the state each was written with. A
  producer leaves one when its fragments are uploaded; the file is put in place whole (a
  temp file renamed), so a process killed while writing it leaves nothing read, and is
  never changed after. The committer removes it once the log holds its seqs (or a newer
  epoch fenced its producer); the producer learns its run landed from the log, never from
  the file.
- ``lock``: the host's committer holds an ``flock`` on it for as long as it commits for
  the host. The kernel drops it when that process dies, and another producer takes it.

The committer also binds a datagram socket, named (in Linux's abstract namespace: no file)
after the folder, which a producer pokes when it leaves a run, so that the committer waits
for runs without looking for them; a poke lost, or a socket not bound, costs only the
committer's slower look (``wait``'s timeout).

A run older than ``STALE_S`` is removed, not committed: gc keeps a live producer's uploads
for a day (``lakestream.log.gc.IN_FLIGHT_MIN_AGE_S``), never less, so a run is committed
only while its files are sure to be there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import select
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from lakestream.log.commits import Run, Stored, Uploaded
from lakestream.log.entries import check_state
from lakestream.log.hosthead import put_whole, stream_folder
from lakestream.log.keys import check_producer_id, key_writer
from lakestream.store.parse import MAX_INT

STALE_S = 3600.0
"""A run older than this is dropped rather than committed."""
MAX_RUN_BYTES = 64 << 20
"""A run file larger than this is not one a producer wrote: skipped."""


class Published(NamedTuple):
    """A run found in the folder: its file's name, and the run."""

    name: str
    run: Run


class HostRuns:
    """One stream's shared-commit folder on this host."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        os.makedirs(folder, mode=0o700, exist_ok=True)
        digest = hashlib.sha256(f"{socket.gethostname()}\0{folder}".encode()).hexdigest()
        self.host = "@" + digest[:16]
        """The host's committers as one writer in the log (no producer id starts so)."""
        self._fd: int | None = None
        """The lock file, open while this process may want the lock."""
        self._leading = False
        self._touched = -math.inf
        self._wake_name = b"\0lakestream-commits-" + digest[16:48].encode()
        self._wake: socket.socket | None = None
        self._poker = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._poker.setblocking(False)

    @classmethod
    def for_stream(cls, uri: str, created_ms: int) -> HostRuns | None:
        """The folder for the stream at ``uri`` created at ``created_ms``; None if the host
        folder is turned off or cannot be made."""
        folder = stream_folder("commits", uri, created_ms)
        try:
            return None if folder is None else cls(folder)
        except OSError:
            return None

    # -- a producer's side -------------------------------------------------------------

    def publish(self, producer: str, epoch: int, fragments: Sequence[Uploaded]) -> str:
        """Leaves ``fragments`` (contiguous seqs, in order) for the host's committer;
        returns the file's name.

        Raises:
            OSError: the file could not be written.
        """
        name = f"{epoch}-{fragments[0].seq}-{fragments[-1].seq}-{producer}.json"
        body = json.dumps(run_doc(Run(producer, epoch, fragments)), allow_nan=False,
                          separators=(",", ":")).encode()
        put_whole(os.path.join(self.folder, name), body, self.folder)
        return name

    def poke(self) -> None:
        """Tells the host's committer that a run waits (nothing if none listens)."""
        with contextlib.suppress(OSError):
            self._poker.sendto(b"!", self._wake_name)

    def waiting(self, name: str) -> bool:
        """Whether the run ``name`` is still in the folder."""
        return os.path.exists(os.path.join(self.folder, name))

    # -- the host committer's side -----------------------------------------------------

    @property
    def leading(self) -> bool:
        """Whether this process holds the host's commit lock through this folder."""
        return self._leading

    def lead(self) -> bool:
        """Takes the host's commit lock if no process holds it; True if this one does."""
        self._touch()
        if self._leading:
            return True
        if self._fd is None:
            with _fork_lock:  # a child forked in between would not know to close it
                try:
                    self._fd = os.open(os.path.join(self.folder, "lock"),
                                       os.O_RDWR | os.O_CREAT, 0o600)
                except OSError:
                    return False
                _held.add(self._fd)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        self._leading = True
        return True

    def wait(self, timeout: float) -> None:
        """Waits, as the host's committer, until a producer pokes (or ``timeout``), then
        takes every poke waiting; sleeps ``timeout`` if the socket cannot be bound."""
        if self._wake is None:
            with _fork_lock:
                wake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                try:
                    wake.bind(self._wake_name)
                except OSError:  # another process's (one that lost the lock, not closed)
                    wake.close()
                    time.sleep(timeout)
                    return
                wake.setblocking(False)
                self._wake = wake
                _held.add(wake.fileno())
        select.select([self._wake], [], [], timeout)
        with contextlib.suppress(OSError):
            while self._wake.recv(64):
                pass

    def resign(self) -> None:
        """Lets the lock go, for another producer of the host to take."""
        with _fork_lock:
            if self._wake is not None:
                _held.discard(self._wake.fileno())
                self._wake.close()
                self._wake = None
            if self._fd is not None:
                _held.discard(self._fd)
                with contextlib.suppress(OSError):
                    os.close(self._fd)  # which drops the lock
                self._fd = None
        self._leading = False

    def _touch(self) -> None:
        """Marks the folder in use, at most once a minute: the host prunes folders of
        streams untouched for a day (``lakestream.log.hosthead.STALE_S``), and producers
        that write nothing for a day still hold its lock."""
        now = time.monotonic()
        if now - self._touched >= 60.0:
            self._touched = now
            with contextlib.suppress(OSError):
                os.utime(self.folder)

    def gather(self) -> list[Published]:
        """The runs in the folder, oldest seqs first per producer; those older than
        ``STALE_S`` removed, and files that are not runs (damaged, another writer's)
        skipped."""
        found: list[Published] = []
        now = time.time()
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return found
        for entry in entries:
            name = entry.name
            if not name.endswith(".json"):
                with contextlib.suppress(OSError):  # a writer killed mid-write
                    if ".tmp-" in name and now - entry.stat().st_mtime > 60:
                        os.unlink(entry.path)
                continue
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError, IndexError,
                                     RecursionError):
                st = entry.stat()
                if now - st.st_mtime > STALE_S:
                    os.unlink(entry.path)
                    continue
                if st.st_size > MAX_RUN_BYTES:
                    continue
                with open(entry.path, "rb") as f:
                    doc = json.loads(f.read())
                found.append(Published(name, run_from(doc, name)))
        found.sort(key=lambda p: (p.run.producer, p.run.fragments[0].seq))
        return found

    def remove(self, names: Sequence[str]) -> None:
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.folder, name))


def run_doc(run: Run) -> dict[str, Any]:
    """``run`` as JSON values (what ``run_from`` reads back)."""
    return {"producer": run.producer, "epoch": run.epoch,
            "fragments": [[u.seq, u.key, u.rows, u.size, u.crc32, u.state]
                          for u in run.fragments]}


def run_from(doc: Any, name: str) -> Run:
    """A run's JSON values (``run_doc``) as a run, checked: every fragment's key is the
    file its producer writes at that epoch and seq, and the seqs are contiguous; ``name``
    says where it was found.

    Raises:
        ValueError, KeyError, TypeError, IndexError: it is not a run a producer wrote.
    """
    producer, epoch = check_producer_id(doc["producer"]), doc["epoch"]
    if type(epoch) is not int:
        raise TypeError("epoch")
    fragments = tuple(Stored(key, rows, size, seq, crc, state)
                      for seq, key, rows, size, crc, state in doc["fragments"])
    for i, u in enumerate(fragments):
        if key_writer(u.key) != (producer, epoch, u.seq) or \
                u.seq != fragments[0].seq + i or not all(
                    type(v) is int and low <= v <= high
                    for v, low, high in ((u.rows, 1, MAX_INT), (u.size, 0, MAX_INT),
                                         (u.seq, 0, MAX_INT), (u.crc32, -1, 0xFFFFFFFF))):
            raise ValueError(f"{name} is not a run its producer wrote")
        check_state(u.state)
    if not fragments:
        raise ValueError(f"{name} holds an empty run")
    return Run(producer, epoch, fragments)


_held: set[int] = set()
"""The lock files (one per producer sharing its host's commits) and wake-up sockets (one per
host committer) this process has open."""


_fork_lock = threading.Lock()
"""Held while a lock file is opened or closed, and across a fork, so that a child knows
every lock file its parent had open."""


def _release_in_child() -> None:
    """A forked child shares its parent's locks and sockets: it closes its copies, or the
    host's producers would find a lock held, and poke a socket nobody reads, for as long as
    the child lives, though the parent is gone."""
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()
    _fork_lock.release()


os.register_at_fork(before=_fork_lock.acquire, after_in_parent=_fork_lock.release,
                    after_in_child=_release_in_child)
