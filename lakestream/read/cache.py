"""What a reader's threads have fetched and decoded of fragments, shared, bounded in bytes,
each kept until the last step that may read it has been read."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import TypeVar

import pyarrow as pa

from lakestream.store.slots import cpu_slots

Loaded = TypeVar("Loaded", pa.Table, pa.Buffer)


OVERTAKEN = 4
"""Later steps a read may find begun before it: a reader's threads take its steps in order
but may begin them out of order, up to its prefetch (``StepReader``'s default: 4) ahead."""


class FragmentCache:
    """Fetched files and decoded row groups of fragments, shared by the threads of a
    reader: what several of them ask for at once is loaded once. Bounded in bytes, least
    recently used first out.

    Each read of a step is wrapped in ``begin(step)`` / ``end(step)``, and what it loads is
    kept ``until`` the last step that may read it (``MixPlan.last_step``): a fragment that
    several steps draw on is fetched and decoded once for all of them. An entry is dropped
    once its step is below every step being read and every one of the last
    ``OVERTAKEN + 1`` begun: a step that a pool thread took before later ones, and began
    after they had begun (even ended), still finds what it needs. Steps are counted, not
    numbered, so a reader of every n-th step (a DataLoader worker) keeps as much. (Keeping
    a shuffle window until the next one was done held twice the memory, and the allocator
    handed its pages back to have the kernel zero them again: ``bench/mixing.py``.) An entry
    loaded with no ``until`` stays until the bound pushes it out.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._begun: deque[int] = deque(maxlen=OVERTAKEN + 1)
        self._active: dict[int, int] = {}
        self._until: dict[Hashable, int] = {}
        self._let_go: dict[Hashable, int] = {}
        """Keys discarded while reads up to the step given may still run: not fetched
        ahead again (``fetch_ahead``) until it has passed."""
        self._held: OrderedDict[Hashable, pa.Table | pa.Buffer] = OrderedDict()
        self._sizes: dict[Hashable, int] = {}
        self._loading: dict[Hashable, Future[pa.Table | pa.Buffer]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.decoded = 0
        """Tables loaded through the cache (misses): row groups decoded."""
        self.fetched = 0
        """Buffers loaded through the cache (misses): whole files fetched."""

    def expect_overtaking(self, steps: int) -> None:
        """A reader keeps up to ``steps`` steps in flight (its prefetch): keep what a step
        needs until that many later ones have begun, not only ``OVERTAKEN``."""
        with self._lock:
            if steps + 1 > (self._begun.maxlen or 0):
                self._begun = deque(self._begun, maxlen=steps + 1)

    @property
    def nbytes(self) -> int:
        """The bytes held now."""
        return self._bytes

    def holds(self, *keys: Hashable) -> bool:
        """Whether every one of ``keys`` is held now."""
        with self._lock:
            return all(k in self._held for k in keys)

    def fetch(self, key: Hashable, load: Callable[[], Loaded], *,
              until: int | None = None) -> Loaded:
        """What is held under ``key``, else ``load()``'s (once, whoever asks), kept until
        step ``until`` (the latest any asker gives) has been read."""
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                self._held.move_to_end(key)
                self._keep(key, until)
                return held
            pending = self._loading.get(key)
            if pending is None:
                pending = self._loading[key] = Future()
                mine = True
            else:
                mine = False
        if not mine:
            # The loader may need a slot to finish; it may be decoding, so the wait is not
            # counted as the store's (its own fetch, if it fetches, counts in its thread).
            with cpu_slots().waiting(counted=False):
                return pending.result()
        return self._load(key, load, until, pending)

    def fetch_ahead(self, key: Hashable, load: Callable[[], Loaded], *, until: int) -> None:
        """``fetch`` for a read still to come, from another thread: nothing where ``key`` is
        held or being loaded, or every read that may need it is over (``until`` passed: the
        read it was started for fetched it itself, and it has been let go since), or it was
        discarded as done with (its row groups decoded)."""
        with self._lock:
            if key in self._held or key in self._loading or key in self._let_go \
                    or self._passed(until):
                return
            pending = self._loading[key] = Future()
        self._load(key, load, until, pending)

    def _load(self, key: Hashable, load: Callable[[], Loaded], until: int | None,
              pending: Future[pa.Table | pa.Buffer]) -> Loaded:
        try:
            value = load()
        except BaseException as e:
            with self._lock:
                del self._loading[key]
            pending.set_exception(e)
            raise
        with self._lock:
            del self._loading[key]
            if isinstance(value, pa.Buffer):
                self.fetched += 1
            else:
                self.decoded += 1
            self._held[key] = value
            self._keep(key, until)
            self._sizes[key] = size = value.size if isinstance(value, pa.Buffer) \
                else value.get_total_buffer_size()
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._held) > 1:
                gone = next(iter(self._held))
                self._drop(gone)
        pending.set_result(value)
        return value

    def _passed(self, step: int) -> bool:
        """Whether every read that may need what is kept until ``step`` is over: ``step``
        is below every step being read and every one begun lately (what ``end`` drops)."""
        floor = self._floor()
        return floor is not None and step < floor

    def _floor(self) -> int | None:
        """The lowest of the steps being read and of those begun lately (None before any)."""
        return min([*self._begun, *self._active], default=None)

    def discard(self, key: Hashable) -> None:
        """Drops ``key`` if held (no later read needs it; nor is it fetched ahead again
        while it was to be kept)."""
        with self._lock:
            if key in self._held:
                until = self._until.get(key)
                if until is not None:
                    self._let_go[key] = until
                self._drop(key)

    def begin(self, step: int) -> None:
        """A read of ``step`` starts."""
        with self._lock:
            self._active[step] = self._active.get(step, 0) + 1
            self._begun.append(step)
            self._drop_passed()

    def end(self, step: int) -> None:
        """That read is over: drops what no read under way, nor one of a step begun lately,
        may still need."""
        with self._lock:
            left = self._active.pop(step) - 1
            if left:
                self._active[step] = left
            self._drop_passed()

    def _keep(self, key: Hashable, until: int | None) -> None:
        if until is not None:
            self._until[key] = max(until, self._until.get(key, until))

    def _drop_passed(self) -> None:
        floor = self._floor()
        if floor is None:
            return
        for key in [k for k, u in self._until.items() if u < floor]:
            self._drop(key)
        for key in [k for k, u in self._let_go.items() if u < floor]:
            del self._let_go[key]

    def _drop(self, key: Hashable) -> None:
        self._until.pop(key, None)
        del self._held[key]
        self._bytes -= self._sizes.pop(key)

