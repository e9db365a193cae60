"""Four ranks of one host reading two epochs of a stream on SeaweedFS through one disk cache:
each fragment, which holds rows of every rank, is fetched from the store about once for the
host; a limit smaller than the stream holds the cache under it on disk; every rank reads
what it reads without the cache."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import lakestream
from lakestream.loaders import DiskCache, StreamDataset
from lakestream.producers import Producer
from tests.s3server import BUCKET

RANKS, B, STEPS = 4, 16, 12
SHAPE = (32, 32, 3)


def _stream(options: dict[str, str]) -> tuple[str, int]:
    uri = f"s3://{BUCKET}/host-cache-{os.getpid()}-{time.monotonic_ns()}"
    lakestream.create(uri, pa.schema([lakestream.tensor_field("image", SHAPE),
                                      pa.field("id", pa.int64())]),
                      global_batch_size=B, storage_options=options)
    rng = np.random.default_rng(0)
    with Producer(uri, "p", storage_options=options) as p:
        for k in range(STEPS):  # one fragment a step: rows of every rank
            p.write({"image": rng.integers(0, 256, (B, *SHAPE), dtype=np.uint8),
                     "id": np.arange(k * B, (k + 1) * B)})
    s = lakestream.open(uri, storage_options=options)
    s.seal()
    return uri, sum(f.size for f in s.state.all_fragments())


def _read(uri: str, options: dict[str, str], rank: int, cache: DiskCache | None
          ) -> list[tuple[list[int], int]]:
    ds = StreamDataset(uri, group=None, rank=rank, world_size=RANKS, epochs=2,
                       storage_options=options, timeout=60, disk_cache=cache)
    return [(b["id"].tolist(), int(b["image"].float().sum())) for b in ds]


def _rank(uri: str, options: dict[str, str], rank: int, root: str, limit: int,
          out: Any) -> None:
    os.environ["LOCAL_WORLD_SIZE"] = str(RANKS)
    cache = DiskCache(root, limit)
    out.put((rank, _read(uri, options, rank, cache), cache.fetched_bytes))


def _run(uri: str, options: dict[str, str], root: str, limit: int
         ) -> tuple[dict[int, Any], int, int]:
    """Each rank's batches, the fragment bytes the host fetched from the store, and the
    most the cache's entries held on disk at any look (every 5 ms)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(uri, options, r, root, limit, out))
             for r in range(RANKS)]
    most, done = [0], threading.Event()

    def look() -> int:
        sizes = {}  # by inode: a file renamed while the folder is walked is seen twice
        for p in Path(root).rglob("*"):
            if p.is_file() and not p.name.startswith(".") and ".locks" not in p.parts:
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                sizes[st.st_ino] = st.st_size
        return sum(sizes.values())

    def watch() -> None:
        # Each look holds the host's usage lock (the layout in lakestream/store/diskcache.py):
        # a walk is not a snapshot, and without it a look counted an entry evicted during
        # the walk and the one put in its place, which never lay on disk together.
        usage = Path(root, ".locks", "usage")
        while not done.is_set():
            if usage.exists():
                fd = os.open(usage, os.O_RDWR)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    most[0] = max(most[0], look())
                finally:
                    os.close(fd)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=240) for _ in procs]
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
        done.set()
        watcher.join()
    assert [p.exitcode for p in procs] == [0] * RANKS
    return ({r: got for r, got, _ in results}, sum(n for _, _, n in results), most[0])


def test_ranks_of_a_host_fetch_each_fragment_once_over_two_epochs(
        tmp_path: Path, s3_options: dict[str, str]) -> None:
    uri, stream_bytes = _stream(s3_options)
    plain = {r: _read(uri, s3_options, r, None) for r in range(RANKS)}  # in this process
    assert all(len(plain[r]) == 2 * STEPS for r in range(RANKS))
    cached, fetched, _ = _run(uri, s3_options, str(tmp_path / "big"), 1 << 30)
    assert cached == plain
    assert fetched <= 1.05 * stream_bytes, (fetched, stream_bytes)
    # A limit a third of the stream: the cache stays under it on disk, the reads are right.
    limit = stream_bytes // 3
    small, fetched, most = _run(uri, s3_options, str(tmp_path / "small"), limit)
    assert small == plain
    assert 0 < most <= limit, (most, limit)
    assert fetched > stream_bytes  # what was evicted was fetched again


def _killed_filling(uri: str, options: dict[str, str], root: str) -> None:
    """Rank 0 reading through the cache, killed by SIGKILL at its third fill: the fragment's
    bytes written to the cache's temp file, not yet in place."""
    os.environ["LAKESTREAM_FAILPOINT"] = "during_cache_fill@3"
    _read(uri, options, 0, DiskCache(root, 1 << 30))


def test_a_rank_killed_filling_the_cache_leaves_nothing_a_fresh_one_trusts(
        tmp_path: Path, s3_options: dict[str, str]) -> None:
    uri, _ = _stream(s3_options)
    root = str(tmp_path / "cache")
    child = mp.get_context("spawn").Process(target=_killed_filling, args=(uri, s3_options, root))
    child.start()
    child.join(120)
    if child.is_alive():
        child.kill()
    assert child.exitcode == -9  # killed at the crash point, not finished
    torn = [p for p in Path(root).rglob("*") if p.is_file() and ".tmp-" in p.name
            and ".locks" not in p.parts and not p.name.startswith(".")]
    assert torn  # the fill it died in is on disk, unnamed
    cache = DiskCache(root, 1 << 30)
    assert _read(uri, s3_options, 0, cache) == _read(uri, s3_options, 0, None)
    assert 0 < cache.fetched_bytes  # the torn fill was fetched again, not served


@pytest.fixture(autouse=True)
def _no_local_world(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
