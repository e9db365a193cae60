"""The Producer: validate, upload in the background, commit with DAC, exactly once."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any

import pyarrow as pa
from zlib_ng import zlib_ng

from lakestream.errors import LakestreamError, TooLargeError
from lakestream.producers.committer import Committer, Uploaded
from lakestream.producers.hostcommit import HostCommitter
from lakestream.producers.inflight import InFlight
from lakestream.producers.options import ProducerOptions
from lakestream.producers.poolcommit import PoolingCommitter
from lakestream.producers.stats import ProducerStats
from lakestream.stream import Stream
from lakestream.writing import (
    Fence,
    HostRuns,
    ObjectStore,
    PooledRuns,
    Progress,
    check_group,
    check_int,
    check_producer_id,
    check_rows,
    check_state,
    conform,
    encode_fragment,
    failpoint,
    fencing,
    fragment_key,
    is_remote,
    oversized_sample,
    put_fragment,
    read_progress,
    refuse_if_sealed,
    row_group_target,
    warm_conversion,
)

log = logging.getLogger("lakestream")


def upload_threads_for(store: ObjectStore) -> int:
    """The upload pool's size when the options leave it open: one thread per core, up to
    4, on a local disk (encoding and the put are both CPU work there); 4 elsewhere."""
    if not is_remote(store.uri):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        return max(1, min(4, cores))
    return 4


class Producer:
    """Writes samples to a stream as one producer identity, exactly once across restarts.

    Opening fences every older instance of ``producer_id`` (their later commits are void and
    they raise ``ProducerFencedError``). ``write`` validates, then encodes and uploads in a
    background pool and returns at once; one committer thread commits uploaded fragments in
    ``seq`` order with the Decentralized Adaptive Commit. ``state`` (e.g. a prompt cursor) is
    committed atomically with the fragment it accompanies, so after a crash ``p.state`` says
    where to resume: nothing is lost and nothing is written twice.

    Use it as a context manager: a clean exit flushes, an exception does not.
    """

    def __init__(self, uri: str, producer_id: str, *,
                 storage_options: dict[str, str] | None = None,
                 options: ProducerOptions | None = None, max_lag_steps: int | None = None,
                 progress_group: str = "train",
                 on_commit: Callable[[int], None] | None = None) -> None:
        """Opens the stream and fences every older instance of ``producer_id``.

        Args:
            uri: the stream. producer_id: this producer's stable identity.
            storage_options: as for ``lakestream.open``.
            options: upload and commit options.
            max_lag_steps: if set, ``write`` waits while committed steps are more than this
                many ahead of ``progress_group``'s published progress.
            progress_group: the consumer group whose progress bounds the lag.
            on_commit: called with the last seq of each commit once it landed, in the
                committer thread (as a Kafka producer's delivery callback is), before a
                ``flush`` waiting for that commit returns: keep it short, and never call
                this producer's ``write`` or ``flush`` from it (they wait on the thread
                that runs it); what it raises fails the producer, and ``flush`` raises it.

        Raises:
            ValueError: a bad id, group or bound.
            NotFoundError: no stream at ``uri``.
        """
        self.producer_id = check_producer_id(producer_id)
        self.options = options or ProducerOptions()
        max_lag_steps = check_int("max_lag_steps", max_lag_steps, optional=True)
        self.progress_group = check_group(progress_group)
        self.max_lag_steps = max_lag_steps
        self.stats = ProducerStats()
        self._stream = Stream.open(uri, storage_options=storage_options)
        self._row_group_bytes = row_group_target(self._stream.schema)
        self._pid = os.getpid()
        fenced = self._stream.commit(fencing(self.producer_id), self.options.commit)
        if fenced is None or not isinstance(fenced.entry, Fence):  # kept under python -O
            raise LakestreamError(f"producer {producer_id}: opening committed no fence")
        self.epoch = fenced.entry.epoch
        mine = self._stream.state.producers[self.producer_id]
        self._inflight = InFlight(mine.seq, mine.state)
        o = self.options
        self.upload_threads = o.upload_threads or upload_threads_for(self._stream.store)
        self._upload_ahead = (1 if o.commit_policy == "per-fragment"
                              else o.max_inflight_fragments) + self.upload_threads
        """How many seqs past the last committed one may be uploaded: one fragment per
        commit takes one, and a round of the pool keeps the next ready; further ahead,
        encoding only takes the CPU the commits need (it could otherwise encode a thousand
        fragments ahead of them). A group commit is bounded by its in-flight budget alone,
        which its half-budget trigger counts on."""
        self._closed = False
        self._progress_at: float | None = None
        """When ``_progress`` was read (monotonic), None before the first read."""
        self._progress: Progress | None = None
        self._admitted = False
        self._pool = ThreadPoolExecutor(self.upload_threads,
                                        thread_name_prefix=f"lakestream-upload-{producer_id}")
        self._pool.submit(warm_conversion)  # while nothing waits on it: not in the first write
        runs = HostRuns.for_stream(self._stream.uri, self._stream.meta.created_ms) \
            if o.share_commits else None
        if o.share_commits and runs is None:
            log.warning("producer %s: share_commits=%r without a host folder "
                        "(LAKESTREAM_HOST_DIR): committing alone", producer_id, o.share_commits)
        args = (self._stream, self.producer_id, self.epoch, o, self.stats, self._inflight,
                self.upload_threads, on_commit)
        self._committer = Committer(*args) if runs is None else \
            HostCommitter(*args, runs=runs) if o.share_commits == "host" else \
            PoolingCommitter(*args, runs=runs, pool=PooledRuns(self._stream.store, runs.host))
        self._committer.start()

    # -- what the user sees -------------------------------------------------------------

    @property
    def uri(self) -> str:
        return self._stream.uri

    @property
    def stream(self) -> Stream:
        """The committer's view of the stream (advances with every commit)."""
        return self._stream

    @property
    def state(self) -> Any:
        """The user state committed with this producer's last committed fragment, or None."""
        return self._inflight.committed_state

    @property
    def committed_seq(self) -> int:
        """The last committed seq of this producer (-1 if none)."""
        return self._inflight.committed_seq

    def write(self, data: Any, state: Any = None) -> int:
        """Queues ``data`` as one fragment; returns its seq at once.

        ``state`` is committed atomically with it (JSON-serialisable; None keeps the last
        state). Blocks while too much is in flight, and, with ``max_lag_steps``, while the
        stream is more than that many steps ahead of the consumer group's progress (unless
        ``wait_for_lag`` admitted this write already).

        Raises:
            SchemaMismatchError: ``data`` does not fit the schema (nothing is uploaded).
            ValueError: zero rows, rows not a multiple of the group size, a fragment larger
                than ``max_fragment_bytes``, a sample larger than ``max_sample_bytes``, or a
                ``state`` holding NaN or Infinity (not JSON).
            TypeError: ``state`` is not JSON-serialisable.
            ProducerFencedError: a newer instance of this producer id has opened.
            StreamSealedError: the stream is sealed (here if this producer has seen the
                seal, else from the commit of a later write, or from ``flush``).
            LakestreamError: a background upload or commit failed (re-raised here).
        """
        self._check()
        started = time.thread_time()
        table, checked = self._checked(data, state, started)
        if not self._admitted:
            self.wait_for_lag()
        self._admitted = False
        o, nbytes, rows = self.options, table.nbytes, table.num_rows
        seq = self._inflight.admit(
            nbytes, rows, state, max_fragments=o.max_inflight_fragments,
            max_bytes=o.max_inflight_bytes,
            submit=lambda seq, carried: self._pool.submit(self._upload, seq, table, carried,
                                                          nbytes))
        self.stats.add(writes=1, rows=rows)
        self.stats.add_cpu(("write call", time.thread_time() - started), *checked)
        return seq

    def _checked(self, data: Any, state: Any, started: float
                 ) -> tuple[pa.Table, list[tuple[str, float]]]:
        """``data`` as a table of the stream's schema, everything ``write`` refuses refused
        before anything is uploaded; and the CPU of its stages (the thread's CPU clock read
        at ``started``)."""
        refuse_if_sealed(self._stream.state, self.uri)
        who = f"producer {self.producer_id}"
        table = conform(data, self._stream.schema, where=who)
        conformed = time.thread_time()
        check_rows(table.num_rows, self._stream.group_size, who)
        o = self.options
        if table.nbytes > o.max_fragment_bytes:
            raise TooLargeError(f"{who}: a fragment of {table.nbytes} bytes exceeds "
                                f"max_fragment_bytes={o.max_fragment_bytes}; split the write")
        oversized = oversized_sample(table, o.max_sample_bytes)
        checked = [("conform", conformed - started),
                   ("size check", time.thread_time() - conformed)]
        if oversized is not None:
            row, size = oversized
            raise TooLargeError(f"{who}: sample {row} of the write is about {size} bytes, "
                                f"over max_sample_bytes={o.max_sample_bytes}; drop or "
                                "truncate it")
        if state is not None:
            check_state(state)
        return table, checked

    def flush(self, timeout: float | None = None) -> None:
        """Returns when everything written so far is committed.

        Raises:
            TimeoutError: not all of it was committed within ``timeout`` seconds.
            ProducerFencedError, LakestreamError: a background failure.
        """
        self._check()
        self._inflight.wait_committed(timeout, f"producer {self.producer_id}")

    def close(self) -> None:
        """Flushes, then stops the background threads. Idempotent."""
        if self._closed:
            return
        try:
            if not self._inflight.failed and os.getpid() == self._pid:
                self.flush()
        finally:
            self._shutdown()

    def abort(self) -> None:
        """Stops without committing what is still in flight (it becomes orphaned files)."""
        self._shutdown()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Leaving the block commits every write that returned, even when the block raised
        (a bug of the caller's, Ctrl-C): a write ``write`` accepted is not dropped by a stop
        the process lives through, as a Kafka producer's ``close`` delivers what was sent.
        A producer that failed itself (fenced, a store it could not get past) stops
        without committing; so does one whose flush fails or is interrupted (a second
        Ctrl-C), and the block's own exception is the one raised."""
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except BaseException as e:  # noqa: BLE001 - the block's exception wins
            log.warning("producer %s: writes not committed on leaving after %s: %s",
                        self.producer_id, exc_type.__name__, e)
            self.abort()

    # -- machinery ----------------------------------------------------------------------

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return  # a forked copy: the threads belong to the parent
        self._inflight.close()  # uploads waiting for commits stop waiting
        self._committer.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._committer.join()

    def _check(self) -> None:
        if os.getpid() != self._pid:
            raise LakestreamError(f"producer {self.producer_id} was created in process "
                                  f"{self._pid}; create a Producer in each process")
        if self._closed:
            raise LakestreamError(f"producer {self.producer_id} is closed")
        self._inflight.check()

    def _upload(self, seq: int, table: pa.Table, state: Any, nbytes: int) -> None:
        if not self._inflight.upload_turn(seq, self._upload_ahead):
            return  # failed or aborted: it stays uncommitted
        try:
            failpoint("before_upload")
            t0 = time.thread_time()
            body = encode_fragment(table, self._stream.group_size,
                                   compression=self.options.compression,
                                   compression_level=self.options.compression_level,
                                   nbytes=nbytes, row_group_bytes=self._row_group_bytes)
            t1 = time.thread_time()
            crc32 = zlib_ng.crc32(body)
            t2 = time.thread_time()
            key = fragment_key(self.producer_id, self.epoch, seq)
            put_fragment(self._stream.store, key, body)
            t3 = time.thread_time()
            failpoint("after_upload")
            self.stats.add_cpu(("encode", t1 - t0), ("crc32", t2 - t1), ("store put", t3 - t2))
            self.stats.add(bytes_uploaded=len(body), fragments_uploaded=1)
            self._committer.ready(Uploaded(seq, key, table.num_rows, len(body), state, nbytes,
                                           crc32))
        except BaseException as e:  # noqa: BLE001 - surfaced on the caller's next call
            self._inflight.fail(e)

    def _lag_steps(self) -> int:
        """Whole steps ahead of the group's progress, counting this producer's own writes
        that are not committed yet (a backlog waiting for its commit lands in later steps).
        Whole steps: a step partly filled is the one the trainer waits for, and with
        ``max_lag_steps=0`` a producer must be able to fill it."""
        pending = self._inflight.rows
        b = self._stream.global_batch_size
        progress = self.trainer_progress()
        return (self._stream.num_samples + pending) // b - (progress.step if progress else 0)

    def trainer_progress(self) -> Progress | None:
        """What ``progress_group`` (the trainer's consumer group) last published: its
        ``step`` and ``policy_version``, ``updated`` (seconds since the epoch) and ``job``;
        None if it has published nothing.

        One small GET at most every ``options.progress_poll_s`` seconds, shared with the
        ``max_lag_steps`` check (after ``wait_for_lag`` it costs nothing). Advisory, as
        progress is: it may be that long behind the trainer.
        """
        now = time.monotonic()
        if self._progress_at is None or now - self._progress_at >= self.options.progress_poll_s:
            self._progress = read_progress(self._stream.store, self.progress_group)
            self._progress_at = now
        return self._progress

    @property
    def policy_version(self) -> int:
        """The policy version the trainer last published (``ds.policy_version``, through
        its progress), 0 before it published one: what a rollout worker generates with
        and stamps on its samples. Read as ``trainer_progress`` is."""
        progress = self.trainer_progress()
        return progress.policy_version or 0 if progress else 0

    def wait_for_lag(self, timeout: float | None = None) -> bool:
        """Blocks while committed steps exceed the consumer group's progress by more than
        ``max_lag_steps`` (returns at once without a bound), then admits one write.

        A rollout worker calls it before generating, so that the policy version it reads
        and stamps is no older than the bound allows; the next ``write`` then goes through
        without waiting again (blocking a sample already generated would only make it
        staler). A ``write`` without a prior admission waits here itself. With a
        ``timeout``, it gives up after that many seconds and admits nothing (a worker can
        then see whether training is over, say).

        Returns:
            True once admitted, False if ``timeout`` passed first.

        Raises:
            ProducerFencedError, LakestreamError: a background failure while waiting.
        """
        k = self.max_lag_steps
        if k is None:
            return True
        poll = self.options.progress_poll_s
        t0 = time.monotonic()
        while True:
            if self._lag_steps() <= k:
                break
            self._check()
            self._stream.refresh()
            if self._lag_steps() <= k:
                break
            if timeout is not None and time.monotonic() - t0 >= timeout:
                self.stats.add(lag_wait_s=time.monotonic() - t0)
                return False
            time.sleep(poll)
        self.stats.add(lag_wait_s=time.monotonic() - t0)
        self._admitted = True
        return True



