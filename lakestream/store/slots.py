"""The CPU slots of a process's reads: per-byte work (a local store's read, which is a copy
from the page cache, checksums, copies into a batch, decodes, collation, transforms) runs in
at most as many threads at once as the process has cores for it, taken in the order the
threads asked; a thread that waits for a remote store's answer gives its slot up meanwhile.

So read threads beyond the cores cost no CPU of their own: they only add fetches in flight,
which is what a remote store's latency needs. Without the slots, 15 read threads on 2 cores
spent 1.3-1.7x the CPU per GB of one (switching, and 15 batches' buffers passing through the
caches at once) and delivered no more (``bench/ceiling.py``).
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Iterator


class CpuSlots:
    """``size`` slots, handed out first come, first served. ``held()`` runs a block in a slot
    (in one already if the thread holds one); ``waiting()`` runs a block out of the thread's
    slot, if it holds one, and takes a slot again after it, and adds the block's time to
    the thread's ``waited_s()``. Thread-safe."""

    def __init__(self, size: int = 1) -> None:
        self._lock = threading.Lock()
        self._size = max(1, size)
        self._busy = 0
        self._queue: collections.deque[threading.Event] = collections.deque()
        self._mine = threading.local()

    @property
    def size(self) -> int:
        return self._size

    def resize(self, size: int) -> None:
        """Sets the number of slots (at least 1); waiting threads take any freed now."""
        with self._lock:
            self._size = max(1, size)
            self._admit()

    def _admit(self) -> None:
        while self._queue and self._busy < self._size:
            self._busy += 1
            self._queue.popleft().set()

    def _take(self) -> None:
        with self._lock:
            if self._busy < self._size and not self._queue:
                self._busy += 1
                return
            turn = threading.Event()
            self._queue.append(turn)
        try:
            turn.wait()
        except BaseException:  # interrupted while queued: give back the slot if handed one
            with self._lock:
                if turn in self._queue:
                    self._queue.remove(turn)
                else:
                    self._busy -= 1
                    self._admit()
            raise

    def _give(self) -> None:
        with self._lock:
            self._busy -= 1
            self._admit()

    def waited_s(self) -> float:
        """The seconds this thread has spent in counted ``waiting()`` blocks (not counting
        the wait for a slot after them: that is the CPU's queue, not the store's): what a
        reader measures a read's waiting on its store by."""
        return getattr(self._mine, "waited", 0.0)

    def holds(self) -> bool:
        """Whether this thread is in a slot."""
        return getattr(self._mine, "held", False)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        if self.holds():
            yield
            return
        self._take()
        self._mine.held = True
        try:
            yield
        finally:
            self._mine.held = False
            self._give()

    @contextlib.contextmanager
    def waiting(self, *, counted: bool = True) -> Iterator[None]:
        """Runs the block out of the thread's slot, if it holds one. Its time is added to
        ``waited_s()`` unless ``counted`` is false (a wait for another thread's work, which
        may be CPU, not the store's answer), or it is inside another ``waiting()`` block
        (which counts it once)."""
        held = self.holds()
        if held:
            self._mine.held = False
            self._give()
        depth = getattr(self._mine, "depth", 0)
        self._mine.depth = depth + 1
        began = time.perf_counter()
        try:
            yield
        finally:
            self._mine.depth = depth
            if counted and depth == 0:
                self._mine.waited = self.waited_s() + time.perf_counter() - began
            if held:
                self._take()
                self._mine.held = True

    def _after_fork(self) -> None:
        # The threads that held slots in the parent are not in the child.
        self._lock = threading.Lock()
        self._busy = 0
        self._queue = collections.deque()
        self._mine = threading.local()


_SLOTS = CpuSlots()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_SLOTS._after_fork)


def cpu_slots() -> CpuSlots:
    """The process's slots (what every reader of the process runs its per-byte work in); a
    loader sizes them to the cores its process is given."""
    return _SLOTS
