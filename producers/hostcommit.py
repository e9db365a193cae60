"""Commits shared by a host (``ProducerOptions(share_commits="host")``): the producers of
one host hand their uploaded fragments to whichever of them holds the host's commit lock,
which commits them all in one entry, paced by DAC as one committer (docs/design.md §5).

Each producer's committer thread is one of two things, and turns from the first into the
second whenever the lock is free:

- **A producer of the host** leaves each contiguous run of its uploaded fragments in the
  host's folder (``lakestream.writing.HostRuns``) and watches it. When the file is gone, the
  host's committer has taken it; the producer reads the log, and what the log holds of its
  seqs is committed (its state with them). The log, never the folder, says what landed. A
  run that has waited twice DAC's longest wait (a host committer stopped, not dead:
  its lock held) the producer commits itself, as a lone producer does: the log's seqs make the
  second of two commits of a run commit nothing.
- **The host's committer** takes what is in the folder when its wait is over (its own
  fragments first), commits it in one ``SharedAppend`` (each producer's part with its own
  epoch, seqs and state: a fenced one left out, seqs the log holds dropped), and removes
  the runs the log now holds. Its rivals, for DAC, are the writers besides its host.

A host committer that dies drops its lock with its process; the next producer to look
takes it and commits what waits, its own included: nothing is lost, and the seqs the log
holds keep anything from landing twice.

With ``share_commits="store"`` the host's committer also pools the host's runs with other
hosts' through the store (``lakestream.producers.poolcommit``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from lakestream.errors import StoreError
from lakestream.producers.committer import GAP_WINDOWS, Committer, Uploaded
from lakestream.producers.inflight import InFlight
from lakestream.producers.options import ProducerOptions
from lakestream.producers.stats import ProducerStats
from lakestream.stream import Stream
from lakestream.writing import (
    HostRuns,
    Published,
    Run,
    appending,
    failpoint,
    refuse_if_fenced,
    sharing,
)

log = logging.getLogger("lakestream")

POLL_S = 0.002
"""How often a producer of the host with runs waiting looks whether they were taken, and
whether the lock is free."""
IDLE_POLL_S = 0.05
"""How often a producer of the host with nothing waiting looks whether the lock is free
(the host's committer closed, or died, leaving others' runs); and the host's committer,
once its wait is over, for runs no poke told it of."""
ALONE_AFTER_S = 1.0
"""A run not taken by the host's committer within twice ``max_interval_s`` (DAC's longest
wait; 10 s by default), and at least this long, is committed by its own producer."""


@dataclass
class Pending:
    """A run of this producer's, handed to the host and not yet known to be committed."""

    name: str | None
    """Its file in the folder; None: the host's committer's own, never left there."""
    fragments: list[Uploaded]
    since: float


