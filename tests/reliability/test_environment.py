"""What the store and the hosts may do that Lakestream must not depend on: listings and HEADs
that lag behind writes, and clocks that are off by a day."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lakestream
from lakestream.errors import NotFoundError
from lakestream.log.opening import load_state
from lakestream.producers import Producer
from lakestream.store import ObjectMeta, ObjectStore, open_store
from tests.helpers import SCHEMA, ids, rows

ROOT = Path(__file__).resolve().parents[2]
DAY = 86_400.0


class EventualStore:
    """A store whose LIST omits, and whose HEAD 404s, objects younger than ``lag_s``
    (GET after PUT stays consistent, as on S3 today)."""

    def __init__(self, inner: ObjectStore, lag_s: float) -> None:
        self.inner, self.lag_s = inner, lag_s
        self.hidden = 0

    @property
    def uri(self) -> str:
        return self.inner.uri

    def _fresh(self, meta: ObjectMeta) -> bool:
        if time.time() - meta.last_modified < self.lag_s:
            self.hidden += 1
            return True
        return False

    def head(self, key: str) -> ObjectMeta:
        meta = self.inner.head(key)
        if self._fresh(meta):
            raise NotFoundError(f"{key} (not yet visible)")
        return meta

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        return (m for m in self.inner.list(prefix) if not self._fresh(m))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_lagging_list_and_head_never_hide_the_head_or_move_readers_back(tmp_path) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=2, snapshot_interval=3)
    eventual = EventualStore(open_store(uri), lag_s=0.5)
    stop = threading.Event()
    acked: list[int] = []

    def write() -> None:
        k = 0
        while not stop.is_set():
            acked.append(s.append(rows(2 * k, 2)))  # the version, once acknowledged
            k += 1
            time.sleep(0.005)

    writer = threading.Thread(target=write)
    writer.start()
    seen, opens = -1, 0
    try:
        # Until enough happened, however slowly: opens racing the writer, versions passed
        # (about 3 s of writing on an idle host), and objects the lag actually hid. The
        # deadline only catches a stall.
        deadline = time.monotonic() + 300
        while opens < 500 or seen < 300 or eventual.hidden == 0:
            assert time.monotonic() < deadline, (opens, seen, eventual.hidden)
            floor = acked[-1] if acked else 0
            state = load_state(eventual, uri)  # type: ignore[arg-type]
            assert state.version >= floor, (state.version, floor)  # the head is found
            assert state.version >= seen  # and a reader never goes back
            seen, opens = state.version, opens + 1
    finally:
        stop.set()
        writer.join()
    final = load_state(eventual, uri)  # type: ignore[arg-type]
    assert final.version == s.refresh() and final.next_offset == 2 * len(acked)


_SKEWED = ("import runpy, sys, time; offset = float(sys.argv.pop(1)); real = time.time; "
           "time.time = lambda: real() + offset; "
           "runpy.run_module('tests.producers.worker', run_name='__main__')")


def _skewed(offset: float, uri: str, producer: str, fragments: int,
            failpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LAKESTREAM_FAILPOINT"}
    if failpoint:
        env["LAKESTREAM_FAILPOINT"] = failpoint
    return subprocess.run([sys.executable, "-c", _SKEWED, str(offset), uri, producer,
                           str(fragments), "2", json.dumps({})], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_clocks_a_day_off_change_neither_order_nor_gc(tmp_path) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=2)
    ahead = _skewed(+DAY, uri, "skew-0", 10)
    behind = _skewed(-DAY, uri, "skew-1", 10)
    assert ahead.returncode == 0 and behind.returncode == 0, ahead.stderr + behind.stderr
    # A producer a day behind uploads a fragment and dies before committing it: an orphan
    # whose writer believed it a day old.
    crashed = _skewed(-DAY, uri, "skew-2", 1, failpoint="after_upload")
    assert crashed.returncode == -9
    s.refresh()
    got = sorted(i for k in range(s.num_steps) for i in ids(s.read_step(k)))
    assert got == sorted([*range(0, 20), *range(1_000_000, 1_000_020)])
    assert [s.producers[p][1] for p in ("skew-0", "skew-1")] == [9, 9]
    # gc on a host a day ahead: by its own clock the orphan is a day old, by the store's
    # clock (the one gc uses) it is fresh, so the grace period keeps it.
    gc = ("import sys, time, json, lakestream; real = time.time; "
          f"time.time = lambda: real() + {DAY}; "
          "r = lakestream.open(sys.argv[1]).gc(grace_seconds=3600, delta_checkpoint=False); "
          "print(json.dumps([r.data_files, r.kept_in_grace]))")
    out = subprocess.run([sys.executable, "-c", gc, uri], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert json.loads(out.stdout.splitlines()[-1]) == [0, 1], out.stderr
    assert len(list(s.store.list("data/skew-2/"))) == 1
    # Its own epoch's upload past its committed seq is kept, whatever the grace, until the
    # producer restarts (or a day passes): a live instance's commit could still name it.
    assert s.gc(grace_seconds=0, delta_checkpoint=False).data_files == 0
    Producer(uri, "skew-2").close()  # restarted: the crashed epoch is fenced
    gone = s.gc(grace_seconds=0, delta_checkpoint=False)
    assert gone.data_files == 1 and not list(s.store.list("data/skew-2/"))
