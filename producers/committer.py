"""The committer thread: group-commits uploaded fragments in seq order, paced by DAC."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lakestream.producers.inflight import InFlight
from lakestream.producers.options import ProducerOptions
from lakestream.producers.policy import IntervalController
from lakestream.producers.stats import ProducerStats
from lakestream.stream import Stream
from lakestream.writing import CommitResult, appending


@dataclass(frozen=True)
class Uploaded:
    """A fragment whose file is in the store, waiting for its commit."""

    seq: int
    key: str
    rows: int
    size: int
    state: Any
    nbytes: int
    crc32: int


GAP_WINDOWS = 2.0
"""The least wait after a commit, in commit windows: a rival that lost needs about two
requests (its failed put returning, reading the winner) before it can put again."""


class Committer(threading.Thread):
    """Commits what the upload pool hands it, in seq order, one commit at a time.

    Adaptive policy: each commit carries every contiguous fragment uploaded since the last,
    and the wait between commits comes from an ``IntervalController`` fed with what this
    producer's commits saw (the rival producers whose entries they folded in, the races they
    lost, the store's round trips, their CPU, whether writes wait for the upload threads),
    cut short once half the writer's in-flight
    budget is uploaded — but never shorter than ``GAP_WINDOWS`` commit windows, nor than
    ``min_interval_s`` (a commit's own CPU, ~0.5-1 ms on a local disk, taken up to several
    hundred times a second by one fast producer, came out of the encoding's). That gap is
    what keeps one producer from capturing the log: a rival that lost a race learns of it
    only when its put returns and needs a read before it can retry, so a producer that put
    again the moment its own commit landed would win every race, see no rival commit
    between its own, read that as low load, and starve the others for as long as it had
    fragments ready. Per-fragment policy: one fragment per commit, no wait, fixed retry
    backoff.
    """

    def __init__(self, stream: Stream, producer_id: str, epoch: int, options: ProducerOptions,
                 stats: ProducerStats, inflight: InFlight, upload_threads: int,
                 on_commit: Callable[[int], None] | None = None) -> None:
        super().__init__(name=f"lakestream-commit-{producer_id}", daemon=True)
        self._stream, self._producer_id, self._epoch = stream, producer_id, epoch
        self._stats, self._inflight, self._upload_threads = stats, inflight, upload_threads
        self._on_commit = on_commit
        o = options
        self._adaptive = o.commit_policy == "adaptive"
        self._batch_limit = o.max_fragments_per_commit if self._adaptive else 1
        self._commit_options = o.commit if self._adaptive else dataclasses.replace(
            o.commit, backoff_base_s=0.01, backoff_cap_s=0.01)
        self._controller = IntervalController(max_s=o.max_interval_s)
        self._min_gap_s = o.min_interval_s
        # Commit before the interval is over once half of what the writer may have in
        # flight is uploaded: past that, waiting only blocks the writer.
        self._full_fragments = max(1, o.max_inflight_fragments // 2)
        self._full_bytes = max(1, o.max_inflight_bytes // 2)
        self._ready_bytes = 0
        self._ready: dict[int, Uploaded] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._next = inflight.committed_seq + 1

    def ready(self, fragment: Uploaded) -> None:
        with self._cond:
            was_full = self._full()
            self._ready[fragment.seq] = fragment
            self._ready_bytes += fragment.nbytes
            # Wake the committer only when it can act: the next seq is here, or half the
            # budget now is. Woken for every upload, it took a thread switch per fragment
            # to go back to sleep.
            if fragment.seq == self._next or (self._full() and not was_full):
                self._cond.notify_all()

    def _full(self) -> bool:
        return len(self._ready) >= self._full_fragments or \
            self._ready_bytes >= self._full_bytes

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def _take(self, wait_s: float, gap_s: float = 0.0) -> list[Uploaded] | None:
        """The next contiguous run of uploaded fragments, after ``wait_s`` (or sooner once
        half the in-flight budget is ready, but never before ``gap_s``)."""
        now = time.monotonic()
        deadline, earliest = now + max(wait_s, gap_s), now + gap_s
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                full = self._full()
                if self._next in self._ready and (now >= deadline or (full and now >= earliest)):
                    break
                left = (earliest if full else deadline) - now
                self._cond.wait(max(left, 0.001) if self._next in self._ready else 0.5)
            return None if self._stopping else self._pop_run()

    def _pop_run(self) -> list[Uploaded]:
        """Takes the next contiguous run of uploaded fragments (under ``_cond``)."""
        batch: list[Uploaded] = []
        while self._next in self._ready and len(batch) < self._batch_limit:
            batch.append(self._ready.pop(self._next))
            self._ready_bytes -= batch[-1].nbytes
            self._next += 1
        return batch

    def _pace(self, result: CommitResult, rivals: int, cpu_s: float, taken: int
              ) -> tuple[float, float]:
        """DAC's wait and gap after ``result`` landed ``taken`` fragments, for ``cpu_s`` of
        this thread's CPU, with ``rivals`` other writers seen since the previous commit.

        Fed the store's round trips, not the latency (catching up after a long wait takes
        long) nor building the entry (it grows with the batch); the rivals whose entries it
        folded in; and, when writes wait for the upload threads (more written than they are
        uploading), the CPU a commit takes from them."""
        with self._cond:
            ready = len(self._ready)
        waiting = self._inflight.fragments - taken - ready  # not uploaded yet
        wait_s = self._controller.observe(result.store_s, rivals, cpu_s=cpu_s,
                                          bound=waiting > self._upload_threads)
        return wait_s, max(GAP_WINDOWS * result.window_s, self._min_gap_s)

    def run(self) -> None:
        started = time.thread_time()
        try:
            self._run()
        finally:
            self._stats.add_cpu(("committer", time.thread_time() - started))

    def _run(self) -> None:
        stream = self._stream
        wait_s, gap_s, contended, first = 0.0, 0.0, False, True
        mine = -1  # the version our previous commit landed at
        try:
            while True:
                batch = self._take(wait_s, gap_s)
                if batch is None:
                    return
                # After a wait or a lost race the head has likely moved: read it first
                # rather than pay for a put that fails. At low load, commit without reading
                # first (after the floor of min_interval_s, not a wait of DAC's). Before
                # the first commit the view may be as old as the producer.
                cpu_s = time.thread_time()
                result = stream.commit(
                    appending(stream.uri, self._producer_id, self._epoch, batch),
                    self._commit_options,
                    catch_up=self._adaptive and (wait_s > 0 or contended or first))
                cpu_s = time.thread_time() - cpu_s
                if result is not None:
                    first = False
                    # Rival producers, not entries: those whose appends landed since our
                    # previous commit, however they were folded in (this commit's catch-up
                    # and lost races, or the writer's own refreshes).
                    rivals = stream.state.writers_since(mine, besides=self._producer_id)
                    mine = result.version
                    self._stats.add_commit(result.attempts, result.conflicts, len(batch),
                                       result.latency_s)
                    contended = result.conflicts > 0
                    if self._adaptive:
                        wait_s, gap_s = self._pace(result, rivals, cpu_s, len(batch))
                if self._on_commit is not None:  # before a flush waiting on it returns
                    self._on_commit(batch[-1].seq)
                self._inflight.committed(batch, batch[-1].seq, batch[-1].state)
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's next call
            self._inflight.fail(e)
