"""A log entry's conditional put on a remote store, resolved by reading its key when the
store holds the answer back.

SeaweedFS holds a conditional PUT that lost a race for about a second before its 412
(``bench/s3race.py``: lost p50 15 ms, p99 2.0 s); throttled stores and proxies may too. The
put-if-absent rule makes an earlier answer safe: once the version's key exists, the entry
there says who won (the caller reads it: its own commit id means this put landed), and the
put still in flight can no longer land. So a put unanswered after a bound, a few times the
store's recent puts, looks at the key (a HEAD); present, the caller goes on as on a 412 while
the put finishes in the background; absent, it waits on.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from lakestream.errors import AlreadyExistsError, NotFoundError, StoreError
from lakestream.log.entries import Entry
from lakestream.log.keys import log_key
from lakestream.log.tail import read_entry
from lakestream.store import is_remote
from lakestream.store.base import ObjectStore

RESOLVE_MIN_S = 0.02
"""A put is never resolved sooner: below this a HEAD costs the store more than it saves."""
RESOLVE_FIRST_S = 0.25
"""The bound before a store's puts have been seen."""
RESOLVE_FACTOR = 3.0
"""The bound, in medians of the store's recent puts that landed."""
SEEN_PUTS = 32

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_seen: dict[str, deque[float]] = {}


@dataclass(frozen=True)
class Put:
    """What one put-if-absent of a log entry came to."""

    landed: bool
    """The entry is there: the put said so, or the entry read back bears its commit id (a
    lost reply, or a retried PUT meeting its own object)."""
    holder: Entry | None
    """After a put that did not answer success, the entry read back at the version (ours,
    another's, a tombstone), or None: nothing there, or it could not be read."""
    failure: StoreError | None
    """The store's failure on the put or on the read back: with nothing read back, whether
    the entry landed is not known."""


def put_log_entry(store: ObjectStore, version: int, data: bytes, commit_id: str) -> Put:
    """Puts the encoded entry ``data`` at log ``version`` if absent; when the store does not
    answer success, reads back what holds the version: the one place the put-if-absent rule
    is applied (the entry there says who won).

    Raises:
        CorruptLogError: something that is not an entry holds the version.
    """
    try:
        put_entry(store, log_key(version), data)
        return Put(True, None, None)
    except AlreadyExistsError:
        failure = None  # lost the race, or an attempt of ours landed: read the winner
    except StoreError as e:
        failure = e
    try:
        holder = read_entry(store, version)
    except NotFoundError:
        return Put(False, None, failure)  # did not land: a put at the same version is safe
    except StoreError as e:
        return Put(False, None, failure or e)
    return Put(holder.commit_id == commit_id, holder, failure)


def put_entry(store: ObjectStore, key: str, data: bytes) -> None:
    """``store.put(key, data, mode="create")``, resolved early on a remote store.

    Raises:
        AlreadyExistsError: the key holds an entry: the store's 412, or seen by a HEAD while
            this put was unanswered (the entry may be this put's own: read it).
        StoreError: the put failed.
    """
    if not is_remote(store.uri):
        store.put(key, data, mode="create")
        return
    bound = _bound(store.uri)
    t0 = time.monotonic()
    future: Future[None] = _executor().submit(store.put, key, data, mode="create")
    while True:
        try:
            future.result(timeout=bound)
        except FutureTimeout:
            if _present(store, key):
                raise AlreadyExistsError(f"{key} was taken while this put went unanswered "
                                         f"for {time.monotonic() - t0:.2f}s") from None
            continue
        _observe(store.uri, time.monotonic() - t0)
        return


def _present(store: ObjectStore, key: str) -> bool:
    try:
        store.head(key)
    except NotFoundError:
        return False
    except StoreError:
        return False  # the put's own answer will say
    return True


def _bound(uri: str) -> float:
    with _lock:
        seen = _seen.get(uri)
        if not seen or len(seen) < 4:
            return RESOLVE_FIRST_S
        return max(RESOLVE_MIN_S, RESOLVE_FACTOR * statistics.median(seen))


def _observe(uri: str, seconds: float) -> None:
    with _lock:
        _seen.setdefault(uri, deque(maxlen=SEEN_PUTS)).append(seconds)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(8, thread_name_prefix="lakestream-put")
        return _pool


def _after_fork() -> None:
    global _pool, _lock
    _pool, _lock = None, threading.Lock()  # the parent's threads are not in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
