"""The prefetching step reader: waits for steps to become visible and keeps the next few
decoded, collated and transformed in background threads (Parquet decoding, copies into
tensors and image decoders release the GIL), so that the consumer's thread only takes them."""

from __future__ import annotations

import collections
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

    ``finish(step, table, tensors)``, if given, runs in the same thread right after a step's
    slice is decoded (collation, a transform, pinning), and ``read`` yields what it returns.
    With ``arrays``, each step's read first makes the arrays its tensor columns go into
    (``ColumnArrays``: pinned, shared or plain memory) and reads them straight there, and
    ``tensors`` are those arrays as tensors; else they are in the table, and ``tensors`` is
    empty.
    """

    def __init__(self, steps: Stream | Steps, rank: int, world_size: int, *,
                 columns: list[str] | None = None, prefetch: int = 4, threads: int = 2,
                 timeout: float | None = None, poll_min_s: float = 0.001,
                 poll_max_s: float = 0.5, stop: Stop | None = None,
                 finish: Callable[[int, pa.Table, dict[str, Any]], Any] | None = None,
                 arrays: Callable[[], ColumnArrays] | None = None) -> None:
        if prefetch < 0 or threads < 1:
            raise ValueError("prefetch must be >= 0 and threads >= 1")
        self.steps: Steps = MixSteps.single(steps) if isinstance(steps, Stream) else steps
        self.rank, self.world_size = rank, world_size
        self.columns, self.prefetch, self.threads = columns, prefetch, threads
        self.timeout, self.poll_min_s, self.poll_max_s = timeout, poll_min_s, poll_max_s
        self.stop, self.finish, self.arrays = stop, finish, arrays
        self.steps.expect_overtaking(prefetch)  # steps begun out of order, up to prefetch
        self.wait_s = 0.0
        """Time spent waiting for steps to become visible."""
        self.read_latencies_s: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        """Per step, the last ``LATENCY_WINDOW``: from asking for it (once visible) to its
        slice being decoded (and finished)."""

    def _read(self, step: int) -> tuple[Any, float]:
        t0 = time.perf_counter()
        with cpu_slots().held():
            arrays = self.arrays() if self.arrays is not None else None
            table = self.steps.read(step, self.rank, self.world_size, self.columns,
                                    alloc=arrays)
            item = table if self.finish is None else \
                self.finish(step, table, arrays.tensors if arrays is not None else {})
        return item, time.perf_counter() - t0

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
        with ThreadPoolExecutor(self.threads, thread_name_prefix="lakestream-read") as pool:
            while True:
                # Keep up to `prefetch` visible steps in flight beyond the one needed next.
                while len(pending) <= self.prefetch:
                    if held is None:
                        held = next(it, None)
                        if held is None:
                            break
                    if pending and not self.steps.ready(held):
                        break  # not visible yet: serve what is in flight first
                    if not self.wait_visible(held):
                        it, held = iter(()), None  # the steps end here
                        break
                    pending.append((held, pool.submit(self._read, held)))
                    held = None
                if not pending:
                    return
                step, future = pending.popleft()
                table, latency = future.result()
                self.read_latencies_s.append(latency)
                yield step, table
