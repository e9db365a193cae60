"""Real producer processes killed (SIGKILL) at named points, then restarted until done."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import lakestream
from lakestream.errors import NotFoundError
from lakestream.failpoints import PRODUCER_NAMES
from lakestream.log.entries import Append
from lakestream.log.keys import log_key
from lakestream.log.tail import read_entry
from tests.conftest import SOAK, seeds
from tests.helpers import SCHEMA, ids

ROOT = Path(__file__).resolve().parents[2]
PRODUCERS, FRAGMENTS, ROWS = 3, 12, 2


def _spawn(uri: str, producer_id: str, options: dict[str, str] | None, failpoint: str | None,
           total: int = FRAGMENTS, policy: str = "adaptive", share: str | None = None,
           max_interval_s: float = 5.0, host_dir: str | None = None,
           write_every_s: float = 0.0) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("LAKESTREAM_FAILPOINT", None)
    env["WORKER_WRITE_EVERY_S"] = str(write_every_s)
    if host_dir is not None:  # another host: its own host folder
        env["LAKESTREAM_HOST_DIR"] = host_dir
    if failpoint:
        env["LAKESTREAM_FAILPOINT"] = failpoint
    return subprocess.Popen(
        [sys.executable, "-m", "tests.producers.worker", uri, producer_id, str(total), str(ROWS),
         json.dumps(options or {}), policy, share or "-", str(max_interval_s)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _expected(producers: int, total: int) -> list[int]:
    return sorted(k * 1_000_000 + i for k in range(producers) for i in range(total * ROWS))


def _stream_ids(uri: str, options: dict[str, str] | None) -> list[int]:
    s = lakestream.open(uri, storage_options=options)
    return sorted(i for step in range(s.num_steps) for i in ids(s.read_step(step)))


def _gapless(uri: str, options: dict[str, str] | None) -> int:
    s = lakestream.open(uri, storage_options=options)
    for v in range(s.version + 1):
        s.store.head(log_key(v))
    with pytest.raises(NotFoundError):
        s.store.head(log_key(s.version + 1))
    return s.version


# Every point on both stores in the soak; in make test every point once, the stores taking
# them in turn (each store meets every kind of point: upload, commit, snapshot).
MATRIX = [(store, point) for i, point in enumerate(PRODUCER_NAMES)
          for store in ("local", "s3") if SOAK or store == ("local", "s3")[i % 2]]


@pytest.mark.parametrize("seed", seeds(1, 20))
@pytest.mark.parametrize(("backend", "point"), MATRIX, indirect=["backend"])
def test_killed_at_every_failpoint_then_restarted(backend, point: str, seed: int,
                                                  tally: Counter[str]) -> None:
    uri = backend.uri()
    # A snapshot every 2 versions, so commits hit during_snapshot often.
    lakestream.create(uri, SCHEMA, global_batch_size=2, snapshot_interval=2,
                      storage_options=backend.options)
    names = [f"rollout-{k}" for k in range(PRODUCERS)]
    # The n-th hit differs per producer, so they die at different moments; the first run
    # commits fragment by fragment so that every point is hit many times.
    # Each seed moves the kills to other hits.
    first = [_spawn(uri, n, backend.options, f"{point}@{1 + (2 * k + 3 * seed) % 10}",
                    policy="per-fragment")
             for k, n in enumerate(names)]
    codes = [p.wait(timeout=120) for p in first]
    assert -signal.SIGKILL in codes, f"no producer reached {point}: {codes}"
    committed = lakestream.open(uri, storage_options=backend.options).producers
    for name in names:
        p = _spawn(uri, name, backend.options, None)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        # The restarted instance resumed from exactly the state committed before the kill.
        state = committed[name][2] if name in committed else None
        written = json.loads(out.splitlines()[-1])["fragments"]
        assert written == FRAGMENTS - (state["next"] if state else 0)
    assert _stream_ids(uri, backend.options) == _expected(PRODUCERS, FRAGMENTS)
    final = lakestream.open(uri, storage_options=backend.options).producers
    assert all(final[n][2] == {"next": FRAGMENTS} and final[n][1] >= FRAGMENTS - 1
               for n in names)
    _gapless(uri, backend.options)
    tally["crash_runs"] += 1
    tally[f"crash_runs.{backend.name}.{point}"] += 1
    tally["crash_kills"] += codes.count(-signal.SIGKILL)
    tally["samples_checked"] += PRODUCERS * FRAGMENTS * ROWS


def test_eight_processes_race(backend) -> None:
    uri = backend.uri()
    lakestream.create(uri, SCHEMA, global_batch_size=2, storage_options=backend.options)
    total = 50
    procs = [_spawn(uri, f"racer-{k}", backend.options, None, total=total) for k in range(8)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [e[-2000:] for _, e in outs]
    stats = [json.loads(o.splitlines()[-1]) for o, _ in outs]
    assert _stream_ids(uri, backend.options) == _expected(8, total)
    version = _gapless(uri, backend.options)
    commits = sum(s["commits"] for s in stats)
    assert version == 8 + commits  # 8 fences, then every commit, nothing else
    print(f"\n{backend.name}: {commits} commits, {sum(s['conflicts'] for s in stats)} conflicts "
          f"in {sum(s['attempts'] for s in stats)} attempts, "
          f"{8 * total / commits:.2f} fragments per commit")


def test_a_stopped_zombie_is_fenced_when_it_wakes(backend) -> None:
    uri = backend.uri()
    lakestream.create(uri, SCHEMA, global_batch_size=2, storage_options=backend.options)
    zombie = _spawn(uri, "rollout-0", backend.options, None, total=100_000)
    s = lakestream.open(uri, storage_options=backend.options)
    deadline = time.monotonic() + 60
    while s.producers.get("rollout-0", (0, -1, None))[1] < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
        s.refresh()
    zombie.send_signal(signal.SIGSTOP)
    try:
        replacement = _spawn(uri, "rollout-0", backend.options, None, total=0)
        assert replacement.wait(timeout=60) == 0  # opened (fenced the zombie) and closed
        s.refresh()
        fenced_at = s.version
        zombie_epoch = s.producers["rollout-0"][0] - 1
    finally:
        zombie.send_signal(signal.SIGCONT)
    _out, err = zombie.communicate(timeout=60)
    assert zombie.returncode != 0 and "ProducerFencedError" in err
    s.refresh()
    for v in range(fenced_at + 1, s.version + 1):
        entry = read_entry(s.store, v)
        assert not (isinstance(entry, Append) and entry.epoch <= zombie_epoch), (
            f"version {v} holds a zombie append")
    got = _stream_ids(uri, backend.options)
    assert len(got) == len(set(got)) and got == list(range(len(got)))
