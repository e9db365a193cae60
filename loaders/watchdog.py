"""A DataLoader worker that outlives its trainer: each worker of a ``StreamDataset`` ends
once the process that started it is gone.

torch's own watchdog looks for the parent only between batches, by its pid as the worker
first saw it: a worker waiting inside the dataset for a step that never comes, or a spawned
worker still starting when the trainer was killed, stayed for ever. A daemon thread here
waits on the parent's sentinel (``multiprocessing.parent_process()``), which the kernel
closes when the parent dies however early, and ends the process then if it is a DataLoader
worker: no one is left to take what it reads.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import threading

from torch.utils.data import get_worker_info

_started = False
_lock = threading.Lock()


def watch_parent() -> None:
    """Starts, once per process and only in a process that ``multiprocessing`` started, the
    thread that ends it with its parent when it is a DataLoader worker by then."""
    global _started
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    with _lock:
        if _started:
            return
        _started = True
    threading.Thread(target=_wait, args=(parent.sentinel,), name="lakestream-parent-watch",
                     daemon=True).start()


def _wait(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    if get_worker_info() is not None:
        os._exit(0)


def _after_fork() -> None:
    global _started, _lock
    _started, _lock = False, threading.Lock()  # the thread is not in the child


os.register_at_fork(after_in_child=_after_fork)
