"""What a commit is given and what it gives back: the build that makes its entry on a state,
its bounds, its result, and its typed outcome, on which cleanup branches
(``log/transaction.py`` runs the commit)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lakestream.errors import CommitConflictError, CommitStateUnknownError, LakestreamError
from lakestream.log.entries import Entry
from lakestream.log.replay import ReplayState
from lakestream.store.base import ObjectStore

Build = Callable[[ReplayState, str], "Entry | None"]
"""Makes the entry to commit on top of a state, with the given commit id; None = nothing to do.
It checks the commit's preconditions on that state and raises a ``LakestreamError`` (e.g.
``ProducerFencedError``, ``StepNotAvailableError``) when one fails: the commit is then
rejected, definitely, with nothing committed."""

PostCommit = Callable[[ObjectStore, ReplayState], None]
"""Work after a commit landed, given the state after it. Failures are logged, never raised."""


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
    """The landing attempt alone, from the read that found the head (or, without one, from
    building the entry) to the put: how long the commit was exposed to a race. The rest of
    catching up is excluded: it grows with how long the caller waited, not with
    contention."""
    store_s: float = 0.0
    """``window_s`` less building and encoding the entry: the store's round trips alone.
    What the store's speed sets, where ``window_s`` also grows with the entry's size."""

    post_commit_errors: int = 0
    """Post-commit steps that failed (logged; the commit itself landed)."""


# -- outcomes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Landed:
    """The entry is in the log at ``result.version``."""

    result: CommitResult
    state: ReplayState
    definite_failure = False


@dataclass(frozen=True)
class Nothing:
    """``build`` found nothing to commit (e.g. every fragment was already committed — maybe
    by an earlier commit of the same files, so this is no licence to delete them)."""

    state: ReplayState
    definite_failure = False


@dataclass(frozen=True)
class Rejected:
    """A precondition failed on the state the entry would have been committed on, or the
    log cannot be replayed up to the version it would take (a corrupt entry there).
    Definite: nothing was committed."""

    error: LakestreamError
    state: ReplayState
    definite_failure = True


@dataclass(frozen=True)
class Exhausted:
    """Every attempt lost a race, until the attempts or the deadline ran out. Definite:
    nothing was committed."""

    error: CommitConflictError
    state: ReplayState
    definite_failure = True


@dataclass(frozen=True)
class Unknown:
    """The store failed and the entry may or may not be in the log: files it references
    must not be deleted; reopening the stream tells."""

    error: CommitStateUnknownError
    state: ReplayState
    definite_failure = False


Outcome = Landed | Nothing | Rejected | Exhausted | Unknown
"""``definite_failure`` is True only for Rejected and Exhausted: the entry is not in the log
and never will be, so the files only it references may be deleted. Nothing else allows it."""


def unwrap(outcome: Outcome) -> CommitResult | None:
    """The result of a landed commit, None if there was nothing to commit.

    Raises:
        The outcome's error: the precondition's (e.g. ProducerFencedError),
        CommitConflictError or CommitStateUnknownError.
    """
    if isinstance(outcome, Landed):
        return outcome.result
    if isinstance(outcome, Nothing):
        return None
    raise outcome.error
