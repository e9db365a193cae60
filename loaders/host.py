"""What a loader may use of the host it runs on: its share of the cores, read from the host.

A data-parallel job runs one trainer process per GPU: ``LOCAL_WORLD_SIZE`` of them (set by
torchrun) share the cores this process may run on. Each keeps one core for its own training
loop and reads with the rest of its share, up to ``MAX_READ_THREADS``: on a 16-core host with
one GPU that is 8 read threads; on 96 cores and 8 GPUs, 8 per rank; on a 2-core machine, 1.
More threads than the share take the training loop's core away from it at every scheduler
tick: on 2 cores, 2 read threads made a 32 ms training step wait 4-8 ms for its batch one step
in two, 1 thread one step in twenty (``bench/gpu.py --stand-in``). So however many threads
a reader is given, its per-byte work runs in at most that many at once (``read_slots``);
more threads only add fetches in flight, which a remote store's latency needs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

MIN_READ_THREADS = 1
MAX_READ_THREADS = 8
"""Past this, one process's threads hold the GIL most of the time and more deliver less: on a
16-core host, batches of 64 raw images, 1 thread read 2.5 GB/s, 4 6.2, 8 6.7 and 15 6.5 GB/s
at 1.2x the CPU per GB of 8, the GIL held 74% of the time at 8 and 94% at 15
(``bench/ceiling.py``, ``bench/results/ceiling-raw-h200.json``)."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, else the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_world_size() -> int:
    """Trainer processes on this host (``LOCAL_WORLD_SIZE``, 1 when unset or malformed)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def read_slots(workers: int = 0) -> int:
    """The CPU slots of one reading process (``lakestream.store.slots``): this rank's share
    of the cores less the one its training loop runs on, split among its DataLoader
    ``workers`` (0: it reads in-process), at least 1. Read threads past them only wait for
    a remote store: on 2 cores, 15 threads in 2 slots spent 1.1-1.4x the CPU per GB of one
    thread, in 1 slot 1.0-1.15x (``bench/ceiling.py``)."""
    share = usable_cores() // local_world_size() - 1
    return max(MIN_READ_THREADS, share // max(1, workers))


WAITING_READ_THREADS = 4
"""Read threads a reader has beyond its own (``default_read_threads``), run while its reads
wait on the store (a remote store, a disk cache, a slow mount: ``StepReader``); none where
the read threads are given. Each holds one fetch in flight out of the slots
(``lakestream.store.slots``), so that the cores are not idle while an answer comes. On 2
cores, a stream on SeaweedFS at 1 thread read 0.46 GB/s, at 4 0.58 (``bench/s3cache.py``)."""


def default_read_threads(workers: int = 0) -> int:
    """Read threads for one reader while its reads do not wait on the store: its CPU slots
    (``read_slots``), at most ``MAX_READ_THREADS``."""
    return min(MAX_READ_THREADS, read_slots(workers))


def default_prefetch(threads: int) -> int:
    """Steps kept in flight: one per read thread, and two more so that a thread is never idle
    while the consumer takes a step."""
    return threads + 2


SWITCH_INTERVAL_S = 0.001
"""The interpreter's switch interval while a dataset reads in the trainer process."""

_switch_lock = threading.Lock()
_switch_users = 0
_switch_before = 0.0


@contextlib.contextmanager
def quick_gil_handoff() -> Iterator[None]:
    """Lowers the interpreter's switch interval to ``SWITCH_INTERVAL_S`` (unless it is lower)
    while in the block, for the whole process; restores it when the last such block ends.

    A training loop's thread rarely lets the GIL go of itself: a read thread that wants it
    back after a copy or a decode waits the switch interval (5 ms by default) each time,
    many times a step, so on a busy loop it fell behind a 32 ms step one step in two and
    took the GIL in 5 ms slices, halving the loop's op rate (``bench/gpu.py --stand-in``).
    """
    global _switch_users, _switch_before
    with _switch_lock:
        if _switch_users == 0:
            _switch_before = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_before, SWITCH_INTERVAL_S))
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_before)
