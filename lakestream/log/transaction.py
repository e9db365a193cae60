"""The commit as a transaction: an entry built on a private copy of the replay state, put
at the next version with put-if-absent, and a typed outcome that cleanup branches on.

The loop is written once: put at v+1; on a 412 read the winner — our own commit id means an
earlier attempt had landed (a retried PUT whose reply was lost), anything else is folded in
and the entry is built again on the new state, so its preconditions are checked on exactly
the state it commits on. Bounded attempts, jittered backoff, a deadline. Work after landing
(the periodic snapshot) is declared, runs after the outcome is known, and can never turn a
landed commit into an error.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from lakestream.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    CorruptLogError,
    LakestreamError,
    LogCompactedError,
    StoreError,
)
from lakestream.failpoints import failpoint
from lakestream.log.codec import encode_entry, entry_digest
from lakestream.log.entries import Compacted, Entry, Link, new_commit_id
from lakestream.log.opening import load_state
from lakestream.log.outcomes import (
    Build,
    CommitOptions,
    CommitResult,
    Exhausted,
    Landed,
    Nothing,
    Outcome,
    PostCommit,
    Rejected,
    Unknown,
)
from lakestream.log.put import Put, put_log_entry
from lakestream.log.replay import ReplayState
from lakestream.log.snapshot import write_snapshot
from lakestream.log.tail import catch_up
from lakestream.store.base import ObjectStore

log = logging.getLogger("lakestream")

def snapshot_when_due(store: ObjectStore, state: ReplayState) -> None:
    """Writes the snapshot after ``state.version`` if the version is on the interval."""
    if state.version % state.stream_meta.snapshot_interval == 0:
        write_snapshot(store, state)


DEFAULT_POST_COMMIT: tuple[PostCommit, ...] = (snapshot_when_due,)


# -- the transaction ---------------------------------------------------------------------


@dataclass
class _Tally:
    """What a commit's attempts have met so far."""

    t0: float
    """When the commit began (monotonic)."""
    attempt: int = 0
    conflicts: int = 0
    """Races lost to another's entry."""
    failures: int = 0
    """Attempts that failed otherwise (the store, a version found empty)."""
    unknown: bool = False
    """Whether an attempt's put may have landed, unseen."""
    fresh: float | None = None
    """When the state was last known to be at the head, for the next attempt's window."""


