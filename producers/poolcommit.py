"""Runs pooled through the store (``ProducerOptions(share_commits="store")``): a host's
committer (``lakestream.producers.hostcommit``) that also keeps what its host has waiting
in the store for the other hosts' committers, and carries theirs in its own commits
(docs/design.md §5, *Runs pooled through the store*).

While it waits between commits it rewrites its host's object (``lakestream.writing.
PooledRuns``: its own uploads and the runs in the folder) whenever that changes, reading the
log every ``IDLE_POLL_S`` to learn which of them another host committed; in the last stretch
of the wait, about as long as that took last time, it lists and reads the other hosts'
objects, and its commit carries their runs after its host's own. The log's seqs keep
exactly-once: whichever host commits a run second commits nothing of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from lakestream.errors import PermissionDeniedError, StoreError
from lakestream.producers.committer import Uploaded
from lakestream.producers.hostcommit import IDLE_POLL_S, HostCommitter, Pending, merged, settled
from lakestream.producers.inflight import InFlight
from lakestream.producers.options import ProducerOptions
from lakestream.producers.stats import ProducerStats
from lakestream.stream import Stream
from lakestream.writing import HostRuns, PooledRuns, Published, Run

log = logging.getLogger("lakestream")


class PoolingCommitter(HostCommitter):
    """A producer's committer when its host pools runs through the store (see the
    module)."""

    pooling = True

    def __init__(self, stream: Stream, producer_id: str, epoch: int, options: ProducerOptions,
                 stats: ProducerStats, inflight: InFlight, upload_threads: int,
                 on_commit: Callable[[int], None] | None, *, runs: HostRuns,
                 pool: PooledRuns) -> None:
        super().__init__(stream, producer_id, epoch, options, stats, inflight, upload_threads,
                         on_commit, runs=runs)
        self._pool: PooledRuns | None = pool
        """None once the store refused it: the host's commits go on unpooled."""
        self._read_at = 0.0
        """When it last read the log while it waited."""
        self._foreign: list[Run] | None = None
        """The other hosts' pooled runs, read for its next commit while it waited (taken
        only if read just before it: an idle host's copy would be long out of date)."""
        self._foreign_at = 0.0
        self._early = (0, 0)
        """Its own fragments taken from the ready ones while it waits and not yet
        committed, and their bytes: they still count towards half the budget (``_full``)."""
        self._gather_s = self._offer_s = 0.0
        """How long its last reading of the pool, and its last put of the host's runs,
        took."""

    def _waiting(self, found: list[Published], now: float) -> float:
        left = super()._waiting(found, now)
        if self._pool is None:
            return left
        self._between_commits(found, now, left)
        left = super()._waiting(found, time.monotonic())
        return left - self._gather_s if self._foreign is None else left  # wake to read

    def _others(self) -> list[Run]:
        if self._pool is None:
            return []
        foreign, self._foreign = self._foreign, None
        if foreign is not None and \
                time.monotonic() - self._foreign_at <= 2 * self._gather_s + IDLE_POLL_S:
            return foreign
        return self._gather()

    def _resigning(self) -> None:
        if self._pool is not None:
            self._withdraw()

    def _settle(self) -> None:
        super()._settle()
        self._count_early()

    def _between_commits(self, found: list[Published], now: float, left: float) -> None:
        """What a pooling host's committer does while it waits ``left`` more seconds for
        its next commit: in its last stretch, about as long as listing and reading the
        pool took last time, it reads the other hosts' runs for that commit (which then
        waits for no request of the pool); before it, it keeps the host's own in the store
        for the others (an offer only if it would end before the commit is due: the host's
        runs are about to be committed anyway)."""
        if left <= self._gather_s:
            if self._foreign is None:
                self._foreign = self._gather()
                self._foreign_at = time.monotonic()
            return
        if left <= self._offer_s:
            return
        with self._cond:  # its own too, to learn when another host commits them
            own = self._pop_run()
        if own:
            self._pending.append(Pending(None, own, now))
            self._count_early()
        self._offer(self._unsettled(found, now))

    def _full(self) -> bool:
        n, nbytes = self._early
        return len(self._ready) + n >= self._full_fragments or \
            self._ready_bytes + nbytes >= self._full_bytes

    def _own_pending(self) -> list[Uploaded]:
        """Its own fragments in ``_pending`` (those of the folder's runs it left as a
        producer of the host are in ``found``)."""
        return [u for p in self._pending if p.name is None for u in p.fragments]

    def _count_early(self) -> None:
        """Counts its own fragments waiting in ``_pending`` (see ``_early``)."""
        own = self._own_pending()
        self._early = (len(own), sum(u.nbytes for u in own))

    def _gather(self) -> list[Run]:
        """The other hosts' pooled runs (none if the store failed: the host's go alone)."""
        assert self._pool is not None
        t0 = time.monotonic()
        try:
            return self._pool.gather()
        except StoreError as e:
            log.debug("producer %s: listing pooled runs failed: %s", self._producer_id, e)
            return []
        except PermissionDeniedError as e:
            self._refused(e)
            return []
        finally:
            self._gather_s = time.monotonic() - t0

    def _unsettled(self, found: list[Published], now: float) -> list[Published]:
        """The runs of ``found`` the log does not hold, having read the log at most every
        ``IDLE_POLL_S`` while the host has runs waiting: another host's commit may have
        taken them, and a producer learns that only from the log (its own pending ones are
        settled, the folder's removed)."""
        if not (found or self._pending) or now - self._read_at < IDLE_POLL_S:
            return found
        self._read_at = now
        try:
            self._stream.refresh()
        except StoreError as e:  # a store's hiccup: look again at the next poll
            log.debug("producer %s: reading the log failed: %s", self._producer_id, e)
            return found
        state = self._stream.state
        done = [p for p in found if settled(state, p)]
        self._runs.remove([p.name for p in done])
        self._settle()
        return [p for p in found if p not in done]

    def _offer(self, found: list[Published]) -> None:
        """Makes the host's pooled runs what it has waiting: its own uploads and the runs
        in the folder (the store's hiccup: the next offer)."""
        own = self._own_pending()
        runs = [Run(self._producer_id, self._epoch, own)] if own else []
        assert self._pool is not None
        t0 = time.monotonic()
        try:
            if self._pool.offer(merged(runs + [p.run for p in found])):
                self._offer_s = time.monotonic() - t0
        except StoreError as e:
            log.debug("producer %s: pooling the host's runs failed: %s", self._producer_id, e)
        except PermissionDeniedError as e:
            self._refused(e)

    def _withdraw(self) -> None:
        """Empties the host's pooled runs as it lets the lock go: the next host committer
        offers what is left."""
        assert self._pool is not None
        pool = self._pool
        try:
            pool.offer([])
        except (StoreError, PermissionDeniedError) as e:  # left to go stale (an hour)
            log.debug("producer %s: withdrawing pooled runs failed: %s", self._producer_id, e)
        pool.close()

    def _refused(self, e: PermissionDeniedError) -> None:
        """Turns pooling off for this committer, the store having refused it (credentials
        without ``_lakestream/runs/``): the host's commits go on as ``"host"``'s do."""
        log.warning("producer %s: the store refused the pooled runs (%s); committing for "
                    "this host alone. Grant the producers put, get, list and delete on "
                    "_lakestream/runs/ to pool them", self._producer_id, e)
        assert self._pool is not None
        self._pool.close()
        self._pool = None
