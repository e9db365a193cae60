"""Runs pooled through the store (``share_commits="store"``): the committers of several
hosts each commit every host's waiting runs, and nothing is lost or duplicated when any of
them is killed anywhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import deltalake
import pytest

import lakestream
from lakestream.errors import StoreError
from lakestream.failpoints import POOL_NAMES
from lakestream.log.commits import Run, Stored
from lakestream.log.entries import SharedAppend
from lakestream.log.hostruns import STALE_S, HostRuns
from lakestream.log.storeruns import RUNS_PREFIX, PooledRuns
from lakestream.log.tail import read_entry
from lakestream.producers import ProducerOptions
from lakestream.producers.committer import Uploaded
from lakestream.producers.hostcommit import Pending
from lakestream.producers.inflight import InFlight
from lakestream.producers.poolcommit import PoolingCommitter
from lakestream.producers.stats import ProducerStats
from lakestream.store import open_store
from lakestream.store.hooks import add_request_hook
from tests.conftest import BUCKET, SOAK, seeds
from tests.helpers import SCHEMA
from tests.producers.test_crash import _expected, _gapless, _spawn, _stream_ids
from tests.producers.test_hostcommit import _every_sample_once, _finish

PRODUCERS_PER_HOST = 2


@contextmanager
def _host(folder: str | None) -> Iterator[None]:
    """This process as the host whose folder is ``folder`` (None: the session's)."""
    before = os.environ["LAKESTREAM_HOST_DIR"]
    if folder is not None:
        os.environ["LAKESTREAM_HOST_DIR"] = folder
    try:
        yield
    finally:
        os.environ["LAKESTREAM_HOST_DIR"] = before


def _hosts_side_by_side(uri: str, options: dict[str, str] | None, hosts: list[str | None],
                        spawn: Callable[[str | None, int], subprocess.Popen[str]]
                        ) -> list[subprocess.Popen[str]]:
    """``PRODUCERS_PER_HOST`` processes on each host of ``hosts`` (host folders), held from
    committing (the test holds every host's lock) until each has left a run for its host,
    or one has exited: started one after another, each could commit everything alone."""
    s = lakestream.open(uri, storage_options=options)
    locks = []
    for folder in hosts:
        with _host(folder):
            runs = HostRuns.for_stream(s.uri, s.meta.created_ms)
        assert runs is not None and runs.lead()
        locks.append(runs)
    procs = [spawn(folder, h * PRODUCERS_PER_HOST + k) for h, folder in enumerate(hosts)
             for k in range(PRODUCERS_PER_HOST)]
    try:
        deadline = time.monotonic() + 60
        while sum(len({p.run.producer for p in r.gather()}) for r in locks) < len(procs) and \
                time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.01)
    finally:
        for runs in locks:
            runs.resign()
    return procs


def _pooled_entries(uri: str, options: dict[str, str] | None) -> Counter[str]:
    """Shared entries, and those carrying producers of both hosts (``rollout-0/1`` on the
    first, ``rollout-2/3`` on the second)."""
    s = lakestream.open(uri, storage_options=options)
    kinds: Counter[str] = Counter()
    for v in range(1, s.version + 1):
        e = read_entry(s.store, v)
        if isinstance(e, SharedAppend):
            kinds["shared"] += 1
            hosts = {int(p.producer.rsplit("-", 1)[1]) // PRODUCERS_PER_HOST for p in e.parts}
            kinds["both hosts"] += len(hosts) == 2
        else:
            kinds[type(e).__name__] += 1
    return kinds


def test_each_host_s_commits_carry_the_other_host_s_runs(tmp_path: Path) -> None:
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=2)
    total = 40
    stats = _finish(_hosts_side_by_side(uri, None, [None, str(tmp_path / "host-b")],
                                        lambda folder, k: _spawn(
        uri, f"rollout-{k}", None, None, total=total, share="store", host_dir=folder,
        write_every_s=0.01)))
    assert _stream_ids(uri, None) == _expected(4, total)
    s = lakestream.open(uri)
    assert {n: (p[1], p[2]) for n, p in s.producers.items()} == {
        f"rollout-{k}": (total - 1, {"next": total}) for k in range(4)}
    kinds = _pooled_entries(uri, None)
    assert kinds["Append"] == 0 and kinds["both hosts"] > 0, kinds
    assert sum(st["fragments"] for st in stats) == 4 * total
    # Nothing left pooled once every producer closed; Delta readers see every row.
    assert list(s.store.list(RUNS_PREFIX)) == []
    dt = deltalake.DeltaTable(uri)
    assert dt.to_pyarrow_table().num_rows == 4 * total * 2
    assert all(dt.transaction_version(f"rollout-{k}") == total - 1 for k in range(4))
    _gapless(uri, None)


