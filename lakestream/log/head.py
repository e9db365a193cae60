"""The log's head as readers in one process share it: one GET per new version and one poll
per pacing round for the whole process, however many handles, ranks' readers or threads
wait on the same stream.

Readers waiting for steps poll the next log version. Alone, each would send its own GETs:
64 reader threads polling at 100 Hz are 6,400 GETs/s on the log prefix, past what one S3
prefix serves, each miss billed. Here entries, immutable once written, are cached per
process (decoded, the newest ``CACHED_ENTRIES`` of each stream), one read of a version is in
flight at a time, and a version found absent is asked for again only after a pause shared
by every reader of the process, paced by how often versions have been arriving: half the
smoothed gap between arrivals, at least ``POLL_MIN_S`` (10 ms) and at most ``POLL_REST_S``
(50 ms, a stream at rest). So a commit is seen within half a gap of landing on a busy log and
within 50 ms after a quiet spell; the version reads that find entries are on top (one per
version committed, inherent to reading the log). A growing backoff paced it before: after a
quiet spell a commit was seen up to half a second late.

On a remote store a read that finds nothing is a billed request on the log's prefix, and
those are held to a budget: ``EMPTY_POLLS_PER_S`` (18) a second, under load as at rest, for
a host's processes together where they share the host's head (below). Each
spends ``1 / EMPTY_POLLS_PER_S`` s of it, ``EMPTY_POLLS_AHEAD`` may be spent ahead, and a
parallel round of a catch-up that reached past the head spent one for each of its reads
past it: the pause after it is that much longer. So that such reads are few, a poll reads
at once most of the versions due, those the smoothed gap between arrivals says were
committed since the head was last found absent (``SharedHead.due``, ``catch_up``), and past
them one at a time. Before, a reader on SeaweedFS drew 45-75 such reads a second at 1-8
producers × 25 writes/s (``bench/freshness.py``): the 10 ms pause, and rounds of up to 16
reads ending past the head; now 18. The price is freshness: a commit is seen up to a pause
later (write → committed-visible p99 38 → 66 ms at 1 producer, 165 → 226 ms at 4). A local
store's reads cost no request, and are paced as above.

For a stream on a remote store the processes of a host share this too, through a folder of
the host (``lakestream.log.hosthead``): a version one of them read, or found absent a pause
ago, the others take from there, so a host sends what one process would.

Only readers use this (``Stream.poll``). A committer never does: a cached "absent" could
hide a rival's commit from the read that must find it.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from lakestream.errors import CorruptLogError, NotFoundError
from lakestream.log import Entry
from lakestream.log.codec import decode_entry
from lakestream.log.hosthead import HostHead
from lakestream.log.tail import TAIL_WIDTH, entry_or_none, fetch_entry
from lakestream.store import is_remote
from lakestream.store.base import ObjectStore

CACHED_ENTRIES = 256
POLL_MIN_S = 0.01
POLL_REST_S = 0.05
EMPTY_POLLS_PER_S = 18
"""On a remote store, the most reads a second of a host's processes that find no new version
of a stream (of a process's, where the host's head is off)."""
EMPTY_POLLS_AHEAD = 3
"""How many of those reads a process may send ahead of the budget's pace (after a round
reached past the head, the next poll comes sooner, and the budget holds over seconds)."""
LONGEST_PAUSE_S = POLL_REST_S + TAIL_WIDTH / EMPTY_POLLS_PER_S
"""The longest pause a process sets: a rest pause, and the budget a round of reads past the
head spent (what the host's other processes trust of a pause: ``HostHead.absent_until``)."""
GAP_SMOOTHING = 0.3
"""The weight of the newest gap between arrivals in the smoothed gap."""


class SharedHead:
    """What this process knows of one stream's log end."""

    def __init__(self, host: HostHead | None = None, *, remote: bool = False) -> None:
        self._host = host
        """The host's head of the stream, shared with the host's other processes (None:
        this process reads alone)."""
        self._remote = remote
        """Whether a read that finds nothing costs a request (``EMPTY_POLLS_PER_S``)."""
        self._spent_to = 0.0
        """On a remote store, when the reads that found nothing so far have spent the
        budget to (monotonic): none is sent before it."""
        self._probed_at: float | None = None
        """When a version past ``_top`` was last found absent (monotonic)."""
        self._cond = threading.Condition()
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._reading: set[int] = set()
        self._top = -1
        """The highest version found present."""
        self._absent: int | None = None
        """The lowest version found absent past ``_top``: it and every version after it
        are absent until ``_retry_at``."""
        self._retry_at = 0.0
        self._arrived_at: float | None = None
        """When a version past ``_top`` was last found (monotonic)."""
        self._sampled = -1
        """The newest version at ``_arrived_at`` (``_arrived``)."""
        self._gap = 2 * POLL_REST_S
        """The smoothed time between versions arriving (seconds per version)."""

    def entry(self, store: ObjectStore, version: int) -> Entry | None:
        """The entry at ``version``; None if it, or a version before it, was absent when
        last asked for (at most a backoff round ago). Safe from many threads: a catch-up
        reading several versions at once goes through here too.

        Raises:
            CorruptLogError: it cannot be parsed. StoreError: the store failed.
        """
        with self._cond:
            while True:
                if version in self._entries:
                    self._entries.move_to_end(version)
                    return self._entries[version]
                if self._absent is not None and version >= self._absent \
                        and time.monotonic() < self._retry_at:
                    return None
                if version not in self._reading:
                    break
                self._cond.wait()  # another thread is reading it: take its answer
            self._reading.add(version)
        entry: Entry | None = None
        until: float | None = None
        try:
            entry, until = self._read(store, version)
        finally:
            with self._cond:
                self._reading.discard(version)
                now = time.monotonic()
                if entry is not None:
                    self._entries[version] = entry
                    while len(self._entries) > CACHED_ENTRIES:
                        self._entries.popitem(last=False)
                    if version > self._top:
                        self._arrived(now, version)
                        self._top = version
                    if self._absent is not None and version >= self._absent:
                        self._absent = None  # the log moved on
                elif version > self._top:
                    # The head as far as anyone here knows: pause before asking again. A
                    # read past an absent version (a parallel round's) can only lengthen the
                    # pause (on a remote store it spent the budget too).
                    until = now + self.pause_s() if until is None else until
                    if self._absent is None or version <= self._absent:
                        self._absent, self._retry_at = version, until
                    else:
                        self._retry_at = max(self._retry_at, until)
                    self._probed_at = now
                self._cond.notify_all()
        return entry

    def _read(self, store: ObjectStore, version: int) -> tuple[Entry | None, float | None]:
        """The entry at ``version`` from the host's head (another process of the host read
        it, or found it absent a pause ago), else from the store; None if absent, with
        when the host's pause runs out if it said so.

        Raises:
            CorruptLogError: it cannot be parsed. StoreError: the store failed.
        """
        host = self._host
        if host is None:
            sent = time.monotonic()
            entry = entry_or_none(store, version)
            return entry, None if entry is not None else self._spend(sent)

        def look() -> tuple[bytes | None, float | None]:  # what the host knows of it
            data = host.entry(version)
            return data, None if data is not None else host.absent_until(version,
                                                                         LONGEST_PAUSE_S)

        data, until = look()
        if data is None and until is None:
            with host.reading(version):  # one process of the host asks; the rest wait
                data, until = look()
                if data is None and until is None:
                    sent = time.monotonic()
                    try:
                        data = fetch_entry(store, version)
                    except NotFoundError:
                        until = self._spend(sent)  # absent as of the GET's sending
                        host.found_absent(version, until)
                        return None, until
                    host.found(version, data)
                    return decode_entry(version, data), None
        if data is None:
            return None, until
        try:
            return decode_entry(version, data), None
        except CorruptLogError:  # the host's copy is damaged: the store's is the entry
            return entry_or_none(store, version), None

    def _spend(self, sent: float) -> float:
        """Until when a version found absent by a read sent at ``sent`` stays absent: the
        pause, and on a remote store at least until the reads that found nothing are within
        ``EMPTY_POLLS_PER_S`` (each spends ``1 / EMPTY_POLLS_PER_S`` s of it: the reads of a
        parallel round that reached past the head lengthen the pause)."""
        # The host's budget where its processes share the head (each alone drew its own
        # 18 a second: 8 ranks of a host sent 42), else this process's.
        spent = self._host.spend(sent, 1 / EMPTY_POLLS_PER_S) \
            if self._remote and self._host is not None else None
        with self._cond:
            until = sent + self.pause_s()
            if self._remote:
                # Each such read spends 1 / EMPTY_POLLS_PER_S s, a few of them ahead: polls
                # then start every 1 / EMPTY_POLLS_PER_S s, not that long after each ends.
                if spent is None:
                    self._spent_to = max(self._spent_to, sent) + 1 / EMPTY_POLLS_PER_S
                    spent = self._spent_to
                until = max(until, spent - EMPTY_POLLS_AHEAD / EMPTY_POLLS_PER_S)
            return min(until, sent + LONGEST_PAUSE_S)

    def due(self) -> float:
        """How many versions past the newest it found the smoothed gap between arrivals
        says were committed since this process last found the head absent: what a reader's
        poll of a remote store reads at once (``catch_up``). 0 on a local store (read one
        at a time: faster, and costing nothing), or before a first poll."""
        with self._cond:
            if not self._remote or self._probed_at is None:
                return 0.0
            return (time.monotonic() - self._probed_at) / self._gap

    def _arrived(self, now: float, version: int) -> None:
        """Folds the arrival of versions up to ``version`` into the smoothed gap between
        arrivals: the time since the last sample over the versions since. A sample is taken
        at most every ``POLL_MIN_S``: the versions of a parallel round come in together, and
        their spacing there says nothing of the log's (it took the gap to 1 ms where
        versions came every 25)."""
        if self._arrived_at is not None:
            if now - self._arrived_at < POLL_MIN_S:
                return  # counted in the next sample
            gap = (now - self._arrived_at) / max(1, version - self._sampled)
            self._gap += GAP_SMOOTHING * (min(gap, POLL_REST_S * 2) - self._gap)
        self._arrived_at, self._sampled = now, version

    def pause_s(self) -> float:
        """How long a version found absent stays absent for this process: half the smoothed
        gap between arrivals (one that has not come for longer than the gap counts as a
        longer gap), within ``[POLL_MIN_S, POLL_REST_S]``."""
        gap = self._gap
        if self._arrived_at is not None:
            gap = max(gap, time.monotonic() - self._arrived_at)
        return min(POLL_REST_S, max(POLL_MIN_S, gap / 2))

    def wait_s(self) -> float:
        """Seconds until this process will next ask for the version after its newest: what
        a reader waiting for it should sleep (0: ask now)."""
        with self._cond:
            if self._absent is None:
                return 0.0
            return max(0.0, self._retry_at - time.monotonic())

    def reader(self, store: ObjectStore) -> Callable[[int], Entry | None]:
        """``entry`` on ``store``, as the log reader ``lakestream.log.tail.catch_up`` takes."""
        return lambda version: self.entry(store, version)


_HEADS: dict[tuple[str, int], SharedHead] = {}
_LOCK = threading.Lock()


def shared_head(store: ObjectStore, created_ms: int) -> SharedHead:
    """This process's ``SharedHead`` of the stream at ``store.uri`` created at
    ``created_ms`` (a stream deleted and created again at the same place is another one)."""
    with _LOCK:
        head = _HEADS.get((store.uri, created_ms))
        if head is None:
            remote = is_remote(store.uri)
            host = HostHead.for_stream(store.uri, created_ms) if remote else None
            head = _HEADS[(store.uri, created_ms)] = SharedHead(host, remote=remote)
        return head


def _forget_in_child() -> None:
    global _LOCK
    _HEADS.clear()  # a forked child's threads and their locks did not come along
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
