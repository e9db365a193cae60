"""The decoded fragments a reader's threads share, bounded in bytes, with the windows of a
shuffled reader as generations."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future

import pyarrow as pa


class FragmentCache:
    """Decoded fragments, least recently used first out, bounded in bytes, shared by the
    threads of a reader: a fragment that several of them ask for at once is decoded once.

    A shuffled reader's windows are generations: each read of a step is wrapped in
    ``begin(g)`` / ``end(g)`` with its window g. When a read ends, a table is dropped if it
    was last used before both the latest generation begun and every generation still being
    read: once the next window is read and no read of the one before is in flight, the one
    before is done with. (Keeping it until the window after held twice the memory, and the
    allocator handed its pages back to have the kernel zero them again: ``bench/mixing.py``.)
    A reader whose windows of steps do not line up with its sources' windows keeps one
    generation more (``end(g, keep=1)``): a source window then spans two of its windows."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._generation = 0
        self._active: dict[int, int] = {}
        self._used: dict[tuple[str, str], int] = {}
        self._tables: OrderedDict[tuple[str, str], pa.Table] = OrderedDict()
        self._loading: dict[tuple[str, str], Future[pa.Table]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.decoded = 0
        """Fragments decoded through the cache (misses)."""

    def fetch(self, key: tuple[str, str], load: Callable[[], pa.Table]) -> pa.Table:
        """The table cached under ``key``, else ``load()``'s (once, whoever asks)."""
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
                self._used[key] = self._generation
                return table
            pending = self._loading.get(key)
            if pending is None:
                pending = self._loading[key] = Future()
                mine = True
            else:
                mine = False
        if not mine:
            return pending.result()
        try:
            table = load()
        except BaseException as e:
            with self._lock:
                del self._loading[key]
            pending.set_exception(e)
            raise
        with self._lock:
            del self._loading[key]
            self.decoded += 1
            self._tables[key] = table
            self._used[key] = self._generation
            self._bytes += table.nbytes
            while self._bytes > self.max_bytes and len(self._tables) > 1:
                gone, old = self._tables.popitem(last=False)
                del self._used[gone]
                self._bytes -= old.nbytes
        pending.set_result(table)
        return table

    def begin(self, generation: int) -> None:
        """A read of a step of ``generation`` starts (entering it, if later)."""
        with self._lock:
            self._active[generation] = self._active.get(generation, 0) + 1
            self._generation = max(self._generation, generation)
            # Keep the generation before: its last reads may not have begun yet (a pool's
            # threads start the steps handed to them in any order).
            self._drop_before(min([self._generation - 1, *self._active]))

    def end(self, generation: int, keep: int = 0) -> None:
        """That read is over: drops what only reads of generations before both every one
        still being read and the ``keep`` before the latest begun used (``keep=1`` where a
        later step may still need what an earlier generation's read used: a shuffled
        source whose windows do not start where the reader's windows of steps do)."""
        with self._lock:
            left = self._active.pop(generation) - 1
            if left:
                self._active[generation] = left
            self._drop_before(min([self._generation - keep, *self._active]))

    def _drop_before(self, generation: int) -> None:
        for key in [k for k, g in self._used.items() if g < generation]:
            del self._used[key]
            self._bytes -= self._tables.pop(key).nbytes
