"""Threads shared by every open and catch-up in a process, for reads that wait on the store."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_POOL: tuple[int, ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()


def shared_pool() -> ThreadPoolExecutor:
    """The process's read pool. Starting threads for each open would cost more than a whole
    local open; a forked child (a DataLoader worker) gets a pool of its own, since the
    parent's threads do not exist there."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (os.getpid(), ThreadPoolExecutor(8, thread_name_prefix="lakestream-read"))
        return _POOL[1]