class HostCommitter(Committer):
    """A producer's committer when its host shares commits (see the module)."""

    def __init__(self, stream: Stream, producer_id: str, epoch: int, options: ProducerOptions,
                 stats: ProducerStats, inflight: InFlight, upload_threads: int,
                 on_commit: Callable[[int], None] | None, *, runs: HostRuns) -> None:
        super().__init__(stream, producer_id, epoch, options, stats, inflight, upload_threads,
                         on_commit)
        self._runs = runs
        self._alone_after_s = max(ALONE_AFTER_S, 2 * self._controller.max_s)
        self._pending: list[Pending] = []
        self._wait_s, self._gap_s, self._landed_at = 0.0, 0.0, 0.0
        self._contended, self._first, self._mine = False, True, -1
        self._stuck = False
        """Whether the host's committer holds the lock but takes nothing (stopped): this
        producer then commits alone, and still leaves its runs, until one is taken."""
        self._left: str | None = None
        """The first run it committed alone and left in the folder, while stuck: the host's
        committer, back, removes it."""
        self._alone_at = 0.0
        """When, stuck, it may commit alone next."""

    def ready(self, fragment: Uploaded) -> None:
        super().ready(fragment)
        if self._runs.leading:  # it waits on pokes; a producer of the host pokes it once
            self._runs.poke()   # the run is left

    def stop(self) -> None:
        super().stop()
        if self._runs.leading:
            self._runs.poke()

    def _run(self) -> None:
        failed = True
        try:
            while True:
                step = self._lead if self._runs.lead() else self._follow
                if not step():
                    break
            failed = False
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's next call
            self._inflight.fail(e)
        finally:
            try:
                if self._runs.leading:
                    self._resigning()
            finally:
                self._runs.resign()
            if failed or self._stopping:  # failed, aborted, or closed after a failure:
                # what it left is not to be committed (a holder may have taken it already)
                self._runs.remove([p.name for p in self._pending if p.name is not None])

    # -- a producer of the host ----------------------------------------------------------

    def _follow(self) -> bool:
        """One look as a producer of the host: hands over what is uploaded, learns what
        landed; False once stopped."""
        batch = self._take_ready(POLL_S if self._pending else IDLE_POLL_S)
        if batch is None:
            return False
        now = time.monotonic()
        if batch:
            self._pending.append(Pending(self._runs.publish(self._producer_id, self._epoch,
                                                             batch), batch, now))
            self._runs.poke()
            failpoint("after_handover")
        taken = any(p.name is not None and not self._runs.waiting(p.name)
                    for p in self._pending)
        if self._stuck and self._left is not None and not self._runs.waiting(self._left):
            taken, self._stuck, self._left = True, False, None  # the host's committer is back
        if taken:
            try:
                self._stream.refresh()
            except StoreError as e:  # a store's hiccup: look again at the next poll
                log.debug("producer %s: reading the log failed, again soon: %s",
                          self._producer_id, e)
                return True
            self._settle()
        elif self._pending and (self._stuck and now >= self._alone_at or
                                now - self._pending[0].since > self._alone_after_s):
            self._commit_alone(now)
        return True

    def _commit_alone(self, now: float) -> None:
        """Commits this producer's pending runs itself (at most ``max_fragments_per_commit``
        fragments), the host's committer having taken none for ``_alone_after_s``; they stay
        in the folder, so that their going tells that it is back."""
        if not self._stuck:
            log.warning("producer %s: the host's committer took no run for %.0f s; "
                        "committing alone until it takes one", self._producer_id,
                        self._alone_after_s)
        self._stuck = True
        if self._left is None:
            self._left = next((p.name for p in self._pending if p.name is not None), None)
        fragments = [u for p in self._pending for u in p.fragments][:self._batch_limit]
        result = self._stream.commit(
            appending(self._stream.uri, self._producer_id, self._epoch, fragments),
            self._commit_options, catch_up=True)
        # Paced as DAC's gap paces a lone committer, no more.
        window = result.window_s if result is not None else 0.0
        self._alone_at = now + max(GAP_WINDOWS * window, self._min_gap_s)
        self._settle()

    def _take_ready(self, timeout: float) -> list[Uploaded] | None:
        """What is uploaded and contiguous now (perhaps nothing), after waiting up to
        ``timeout`` for the next seq; None once stopped."""
        with self._cond:
            if self._next not in self._ready and not self._stopping:
                self._cond.wait(timeout)
            return None if self._stopping else self._pop_run()

    def _settle(self) -> None:
        """Counts as committed the pending runs the view's log holds; hands over again a run
        gone from the folder that it does not hold (the folder was cleared).

        Raises:
            ProducerFencedError: a newer epoch of this producer is in the log.
        """
        state = self._stream.state
        refuse_if_fenced(state, self._stream.uri, self._producer_id, self._epoch)
        mine = state.producers.get(self._producer_id)
        committed = mine.seq if mine is not None else -1
        now = time.monotonic()
        while self._pending and self._pending[0].fragments[-1].seq <= committed:
            done = self._pending.pop(0)
            self._stats.add_landed(len(done.fragments), now - done.since)
            last = done.fragments[-1]
            if self._on_commit is not None:  # before a flush waiting on it returns
                self._on_commit(last.seq)
            self._inflight.committed(done.fragments, last.seq, last.state)
        for p in self._pending:
            if p.name is not None and not self._runs.waiting(p.name):
                p.name = self._runs.publish(self._producer_id, self._epoch, p.fragments)

    # -- the host's committer ------------------------------------------------------------

    def _lead(self) -> bool:
        """One commit for the host, once DAC's wait is over and there is something to
        commit; False once stopped."""
        while True:
            with self._cond:
                if self._stopping:
                    return False
                now = time.monotonic()
                due = now >= self._landed_at + max(self._wait_s, self._gap_s) or \
                    self._full() and now >= self._landed_at + self._gap_s
                own = self._pop_run() if due else []
            if own:
                self._pending.append(Pending(None, own, now))
            found = self._runs.gather() if due or self.pooling else []
            if due and (any(p.name is None for p in self._pending) or found):
                break
            if due:  # nothing to commit: until a producer (or its own upload) pokes
                self._runs.wait(IDLE_POLL_S)
                continue
            if self.pooling:  # until a poke, or the part of the wait it acts in next
                self._runs.wait(min(IDLE_POLL_S, max(POLL_S, self._waiting(found, now))))
                continue
            with self._cond:  # woken early by its own uploads filling half the budget
                if not self._stopping:
                    self._cond.wait(min(IDLE_POLL_S, max(
                        POLL_S, self._landed_at + max(self._wait_s, self._gap_s) - now)))
        self._commit_for_host(found)
        return True

    def _commit_for_host(self, found: list[Published]) -> None:
        own = [u for p in self._pending for u in p.fragments]
        runs, fragments = [], 0
        if own:
            runs.append(Run(self._producer_id, self._epoch, own[:self._batch_limit]))
            fragments = len(runs[0].fragments)
        others = [p.run for p in found] + self._others()  # the host's first
        for run in merged(others):  # sharing() leaves out what the entry cannot take
            room = self._batch_limit - fragments
            if room <= 0:
                break
            if (run.producer, run.epoch) != (self._producer_id, self._epoch):  # taken above
                runs.append(Run(run.producer, run.epoch, run.fragments[:room]))
                fragments += len(runs[-1].fragments)
        stream = self._stream
        cpu_s = time.thread_time()
        result = stream.commit(sharing(stream.uri, self._runs.host, runs),
                               self._commit_options,
                               catch_up=self._wait_s > 0 or self._contended or self._first)
        cpu_s = time.thread_time() - cpu_s
        state = stream.state
        self._runs.remove([p.name for p in found if settled(state, p)])
        if result is not None:
            self._first = False
            rivals = state.writers_since(self._mine, besides=self._runs.host)
            self._mine = result.version
            self._stats.add(commits=1, attempts=result.attempts, conflicts=result.conflicts)
            self._contended = result.conflicts > 0
            self._wait_s, self._gap_s = self._pace(result, rivals, cpu_s, len(own))
        self._landed_at = time.monotonic()
        self._settle()

    # -- what a host's committer that pools its runs does besides (``PoolingCommitter``) --

    pooling = False
    """Whether it does something while it waits (and so waits on pokes)."""

    def _waiting(self, found: list[Published], now: float) -> float:
        """Called while it waits between commits (``found``: the folder's runs); returns
        how long it may sleep."""
        return self._landed_at + max(self._wait_s, self._gap_s) - now

    def _others(self) -> list[Run]:
        """Runs of other hosts that its next commit carries after its host's."""
        return []

    def _resigning(self) -> None:
        """Called as it lets the host's lock go."""


def merged(runs: list[Run]) -> list[Run]:
    """``runs`` as one run per producer and epoch, in the order each first appears, its
    fragments each once, in seq order (two sources may hold one fragment)."""
    by_writer: dict[tuple[str, int], dict[int, Uploaded]] = {}
    for run in runs:
        frags = by_writer.setdefault((run.producer, run.epoch), {})
        for u in run.fragments:
            frags.setdefault(u.seq, u)
    return [Run(producer, epoch, [frags[k] for k in sorted(frags)])
            for (producer, epoch), frags in by_writer.items() if frags]


def settled(state: object, published: Published) -> bool:
    """Whether the log ``state`` holds every seq of ``published``, or fenced its producer."""
    mine = state.producers.get(published.run.producer)  # type: ignore[attr-defined]
    return mine is not None and (mine.epoch > published.run.epoch or
                                 mine.seq >= published.run.fragments[-1].seq)
