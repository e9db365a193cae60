"""Runs pooled through the store (``ProducerOptions(share_commits="store")``): the committer
of each host leaves what its host has uploaded and not yet committed in the store, where the
committers of the other hosts find it and commit it with their own (docs/design.md §5,
*Runs pooled through the store*). One log takes one commit at a time; pooled, each of those
commits carries every host's waiting runs, so a sample waits for the next commit of any host
rather than of its own.

``_lakestream/runs/<host>.json``, one object per host, overwritten: the host's runs (a
producer's contiguous uploaded fragments with their states, as in the host's folder) as its
committer last saw them, deleted when none is left. Only the holder of the host's commit lock
writes it. A reader of the log learns what landed from the log alone: the seqs it holds
make the second commit of a run commit nothing, and a newer epoch fences the runs of an older
one. An object untouched for ``STALE_S`` (a host gone) is neither committed nor kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from lakestream.errors import LakestreamError, NotFoundError, TooLargeError
from lakestream.failpoints import failpoint
from lakestream.log.commits import Run
from lakestream.log.hostruns import STALE_S, run_doc, run_from
from lakestream.store.base import ObjectMeta, ObjectStore

RUNS_PREFIX = "_lakestream/runs/"
MAX_POOLED_BYTES = 16 << 20
"""The most a host's object may hold: past it, its newest runs wait for the next offer."""
READERS = 8
"""GETs of changed objects in flight at once, per committer."""


class PooledRuns:
    """One host's window on a stream's pooled runs (see the module). Used by the thread
    that holds the host's commit lock."""

    def __init__(self, store: ObjectStore, host: str) -> None:
        self._store = store
        self.host = host
        self.key = f"{RUNS_PREFIX}{host.lstrip('@')}.json"
        self._offered: tuple[tuple[str, int, int, int], ...] | None = None
        """What the host's object holds: (producer, epoch, first seq, last seq) per run;
        None: not known (another holder's, or a request that failed), so written again."""
        self._seen: dict[str, tuple[object, int, list[Run]]] = {}
        """Other hosts' objects as last read: key -> (version, size, runs)."""
        self._pool: ThreadPoolExecutor | None = None
        self.requests = 0
        """Requests made (puts, deletes, lists, gets), for tests and benchmarks."""

    def offer(self, runs: Sequence[Run]) -> bool:
        """Makes the host's object hold ``runs`` (everything the host has uploaded and
        not seen committed), unless it holds them already; deletes it when there are none.
        Returns whether it made a request.

        Raises:
            StoreError: the put or delete failed (the next offer tries again).
        """
        runs = [r for r in runs if r.fragments]
        body = self._body(runs)
        while len(body) > MAX_POOLED_BYTES and runs:  # the newest wait for the next offer
            last = runs[-1]
            runs = runs[:len(runs) // 2] if len(runs) > 1 else \
                [last._replace(fragments=last.fragments[:len(last.fragments) // 2])]
            runs = [r for r in runs if r.fragments]
            body = self._body(runs)
        shown = tuple((r.producer, r.epoch, r.fragments[0].seq, r.fragments[-1].seq)
                      for r in runs)
        if shown == self._offered:
            return False
        self._offered = None  # unknown until the request succeeds
        self.requests += 1
        if shown:
            self._store.put(self.key, body)
        else:
            self._store.delete(self.key)
        self._offered = shown
        if shown:
            failpoint("after_offer")
        return True

    def _body(self, runs: Sequence[Run]) -> bytes:
        return json.dumps({"host": self.host, "runs": [run_doc(r) for r in runs]},
                          allow_nan=False, separators=(",", ":")).encode()

    def gather(self) -> list[Run]:
        """The other hosts' pooled runs: a LIST of the objects, and a GET of each one
        changed since it was last read; objects older than ``STALE_S`` left out (and
        deleted), damaged ones skipped.

        Raises:
            StoreError: the LIST failed.
        """
        self.requests += 1
        now = time.time()
        listed = {m.key: m for m in self._store.list(RUNS_PREFIX)
                  if m.key.endswith(".json") and m.key != self.key}
        for key in set(self._seen) - set(listed):
            del self._seen[key]
        stale = [k for k, m in listed.items() if now - m.last_modified > STALE_S]
        for key in stale:
            del listed[key]
            self._seen.pop(key, None)
            self._delete(key)
        changed = [m for k, m in listed.items()
                   if self._seen.get(k, (None, None))[:2] != (_version(m), m.size)]
        if changed:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(READERS, thread_name_prefix="lakestream-pool")
            self.requests += len(changed)
            for m, runs in zip(changed, self._pool.map(self._read, changed), strict=True):
                if runs is not None:
                    self._seen[m.key] = (_version(m), m.size, runs)
        return [r for _, _, runs in self._seen.values() for r in runs]  # only those listed

    def _read(self, meta: ObjectMeta) -> list[Run] | None:
        """The runs of one host's object: none if it is gone or is not one a committer
        wrote; None if the store failed (read again next time)."""
        try:
            doc = json.loads(self._store.get(meta.key, max_bytes=MAX_POOLED_BYTES))
            return [run_from(r, meta.key) for r in doc["runs"]]
        except (NotFoundError, TooLargeError, ValueError, KeyError, TypeError, IndexError,
                RecursionError):
            return []
        except LakestreamError:
            return None

    def _delete(self, key: str) -> None:
        self.requests += 1
        try:
            self._store.delete(key)
        except LakestreamError:
            pass  # the next committer to look tries again

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def _version(meta: ObjectMeta) -> object:
    """What tells one write of an object from the next: its ETag where the store gives one
    (S3 lists times to the second, and a host rewrites its object several times a second),
    else its time."""
    return meta.etag if meta.etag is not None else meta.last_modified
