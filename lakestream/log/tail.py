"""The log reader: one entry by version, and the tail of the log folded into a state."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from lakestream.errors import CorruptLogError, NotFoundError, TooLargeError
from lakestream.log.codec import decode_entry
from lakestream.log.entries import MAX_ENTRY_BYTES, Entry
from lakestream.log.keys import log_key
from lakestream.log.replay import ReplayState
from lakestream.log.threads import shared_pool
from lakestream.store.base import ObjectStore

TAIL_WIDTH = 16
SLOW_ROUND_S = 0.002
DUE_SHARE = 0.75
"""The share of the versions left of those due that a round of ``catch_up`` reads at once:
arrivals are uneven, and each read past the head is a request that finds nothing."""

ReadEntry = Callable[[int], "Entry | None"]
"""Reads one log version: its entry, or None if it is absent. ``entry_or_none`` on a store,
or the process's shared head (``lakestream.log.head``) for readers waiting at the head."""


def read_entry(store: ObjectStore, version: int) -> Entry:
    """Reads and parses log version ``version``.

    Raises:
        NotFoundError: the version does not exist (yet).
        CorruptLogError: it exists but cannot be parsed.
        StoreError: the store failed.
    """
    return decode_entry(version, fetch_entry(store, version))


def fetch_entry(store: ObjectStore, version: int) -> bytes:
    """The bytes of log version ``version``, at most an entry's bound.

    Raises:
        NotFoundError: the version does not exist (yet).
        CorruptLogError: it is larger than any entry may be.
        StoreError: the store failed.
    """
    try:
        return store.get(log_key(version), max_bytes=MAX_ENTRY_BYTES)
    except TooLargeError as e:
        raise CorruptLogError(f"log version {version} cannot be read: {e}") from None


def entry_or_none(store: ObjectStore, version: int) -> Entry | None:
    """The entry at ``version``, or None if nobody has committed it yet."""
    try:
        return read_entry(store, version)
    except NotFoundError:
        return None


def read_tail(store: ObjectStore, state: ReplayState) -> ReplayState:
    """Folds every entry after ``state.version`` into ``state``, until one is absent.

    Raises:
        CorruptLogError: an entry cannot be parsed or replayed.
        LogCompactedError: ``state`` is older than the retained log (a tombstone follows).
        StoreError: the store failed (``state`` holds what was folded before).
    """
    catch_up(store, state)
    return state


def catch_up(store: ObjectStore, state: ReplayState, read: ReadEntry | None = None,
             due: float = 0.0) -> float:
    """``read_tail``, returning when the read that found the head absent was sent
    (``time.monotonic()``): from then on ``state`` may be overtaken. ``read`` reads one
    version (default: a GET on ``store``); every catch-up of the log, by readers and
    committers alike, is this loop.

    At the head this is one GET that finds nothing. Behind it, while reads wait on the
    store (a round takes over ``SLOW_ROUND_S``), each round reads twice as many entries at
    once as the last, up to ``TAIL_WIDTH``: read one at a time, a reader far behind could
    not reach a head that others move on as fast as it reads (a producer spent 9 s in one
    commit that way). A round ends at the first absent version, without waiting for the
    reads past it (``_read_round``). Reads that are fast (a local disk) stay one at a time,
    where handing them to threads would cost more than the reads.

    ``due``: the versions likely there (a reader at the head of a remote store, from how
    often they have been arriving: ``SharedHead.due``). While fewer have been read, each
    round reads ``DUE_SHARE`` of those left at once; past them, one a round, until twice as
    many were read (then the reader is behind: rounds double as above). Each read past the
    head is a request that finds nothing: a round wider than what is left would send one
    for each version it reaches past (with rounds doubling past them, up to half of it).
    """
    if read is None:
        def read(version: int) -> Entry | None:
            return entry_or_none(store, version)
    start, width = state.version, 1
    while True:
        read_so_far = state.version - start
        if due - read_so_far >= 1:
            width = max(1, min(TAIL_WIDTH, int(DUE_SHARE * (due - read_so_far))))
        elif read_so_far < 2 * due:
            width = 1  # past what was due, near the head
        t0 = time.monotonic()
        head = _read_round(state, read, width)
        if head is not None:
            return head
        if state.version - start >= 2 * due and time.monotonic() - t0 > SLOW_ROUND_S:
            width = min(2 * width, TAIL_WIDTH)


def _read_round(state: ReplayState, read: ReadEntry, width: int) -> float | None:
    """Reads the ``width`` versions after ``state``'s at once and applies them in order;
    returns when the round began if it found one absent (``state`` is then at the head as
    of that time), else None (all were there)."""
    first, t0 = state.version + 1, time.monotonic()
    if width == 1:
        entries: Iterable[Entry | None] = [read(first)]
    else:
        futures = [shared_pool().submit(read, v) for v in range(first, first + width)]
        entries = (f.result() for f in futures)
    try:
        for offset, entry in enumerate(entries):
            if entry is None:
                return t0
            state.apply(first + offset, entry)
    finally:
        if width > 1:
            for f in futures:
                f.cancel()
    return None
