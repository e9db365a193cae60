"""The committer thread: group-commits uploaded fragments in seq order, paced by DAC."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakestream.errors import ProducerFencedError
from lakestream.producers.policy import IntervalController
from lakestream.writing import Append, Entry, FragmentRef, ReplayState, refuse_if_sealed

if TYPE_CHECKING:
    from lakestream.producers.producer import Producer


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

    def __init__(self, producer: Producer) -> None:
        super().__init__(name=f"lakestream-commit-{producer.producer_id}", daemon=True)
        self._p = producer
        o = producer.options
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
        self._next = producer.committed_seq + 1

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
            if self._stopping:
                return None
            batch: list[Uploaded] = []
            while self._next in self._ready and len(batch) < self._batch_limit:
                batch.append(self._ready.pop(self._next))
                self._ready_bytes -= batch[-1].nbytes
                self._next += 1
            return batch

    def run(self) -> None:
        p = self._p
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
                result = p.stream.commit(
                    self._build(batch), self._commit_options,
                    catch_up=self._adaptive and (wait_s > 0 or contended or first))
                cpu_s = time.thread_time() - cpu_s
                if result is not None:
                    first = False
                    # Rival producers, not entries: those whose appends landed since our
                    # previous commit, however they were folded in (this commit's catch-up
                    # and lost races, or the writer's own refreshes).
                    rivals = p.stream.state.writers_since(mine, besides=p.producer_id)
                    mine = result.version
                    p.stats.add_commit(result.attempts, result.conflicts, len(batch),
                                       result.latency_s)
                    contended = result.conflicts > 0
                    if self._adaptive:
                        # The store's round trips, not the latency (catching up after a
                        # long wait takes long) nor building the entry (it grows with the
                        # batch); the rival producers whose entries it folded in; and,
                        # when writes wait for the upload threads (more written than they
                        # are uploading), the CPU a commit takes from them.
                        with self._cond:
                            ready = len(self._ready)
                        waiting = p._inflight - len(batch) - ready  # not uploaded yet
                        wait_s = self._controller.observe(
                            result.store_s, rivals, cpu_s=cpu_s,
                            bound=waiting > p.upload_threads)
                        gap_s = max(GAP_WINDOWS * result.window_s, self._min_gap_s)
                p._on_committed(batch[-1].seq, batch[-1].state, batch)
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's next call
            p._fail(e)

    def _build(self, batch: list[Uploaded]) -> Any:
        p = self._p

        def build(state: ReplayState, commit_id: str) -> Entry | None:
            refuse_if_sealed(state, p.uri)
            mine = state.producers.get(p.producer_id)
            if mine is not None and mine.epoch > p.epoch:
                raise ProducerFencedError(
                    f"producer {p.producer_id} epoch {p.epoch} was fenced by epoch "
                    f"{mine.epoch} at or before version {state.version} of {p.uri}: a newer "
                    "instance is running; stop this one"
                )
            committed = mine.seq if mine is not None else -1
            fresh = [u for u in batch if u.seq > committed]  # re-sent seqs are dropped
            if not fresh:
                return None
            refs, offset = [], state.next_offset
            for u in fresh:
                refs.append(FragmentRef(u.key, u.rows, u.size, offset, u.seq, u.crc32))
                offset += u.rows
            return Append(p.producer_id, p.epoch, tuple(refs), fresh[-1].state, commit_id)

        return build
