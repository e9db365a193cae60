"""A handle's view of the log: the replay state its reads and commits start from, replaced by
refreshes and commits, newest version wins (docs/design.md §4, §7).

The view is an immutable replay state swapped under a lock held only for the swap: no call
on a handle waits behind another's I/O, backoff or sleep. Once per snapshot interval a
published state is rebased on the newest snapshot's segments, so memory does not grow with
what others commit; a view no read has confirmed at the head for ``REOPEN_IDLE_S`` is
reopened from the newest snapshot before it is used (gc may have compacted what follows it).
"""

from __future__ import annotations

import logging
import threading
import time

from lakestream.errors import LogCompactedError, StoreError
from lakestream.log.entries import REOPEN_IDLE_S
from lakestream.log.head import shared_head
from lakestream.log.opening import load_state, replay_log
from lakestream.log.outcomes import Build, CommitOptions, Landed, Outcome, PostCommit
from lakestream.log.replay import ReplayState
from lakestream.log.segments import SegmentError
from lakestream.log.snapshot import rebase
from lakestream.log.tail import ReadEntry, catch_up, entry_or_none
from lakestream.log.transaction import DEFAULT_POST_COMMIT, Transaction
from lakestream.store.base import ObjectStore

log = logging.getLogger("lakestream")


class LogView:
    """The view of the log at ``uri`` that one handle reads and commits from. Thread-safe."""

    def __init__(self, uri: str, store: ObjectStore, state: ReplayState) -> None:
        self.uri = uri
        self.store = store
        self._state = state
        interval = state.stream_meta.snapshot_interval
        self._rebase_at = (state.version // interval + 1) * interval
        self._damaged_index = False
        self._lock = threading.Lock()
        self._confirmed = time.monotonic()
        """When a read last found the log's head (monotonic)."""

    @property
    def state(self) -> ReplayState:
        """The replay state seen now. Never modified once published: copy it to experiment."""
        return self._state

    def publish(self, state: ReplayState, *, replace: bool = False) -> None:
        """Makes ``state`` (private to the caller until now) the view, unless a newer one
        is (or, with ``replace``, one as new). First, once per snapshot interval, swaps what
        it holds in memory for the newest snapshot's segments."""
        interval = state.stream_meta.snapshot_interval
        if state.version >= self._rebase_at and not self._damaged_index:
            try:
                done = rebase(self.store, state)
            except StoreError:
                done = False  # only memory and stale names: try again soon
            # The manifest may not be written yet (its writer is racing this handle): try
            # again a tenth of an interval on, and after a success, at the next snapshot.
            self._rebase_at = (state.version // interval + 1) * interval if done else \
                state.version + max(1, interval // 10)
        with self._lock:
            if state.version > self._state.version or \
                    replace and state.version == self._state.version:
                self._state = state

    def refresh(self) -> int:
        """Reads the entries committed since the last look (a GET each, in parallel rounds
        behind the head); returns the version now seen."""
        return self._catch_up(None)

    def poll(self) -> int:
        """``refresh`` through this process's ``SharedHead`` (``lakestream/log/head.py``): one GET
        per new version and one per backoff round for every handle of the stream that waits
        at the head. Committers refresh instead: they must see every rival at once."""
        head = shared_head(self.store, self._state.stream_meta.created_ms)
        return self._catch_up(head.reader(self.store), head.due())

    def poll_wait_s(self) -> float:
        """Seconds until ``poll`` can see a version past the view: the pause of the
        process's shared head (0: poll now)."""
        return shared_head(self.store, self._state.stream_meta.created_ms).wait_s()

    def _catch_up(self, read: ReadEntry | None, due: float = 0.0) -> int:
        """The one catch-up of the view: ``read`` reads a version (None: a GET); ``due``
        versions are likely there (``catch_up``)."""
        seen = self._state
        if self._idle():
            return self.reopen(None)
        t0 = time.monotonic()
        try:
            if due >= 1:
                state = seen.copy()
                t = catch_up(self.store, state, read, due)
            else:
                entry = entry_or_none(self.store, seen.version + 1) if read is None \
                    else read(seen.version + 1)
                if entry is None:
                    self._confirmed = max(self._confirmed, t0)
                    return seen.version
                state = seen.copy()
                state.apply(seen.version + 1, entry)
                t = catch_up(self.store, state, read)
        except LogCompactedError as e:
            return self.reopen(e)
        self.publish(state)
        self._confirmed = max(self._confirmed, t)
        return self._state.version

    def _idle(self) -> bool:
        """Whether no read has confirmed the view at the head for ``REOPEN_IDLE_S``: the
        tombstone after it may be gone by now."""
        return time.monotonic() - self._confirmed > REOPEN_IDLE_S

    def reopen(self, compacted: LogCompactedError | None) -> int:
        """Replaces a view that may be older than the retained log by the stream opened from
        its newest snapshot (``compacted``: the tombstone met says which, at least)."""
        t0 = time.monotonic()
        if compacted is not None:
            log.info("%s; reopening %s", compacted, self.uri)
        state = load_state(self.store, self.uri,
                           start=None if compacted is None else compacted.snapshot)
        self.publish(state)
        self._confirmed = max(self._confirmed, t0)
        return self._state.version

    def transact(self, build: Build, options: CommitOptions | None = None, *,
                 catch_up: bool = False,
                 post_commit: tuple[PostCommit, ...] = DEFAULT_POST_COMMIT) -> Outcome:
        """Runs one ``Transaction`` on the view and publishes the state it ends with, whatever
        the outcome; returns the outcome for the caller to branch on.

        Raises:
            Only what is not an outcome (a bug in ``build``, KeyboardInterrupt): the entry
            may or may not have landed.
        """
        if self._idle():
            self.reopen(None)
        t0 = time.monotonic()
        outcome = Transaction(self.store, self._state, build, options, catch_up=catch_up,
                              post_commit=post_commit).commit()
        self.publish(outcome.state)
        if isinstance(outcome, Landed):
            self._confirmed = max(self._confirmed, t0)
        return outcome

    def recover(self, damage: SegmentError) -> ReplayState:
        """A state without the segment ``damage`` names: reopened from the newest snapshot
        (the segment may have been superseded, and gc deleted it, while this view held an
        older manifest's names), or else replayed from the log alone."""
        log.warning("%s; reopening %s", damage, self.uri)
        state = load_state(self.store, self.uri)
        if any(part.key == damage.key for part in state.index.parts):
            self._damaged_index = True  # rebasing would name the damaged segment again
            state = replay_log(self.store, damage)
        self.publish(state, replace=True)
        return state
