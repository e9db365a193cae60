"""The prefetching step reader: waits for steps to become visible and keeps the next few
decoded, collated and transformed in background threads (Parquet decoding, copies into
tensors and image decoders release the GIL), so that the consumer's thread only takes them."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import pyarrow as pa

from lakestream.errors import StepNotAvailableError
from lakestream.loaders.collate import ColumnArrays
from lakestream.reading import MixSteps, Steps, cpu_slots
from lakestream.stream import Stream

LATENCY_WINDOW = 4096
WAIT_WINDOW = 16
"""The last step reads whose waits on the store decide whether the waiting threads run."""
WAIT_S = 0.002
"""A median wait on the store per step read above this, and the waiting threads run."""


class Stop(Protocol):
    """What ends a wait early: a ``threading.Event`` or a ``multiprocessing`` one."""

    def wait(self, timeout: float | None = None) -> bool: ...


class StepReader:
    """Reads one rank's slices of a sequence of steps, in order, ``prefetch`` steps ahead:
    a stream's own steps, the steps of a mix (``MixSteps``) or of a read-time policy
    (``SelectedSteps``).

    A step that is not visible yet is waited for by polling the next log entry (a GET, never
    a LIST, shared by every reader of the stream in the process: ``Stream.poll``), sleeping
    between polls until the shared head asks the store again (``lakestream.log.head``: paced by
    how often commits come, 10 to 50 ms), within ``[poll_min_s, poll_max_s]``; after
    ``timeout`` seconds of
    waiting for one step, ``StepNotAvailableError`` is raised (``timeout=None`` waits forever).
    Iteration stops at a step past the end of a mix (a sealed source ran out), or at the
    first step still waited for once ``stop`` is set.

    ``threads`` read at once; ``waiting_threads`` more join them, and as many more steps
    are read ahead, while step reads wait on the store: while the median, over the last
    ``WAIT_WINDOW`` reads, of the time a read spent out of its CPU slot waiting for an
    answer (``CpuSlots.waited_s``: a remote store's, a disk's; not another thread's load,
    which may be a decode) is over ``WAIT_S``; before any read, where ``waiting`` says so.
    Measured, not assumed from the store's kind: a local store behind a slow mount, a proxy
    or a hook waits as S3 does, and steps read one after another each paid the whole wait
    (on 2 busy cores, 3 producers at 5 ms a request: delivered p99 615 ms with 1 thread,
    288 ms with the waiting ones, ``bench/delivered.py``). A reader whose reads are
    measured not waiting reads as if it had no waiting threads.

    ``finish(step, table, tensors)``, if given, runs in the same thread right after a step's
    slice is decoded (collation, a transform, pinning), and ``read`` yields what it returns.
    With ``arrays``, each step's read first makes the arrays its tensor columns go into
    (``ColumnArrays``: pinned, shared or plain memory) and reads them straight there, and
    ``tensors`` are those arrays as tensors; else they are in the table, and ``tensors`` is
    empty.
    """

    def __init__(self, steps: Stream | Steps, rank: int, world_size: int, *,
                 columns: list[str] | None = None, prefetch: int = 4, threads: int = 2,
                 waiting_threads: int = 0, waiting: bool = False,
                 timeout: float | None = None, poll_min_s: float = 0.001,
                 poll_max_s: float = 0.5, stop: Stop | None = None,
                 finish: Callable[[int, pa.Table, dict[str, Any]], Any] | None = None,
                 arrays: Callable[[], ColumnArrays] | None = None) -> None:
        if prefetch < 0 or threads < 1 or waiting_threads < 0:
            raise ValueError("prefetch must be >= 0, threads >= 1 and waiting_threads >= 0")
        self.steps: Steps = MixSteps.single(steps) if isinstance(steps, Stream) else steps
        self.rank, self.world_size = rank, world_size
        self.columns, self.prefetch, self.threads = columns, prefetch, threads
        self.timeout, self.poll_min_s, self.poll_max_s = timeout, poll_min_s, poll_max_s
        self.stop, self.finish, self.arrays = stop, finish, arrays
        self.waiting_threads = waiting_threads
        self._overtaking = prefetch
        self.steps.expect_overtaking(prefetch)  # steps begun out of order, up to prefetch
        self._waits: collections.deque[float] = collections.deque(maxlen=WAIT_WINDOW)
        self._waits_lock = threading.Lock()
        self._waits_now = waiting
        self.wait_s = 0.0
        """Time spent waiting for steps to become visible."""
        self.read_latencies_s: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        """Per step, the last ``LATENCY_WINDOW``: from asking for it (once visible) to its
        slice being decoded (and finished)."""

    @property
    def waits(self) -> bool:
        """Whether step reads are measured waiting on the store (before any read: the
        ``waiting`` given); the waiting threads, if any, run while they are."""
        return self._waits_now

    def _read(self, step: int) -> tuple[Any, float]:
        slots = cpu_slots()
        waited = slots.waited_s()
        t0 = time.perf_counter()
        try:
            with slots.held():
                arrays = self.arrays() if self.arrays is not None else None
                table = self.steps.read(step, self.rank, self.world_size, self.columns,
                                        alloc=arrays)
                item = table if self.finish is None else \
                    self.finish(step, table, arrays.tensors if arrays is not None else {})
            return item, time.perf_counter() - t0
        finally:
            with self._waits_lock:
                self._waits.append(slots.waited_s() - waited)
                self._waits_now = sorted(self._waits)[len(self._waits) // 2] > WAIT_S

    def wait_visible(self, step: int) -> bool:
        """Returns True once ``step`` is committed, False if the steps end before it or
        ``stop`` is set while waiting.

        Raises:
            StepNotAvailableError: still not visible after ``timeout`` seconds.
        """
        if self.steps.ready(step):
            return True
        t0 = time.monotonic()
        while True:
            if self.steps.ended(step):
                return False
            pause = self.steps.poll()
            if self.steps.ready(step):
                self.wait_s += time.monotonic() - t0
                return True
            waited = time.monotonic() - t0
            if self.timeout is not None and waited >= self.timeout:
                self.wait_s += waited
                raise StepNotAvailableError(
                    f"step {step} of {self.steps.uri} did not become visible within "
                    f"{self.timeout}s ({self.steps.committed()} committed); producers "
                    "may be stalled"
                )
            # Until the shared head asks the store again (paced by how often commits come):
            # not a backoff of this reader's own, which saw a commit after a quiet spell
            # up to half a second late.
            pause = min(self.poll_max_s, max(self.poll_min_s, pause))
            if self.timeout is not None:
                pause = max(0.0, min(pause, self.timeout - waited))
            if self.stop is None:
                time.sleep(pause)
            elif self.stop.wait(pause):
                self.wait_s += time.monotonic() - t0
                return False

    def read(self, steps: Iterable[int]) -> Iterator[tuple[int, Any]]:
        """Yields ``(step, slice)`` for ``steps`` in order (the slice as ``finish`` made it)."""
        it = iter(steps)
        held: int | None = None  # the next step, taken from `it` but not yet submitted
        pending: collections.deque[tuple[int, Future[tuple[Any, float]]]] = \
            collections.deque()
        mine: list[Future[tuple[Any, float]]] = []  # given to `pool`, not known to be done
        # The waiting threads' pool makes its threads only once a step is given to it.
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="lakestream-read")
        spare = ThreadPoolExecutor(max(1, self.waiting_threads),
                                   thread_name_prefix="lakestream-read-waiting")
        try:
            while True:
                # Keep up to `prefetch` visible steps in flight beyond the one needed next,
                # and a step more per waiting thread while reads wait on the store (on the
                # waiting threads where the others are all busy).
                waits = self.waiting_threads > 0 and self._waits_now
                if waits and self._overtaking < self.prefetch + self.waiting_threads:
                    self._overtaking = self.prefetch + self.waiting_threads
                    self.steps.expect_overtaking(self._overtaking)
                while len(pending) <= self.prefetch + (self.waiting_threads if waits else 0):
                    if held is None:
                        held = next(it, None)
                        if held is None:
                            break
                    if pending and not self.steps.ready(held):
                        break  # not visible yet: serve what is in flight first
                    if not self.wait_visible(held):
                        it, held = iter(()), None  # the steps end here
                        break
                    mine = [f for f in mine if not f.done()]
                    on = spare if waits and len(mine) >= self.threads else pool
                    future = on.submit(self._read, held)
                    if on is pool:
                        mine.append(future)
                    pending.append((held, future))
                    held = None
                if not pending:
                    return
                step, future = pending.popleft()
                table, latency = future.result()
                self.read_latencies_s.append(latency)
                yield step, table
        finally:
            # Steps not begun are dropped (a consumer that stopped wants none of them, and a
            # read that failed ends the iteration); the reads under way end first.
            pool.shutdown(cancel_futures=True)
            spare.shutdown(cancel_futures=True)