class Transaction:
    """One commit: ``build`` made into an entry and put at the next version.

    Built on a private copy of ``base`` (the caller's state is never touched); the state
    after the outcome, caught up with every entry it read, comes back in the outcome for
    the caller to publish. ``catch_up`` reads the entries others committed before the first
    attempt: cheaper than a failed put when the caller expects the head to have moved.
    """

    def __init__(self, store: ObjectStore, base: ReplayState, build: Build,
                 options: CommitOptions | None = None, *, catch_up: bool = False,
                 post_commit: Sequence[PostCommit] = DEFAULT_POST_COMMIT) -> None:
        self.store = store
        self.state = base.copy()
        self.build = build
        self.options = options or CommitOptions()
        self.catch_up = catch_up
        self.post_commit = tuple(post_commit)
        self.commit_id = new_commit_id()

    def commit(self) -> Outcome:
        """Runs the commit loop once; returns its outcome.

        Raises:
            Whatever is not an outcome: a bug in ``build``, or ``KeyboardInterrupt`` with a
            put in flight. Neither says whether the entry landed, so neither allows cleanup.
        """
        o = self.options
        self._build_s = 0.0
        tally = _Tally(time.monotonic())
        deadline = tally.t0 + o.deadline_s
        try:
            if self.catch_up:
                tally.fresh = self._catch_up()
        except StoreError:
            pass  # only an optimisation: the put finds out
        except CorruptLogError as e:
            return self._refused(e, tally.unknown)
        while tally.attempt < o.max_attempts:
            outcome = self._attempt(tally)
            if outcome is not None:
                return outcome
            if time.monotonic() > deadline:
                break
        if tally.unknown:
            return self._unknown(None)
        return Exhausted(CommitConflictError(
            f"commit {self.commit_id} to {self.store.uri} lost {tally.conflicts} races and "
            f"failed {tally.failures} times in {tally.attempt} attempts and "
            f"{time.monotonic() - tally.t0:.1f}s; nothing was committed"), self.state)

    def _attempt(self, tally: _Tally) -> Outcome | None:
        """One attempt: the entry built on the state and put at the next version; its
        outcome, or None to try again."""
        tally.attempt += 1
        t_attempt = time.monotonic() if tally.fresh is None else tally.fresh
        tally.fresh = None
        state = self.state
        t_build = time.monotonic()
        try:
            entry = self.build(state, self.commit_id)
        except LakestreamError as e:
            return self._refused(e, tally.unknown)
        if entry is None:
            return Nothing(state)
        version = state.version + 1
        failpoint("before_commit")
        data = encode_entry(entry, state.digest)
        self._build_s = time.monotonic() - t_build
        try:
            put = put_log_entry(self.store, version, data, self.commit_id)
        except CorruptLogError as e:
            # Something that is not our entry holds the version, and nothing can be
            # committed after it until it is repaired.
            return self._refused(e, tally.unknown)
        if put.holder is None and put.landed:
            failpoint("after_put")
            entry = replace(entry, link=Link(entry_digest(data), state.digest, True))
            return self._landed(version, entry, tally.attempt, tally.conflicts, tally.t0,
                                t_attempt)
        if put.failure is not None:
            tally.unknown = True
        return self._after_failed_put(version, entry, put, state, tally, t_attempt)

    def _after_failed_put(self, version: int, entry: Entry, put: Put, state: ReplayState,
                          tally: _Tally, t_attempt: float) -> Outcome | None:
        """What the entry at ``version`` says of a put there that failed: ours after all
        (landed), another's (caught up, to try again after a backoff), a tombstone (reopen),
        or none (try again at the same version)."""
        winner = put.holder
        if isinstance(winner, Compacted):
            # gc compacted the version this state would commit at: the state is older
            # than the retained log. The tombstone names the entry it replaced.
            if winner.replaced == self.commit_id:
                return self._landed_compacted(version, entry, tally.attempt, tally.conflicts,
                                              tally.t0, winner)
            tally.unknown = False  # another entry held the version: ours is not there
            try:
                self._reopen(winner.snapshot)
            except StoreError:
                tally.failures += 1
                self._backoff(tally.failures)
            except CorruptLogError as e:
                return self._refused(e, tally.unknown)
        elif winner is not None and put.landed:
            return self._landed(version, winner, tally.attempt, tally.conflicts, tally.t0,
                                t_attempt)
        elif winner is not None:
            return self._lost(version, winner, state, tally)
        else:
            tally.failures += 1
            self._backoff(tally.failures)
        return None

    def _lost(self, version: int, winner: Entry, state: ReplayState,
              tally: _Tally) -> Outcome | None:
        """Another's entry holds ``version``: it is folded in, and after a backoff the state
        catches up (after sleeping the head has moved again, and a put built on the view
        from before the sleep would lose for certain)."""
        tally.conflicts += 1
        try:
            state.apply(version, winner)
        except CorruptLogError as e:
            return self._refused(e, tally.unknown)
        tally.unknown = False  # the version we tried is taken by another: ours is not there
        self._backoff(tally.conflicts)
        try:
            tally.fresh = self._catch_up()
        except StoreError:
            tally.failures += 1
        except CorruptLogError as e:
            return self._refused(e, tally.unknown)
        return None

    def _catch_up(self) -> float:
        """Reads the tail into the state; one that runs into gc's tombstones (the state is
        older than the retained log) is reopened from the newest snapshot instead. Returns
        when the read that found the head was sent.

        Raises:
            CorruptLogError, StoreError: as ``catch_up``.
        """
        try:
            return catch_up(self.store, self.state)
        except LogCompactedError as e:
            return self._reopen(e.snapshot)

    def _reopen(self, snapshot: int) -> float:
        """Replaces the state, older than the retained log, by the stream opened from the
        newest snapshot (at ``snapshot`` or later). The entry is then built on that."""
        t = time.monotonic()
        fresh = load_state(self.store, self.store.uri, start=snapshot)
        if fresh.version <= self.state.version:
            raise CorruptLogError(
                f"{self.store.uri}: log version {self.state.version + 1} is compacted, yet "
                f"the newest snapshot found is at version {fresh.version}")
        log.info("the view of %s at version %d was older than the retained log; reopened "
                 "at version %d", self.store.uri, self.state.version, fresh.version)
        self.state = fresh
        return t

    def _landed_compacted(self, version: int, entry: Entry, attempts: int, conflicts: int,
                          t0: float, tombstone: Compacted) -> Landed:
        """An earlier attempt whose outcome was unknown had landed at ``version``, and gc has
        since compacted it: the stream opened from the newest snapshot holds it."""
        try:
            self._reopen(tombstone.snapshot)
        except LakestreamError:
            pass  # it landed all the same; the caller's view stays as old as it was
        result = CommitResult(version, entry, attempts, conflicts, time.monotonic() - t0, 0.0)
        return Landed(result, self.state)

    def _refused(self, error: LakestreamError, unknown: bool) -> Rejected | Unknown:
        """Refused, definitely, unless an earlier attempt's outcome is still unknown."""
        return self._unknown(error) if unknown else Rejected(error, self.state)

    def _unknown(self, cause: LakestreamError | None) -> Unknown:
        error = CommitStateUnknownError(
            f"commit {self.commit_id} to {self.store.uri} at version {self.state.version + 1}: "
            "the store failed and the outcome is unknown; reopen the stream to learn it")
        error.__cause__ = cause
        return Unknown(error, self.state)

    def _backoff(self, n: int) -> None:
        o = self.options
        time.sleep(random.uniform(0, min(o.backoff_cap_s, o.backoff_base_s * 2 ** min(n, 20))))

    def _landed(self, version: int, entry: Entry, attempts: int, conflicts: int, t0: float,
                t_attempt: float) -> Landed:
        window = time.monotonic() - t_attempt
        self.state.apply(version, entry)
        failpoint("after_commit")
        errors = 0
        for step in self.post_commit:
            try:
                step(self.store, self.state)
            except Exception:  # noqa: BLE001 - post-commit work must not fail a landed commit
                errors += 1
                log.warning("post-commit step %s after version %d of %s failed",
                            getattr(step, "__name__", step), version, self.store.uri,
                            exc_info=True)
        result = CommitResult(version, entry, attempts, conflicts, time.monotonic() - t0,
                              window, store_s=max(0.0, window - self._build_s),
                              post_commit_errors=errors)
        return Landed(result, self.state)

