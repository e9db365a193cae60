"""Fetching ahead: where a reader's whole-file fetches wait on the store (S3's first byte,
a proxy, a disk cache's miss), a step of many fragments starts fetching all of them at once
rather than one after another, so that it waits about one round trip, not one per fragment.

How long a fetch waits is measured, not assumed from the store's kind: the wall time of
each whole fetch less the CPU its thread spent, over the last ``WINDOW`` fetches. Fetches
ahead run on a small pool per process (reset in a forked child, whose threads did not
survive the fork) and go through the reader's ``FragmentCache``: a step's own read finds
each fragment held, or waits for the fetch under way, and a fetch that fails raises there,
as the step's own fetch would have. A fetch ahead that starts only once every read that may
need its file is over (queued behind a busy pool, while the step fetched the file itself)
fetches nothing.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from lakestream.log.segments import Fragment
from lakestream.read.cache import FragmentCache
from lakestream.read.fragments import FragmentReader, LastStep, is_final

WAIT_S = 0.002
"""A median wait per fetch above this, and a step's fragments are fetched at once."""
WINDOW = 16
"""The fetches whose waits decide."""
THREADS = 16
"""Fetches in flight per process at most, beyond each read thread's own."""
SHARE_OF_CACHE = 4
"""What one step fetches ahead stays under the cache's bound over this: what it fetched is
still held when the step gets to it."""

_waits: weakref.WeakKeyDictionary[FragmentReader, deque[float]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def whole_file(reader: FragmentReader, cache: FragmentCache | None, f: Fragment,
               last_step: LastStep | None) -> pa.Buffer:
    """The file of ``f``, fetched whole and checked; through ``cache``, fetched once while it
    keeps it: until the last step that may read any of its rows. Each fetch's wait is noted
    for ``fetch_ahead``."""
    fetch = _fetcher(reader, f, last_step)
    if cache is None:
        return fetch()
    until = None if last_step is None else last_step(f.offset, f.offset + f.rows)
    return cache.fetch((f.path, f.size, f.crc32), fetch, until=until)


def _fetcher(reader: FragmentReader, f: Fragment, last_step: LastStep | None
             ) -> Callable[[], pa.Buffer]:
    """A whole fetch of ``f``'s file, its wait noted."""
    def fetch() -> pa.Buffer:
        wall, cpu = time.perf_counter(), time.thread_time()
        data = reader.fetch(f.path, f.size, f.crc32, final=is_final(last_step))
        waited = (time.perf_counter() - wall) - (time.thread_time() - cpu)
        with _lock:
            _waits.setdefault(reader, deque(maxlen=WINDOW)).append(waited)
        return data

    return fetch


def waits_on_store(reader: FragmentReader) -> bool:
    """Whether ``reader``'s recent whole fetches waited on the store (``WAIT_S``)."""
    with _lock:
        waits = list(_waits.get(reader, ()))
    return bool(waits) and statistics.median(waits) > WAIT_S


def fetch_ahead(reader: FragmentReader, cache: FragmentCache, fragments: Sequence[Fragment],
                last_step: LastStep | None) -> int:
    """Starts fetching, on the pool, each of ``fragments`` (read whole by a step, in its
    order) after the first, which the caller fetches itself, that the reader has not read
    before, where its fetches wait on the store; returns how many it started."""
    if len(fragments) < 2 or not waits_on_store(reader):
        return 0
    budget, started = cache.max_bytes // SHARE_OF_CACHE, 0
    for f in fragments[1:]:
        if reader.cached_footer(f.path, f.size, f.crc32) is not None \
                or cache.holds((f.path, f.size, f.crc32)):
            continue  # read before: its rows may be decoded and held already
        budget -= f.size
        if budget < 0:
            break
        _executor().submit(_quietly, reader, cache, f, last_step)
        started += 1
    return started


def _quietly(reader: FragmentReader, cache: FragmentCache, f: Fragment,
             last_step: LastStep | None) -> None:
    # A fetch ahead that waited in the pool until its step's own read had fetched the file,
    # and every read that needs it was over (the cache let it go), would fetch it again.
    try:
        if last_step is None:
            whole_file(reader, cache, f, last_step)
        else:
            cache.fetch_ahead((f.path, f.size, f.crc32), _fetcher(reader, f, last_step),
                              until=last_step(f.offset, f.offset + f.rows))
    except Exception:  # the step's own read of it raises it again
        pass


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="lakestream-fetch-ahead")
        return _pool


def _forget_pool() -> None:
    """In a forked child: the parent's pool threads are not there, and a new one is made."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)
