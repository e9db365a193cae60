"""The commit loop, written once: put-if-absent at the next version, fold the winners of lost
races, recognise our own commit after an ambiguous outcome (DESIGN §3, §5)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from lakestream.errors import (
    AlreadyExistsError,
    CommitConflictError,
    CommitStateUnknownError,
    NotFoundError,
    StoreError,
)
from lakestream.failpoints import failpoint
from lakestream.log import Entry, encode_entry, log_key, new_commit_id
from lakestream.replay import ReplayState
from lakestream.snapshot import read_entry, read_tail, write_snapshot
from lakestream.store.base import ObjectStore

Build = Callable[[ReplayState, str], "Entry | None"]
"""Makes the entry to commit on top of a state, with the given commit id; None = nothing to do."""


@dataclass(frozen=True)
class CommitOptions:
    """Bounds of one commit."""

    max_attempts: int = 10_000
    deadline_s: float = 300.0
    backoff_base_s: float = 0.002
    backoff_cap_s: float = 0.25

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.deadline_s <= 0:
            raise ValueError("max_attempts and deadline_s must be positive")
        if not 0 <= self.backoff_base_s <= self.backoff_cap_s:
            raise ValueError("need 0 <= backoff_base_s <= backoff_cap_s")


@dataclass(frozen=True)
class CommitResult:
    version: int
    entry: Entry
    attempts: int
    conflicts: int
    latency_s: float
    """From the call to the entry landing: waits, lost races and catching up included."""
    window_s: float
    """The landing attempt alone, from the state it was built on to the put: how long the
    commit was exposed to a race. Catching up is excluded: it grows with how long the
    caller waited, not with contention."""


def _backoff(options: CommitOptions, n: int) -> None:
    cap = min(options.backoff_cap_s, options.backoff_base_s * 2 ** min(n, 20))
    time.sleep(random.uniform(0, cap))


def commit(store: ObjectStore, state: ReplayState, build: Build,
           options: CommitOptions | None = None, *, catch_up: bool = False) -> CommitResult | None:
    """Commits the entry ``build`` makes at the next version, advancing ``state`` in place.

    On a lost race the winner is folded into ``state`` (so ``build`` sees it) and the commit
    retries at the next version. After a 412 or an ambiguous failure the entry at our
    version is read: if it carries our commit id, the commit had landed. ``catch_up`` reads
    the entries others committed before the first attempt: cheaper than a failed put when
    the caller expects the head to have moved (it waited, or it lost its last race).

    Returns:
        The result, or None if ``build`` found nothing to commit.

    Raises:
        CommitConflictError: every attempt lost a race (definite: nothing was committed).
        CommitStateUnknownError: the store failed and the outcome is unknown (the files the
            entry references must not be deleted).
        Whatever ``build`` raises (e.g. ProducerFencedError), with ``state`` caught up.
    """
    options = options or CommitOptions()
    commit_id = new_commit_id()
    t0 = time.monotonic()
    deadline = t0 + options.deadline_s
    conflicts = failures = 0
    unknown = False
    if catch_up:
        read_tail(store, state)
    for attempt in range(1, options.max_attempts + 1):
        t_attempt = time.monotonic()
        entry = build(state, commit_id)
        if entry is None:
            return None
        version = state.version + 1
        failpoint("before_commit")
        try:
            store.put(log_key(version), encode_entry(entry), mode="create")
        except AlreadyExistsError:
            pass  # lost the race, or our own earlier attempt landed: read the winner
        except StoreError:
            unknown = True
        else:
            return _landed(store, state, version, entry, attempt, conflicts, t0, t_attempt)
        try:
            winner = read_entry(store, version)
        except NotFoundError:
            winner = None  # our write did not land; retrying at the same version is safe
        except StoreError:
            winner, unknown = None, True
        if winner is not None and winner.commit_id == commit_id:
            return _landed(store, state, version, winner, attempt, conflicts, t0, t_attempt)
        if winner is not None:
            conflicts += 1
            state.apply(version, winner)
            unknown = False
            # Back off first, then catch up: after sleeping, the head has moved again, and a
            # put built on the view from before the sleep would lose for certain.
            _backoff(options, conflicts)
            read_tail(store, state)
        else:
            failures += 1
            _backoff(options, failures)
        if time.monotonic() > deadline:
            break
    if unknown:
        raise CommitStateUnknownError(
            f"commit {commit_id} to {store.uri} at version {state.version + 1}: the store "
            "failed and the outcome is unknown; reopen the stream to learn it"
        )
    raise CommitConflictError(
        f"commit {commit_id} to {store.uri} lost {conflicts} races and failed {failures} times "
        f"in {time.monotonic() - t0:.1f}s; nothing was committed"
    )


def _landed(store: ObjectStore, state: ReplayState, version: int, entry: Entry, attempts: int,
            conflicts: int, t0: float, t_attempt: float) -> CommitResult:
    window = time.monotonic() - t_attempt
    state.apply(version, entry)
    failpoint("after_commit")
    meta = state.stream_meta
    if version % meta.snapshot_interval == 0:
        try:
            write_snapshot(store, state)
        except StoreError:
            pass  # a snapshot only speeds up opening; the next interval writes another
    return CommitResult(version, entry, attempts, conflicts, time.monotonic() - t0, window)