# Every point a producer of a pooling host passes: in make test on the local store, in the
# soak on S3 as well.
POOL_MATRIX = [(store, point) for point in POOL_NAMES for store in ("local", "s3")
               if SOAK or store == "local"]


@pytest.mark.parametrize("seed", seeds(1, 3))
@pytest.mark.parametrize(("backend", "point"), POOL_MATRIX, indirect=["backend"])
def test_pooling_hosts_killed_at_every_failpoint_lose_and_duplicate_nothing(
        backend, point: str, seed: int, tally: Counter[str], tmp_path: Path) -> None:
    uri = backend.uri()
    lakestream.create(uri, SCHEMA, global_batch_size=2, snapshot_interval=2,
                      storage_options=backend.options)
    hosts = [None, str(tmp_path / "host-b")]
    names = [f"rollout-{k}" for k in range(2 * PRODUCERS_PER_HOST)]
    upload = point in ("before_upload", "after_upload")  # each seed moves those kills
    first = _hosts_side_by_side(uri, backend.options, hosts, lambda folder, k: _spawn(
        uri, names[k], backend.options,
        f"{point}@{1 + (k + 3 * seed) % 10 if upload else 1}", share="store",
        host_dir=folder, write_every_s=0.005))
    codes = [p.wait(timeout=120) for p in first]
    assert -signal.SIGKILL in codes, f"no producer reached {point}: {codes}"
    # Restarted together: each resumes from what the log holds of it; what its killed
    # instance left pooled is committed by another host's committer, or fenced.
    again = _finish([_spawn(uri, n, backend.options, None, share="store",
                            host_dir=hosts[k // PRODUCERS_PER_HOST])
                     for k, n in enumerate(names)])
    _every_sample_once(backend, names, again, codes, tally, f"pool-{backend.name}.{point}")


def _run(producer: str, epoch: int, seqs: range) -> Run:
    return Run(producer, epoch, [Stored(f"data/{producer}/{epoch}-{q}-ab.parquet", 2, 10, q,
                                        7, {"next": q + 1}) for q in seqs])


def _shown(runs: list[Run]) -> list[tuple[str, int, list[int]]]:
    return [(r.producer, r.epoch, [u.seq for u in r.fragments]) for r in runs]


def test_a_host_rewrites_its_pooled_runs_only_when_they_change_and_reads_only_changes(
        tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"))
    a, b = PooledRuns(store, "@aaaa"), PooledRuns(store, "@bbbb")
    a.offer([_run("p", 1, range(0, 3))])
    a.offer([_run("p", 1, range(0, 3))])  # the same: no request
    assert a.requests == 1
    assert _shown(b.gather()) == [("p", 1, [0, 1, 2])] and b.requests == 2  # LIST, GET
    assert _shown(b.gather()) == [("p", 1, [0, 1, 2])] and b.requests == 3  # LIST only
    assert a.gather() == []  # its own object is not read back
    a.offer([_run("p", 1, range(2, 5)), _run("q", 4, range(0, 1))])
    assert _shown(b.gather()) == [("p", 1, [2, 3, 4]), ("q", 4, [0])]
    a.offer([])  # nothing waits: the object goes
    assert list(store.list(RUNS_PREFIX)) == [] and b.gather() == []


def test_pooled_runs_that_are_stale_damaged_or_unread_are_never_committed(
        tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"))
    a, b, c = PooledRuns(store, "@aaaa"), PooledRuns(store, "@bbbb"), PooledRuns(store, "@cc")
    a.offer([_run("p", 1, range(0, 2))])
    b.offer([_run("q", 1, range(0, 2))])
    store.put(f"{RUNS_PREFIX}dddd.json", b'{"host": "@dddd", "runs": [{"producer": "r"}]}')
    store.put(f"{RUNS_PREFIX}eeee.json", json.dumps({"host": "@e", "runs": [
        {"producer": "s", "epoch": 1, "fragments": [[0, "data/other/1-0-x.parquet", 2, 10,
                                                     7, None]]}]}).encode())
    old = time.time() - STALE_S - 60  # a host gone an hour ago
    os.utime(tmp_path / "s" / RUNS_PREFIX / "bbbb.json", (old, old))
    assert _shown(c.gather()) == [("p", 1, [0, 1])]  # damaged and foreign files skipped
    assert not (tmp_path / "s" / RUNS_PREFIX / "bbbb.json").exists()  # the stale one deleted
    # A read the store failed keeps the copy read before, and is tried again next time.
    a.offer([_run("p", 1, range(0, 3))])
    failed: list[str] = []

    def fail_once(request) -> None:  # type: ignore[no-untyped-def]
        if request.op == "get" and not failed:
            failed.append(request.key)
            raise StoreError("injected")

    remove = add_request_hook(fail_once)
    try:
        assert _shown(c.gather()) == [("p", 1, [0, 1])]
    finally:
        remove()
    assert failed and _shown(c.gather()) == [("p", 1, [0, 1, 2])]


def test_share_commits_store_is_checked_like_host() -> None:
    assert ProducerOptions(share_commits="store").share_commits == "store"
    with pytest.raises(ValueError, match="share_commits='store' needs commit_policy"):
        ProducerOptions(share_commits="store", commit_policy="per-fragment")
    with pytest.raises(ValueError, match="None, 'host' or 'store'"):
        ProducerOptions(share_commits="cluster")  # type: ignore[arg-type]


def _committer(tmp_path: Path, **options: Any) -> PoolingCommitter:
    """A pooling host's committer for producer ``p-0``, not started."""
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=2)
    stream = lakestream.open(uri)
    return PoolingCommitter(stream, "p-0", 1,
                            ProducerOptions(share_commits="store", **options),
                            ProducerStats(), InFlight(-1, None), 1, None,
                            runs=HostRuns(str(tmp_path / "host")),
                            pool=PooledRuns(stream.store, "@host"))


def _uploaded(seq: int) -> Uploaded:
    return Uploaded(seq, f"data/p-0/1-{seq}-ab.parquet", 2, 10, {"next": seq + 1}, 10, 7)


def test_own_uploads_taken_while_pooling_still_count_towards_half_the_budget(
        tmp_path: Path) -> None:
    c = _committer(tmp_path, max_inflight_fragments=4)
    c.ready(_uploaded(0))
    c.ready(_uploaded(1))
    assert c._full()  # half of 4 uploaded: commit before DAC's wait is over
    c._between_commits([], time.monotonic(), left=10.0)  # taken, offered to the pool
    assert not c._ready and c._pending
    assert c._full()  # still half the budget waiting: it was not before the fix


def test_pooled_runs_read_long_before_a_commit_are_not_carried(tmp_path: Path) -> None:
    c = _committer(tmp_path)
    c._pending.append(Pending(None, [_uploaded(0)], time.monotonic()))
    # Read in the last stretch of a wait long over (an idle host): runs that may have gone
    # stale since, or been committed and their files collected.
    c._foreign, c._foreign_at = [_run("other", 1, range(0, 1))], time.monotonic() - 3600
    c._commit_for_host([])
    state = c._stream.state
    assert "other" not in state.producers and state.producers["p-0"].seq == 0


def test_an_offer_that_failed_is_made_again(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"))
    a = PooledRuns(store, "@aaaa")
    a.offer([_run("p", 1, range(0, 2))])

    def fail(request) -> None:  # type: ignore[no-untyped-def]
        if request.op == "delete":
            raise StoreError("injected")

    remove = add_request_hook(fail)
    try:
        with pytest.raises(StoreError):
            a.offer([])
    finally:
        remove()
    assert a.offer([]) and list(store.list(RUNS_PREFIX)) == []  # deleted this time


def test_a_rewrite_within_the_same_second_is_read_again_on_s3(
        s3_options: dict[str, str]) -> None:
    """S3 lists times to the second, and a host rewrites its object several times a
    second, often at the same size: the ETag tells the writes apart."""
    store = open_store(f"s3://{BUCKET}/pool-{time.time_ns()}", s3_options)
    a, b = PooledRuns(store, "@aaaa"), PooledRuns(store, "@bbbb")
    a.offer([_run("p", 1, range(0, 2))])
    assert _shown(b.gather()) == [("p", 1, [0, 1])]
    a.offer([_run("p", 1, range(2, 4))])  # the same size
    assert _shown(b.gather()) == [("p", 1, [2, 3])]
