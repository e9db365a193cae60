"""Commits shared by a host: producer processes of one host commit through one of them, and
nothing is lost or duplicated when that one is killed anywhere, or stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import deltalake
import pytest

import lakestream
from lakestream.errors import StreamSealedError
from lakestream.failpoints import HOST_NAMES
from lakestream.log.commits import Run, Stored, sharing
from lakestream.log.entries import Append, SharedAppend
from lakestream.log.hostruns import HostRuns
from lakestream.log.replay import ReplayState
from lakestream.log.tail import read_entry
from lakestream.producers import Producer, ProducerOptions
from tests.conftest import SOAK, seeds
from tests.helpers import SCHEMA, rows
from tests.producers.test_crash import FRAGMENTS, _expected, _gapless, _spawn, _stream_ids

HOST = ProducerOptions(share_commits="host")


def _entries(uri: str) -> Counter[str]:
    s = lakestream.open(uri)
    kinds: Counter[str] = Counter()
    for v in range(1, s.version + 1):
        e = read_entry(s.store, v)
        kinds["shared" if isinstance(e, SharedAppend) else type(e).__name__] += 1
        if isinstance(e, SharedAppend):
            kinds["parts"] += len(e.parts)
    return kinds


def _side_by_side(uri: str, options: dict[str, str] | None,
                  spawn: Callable[[], list[subprocess.Popen[str]]]) -> list[subprocess.Popen[str]]:
    """The processes ``spawn`` starts, held from committing (the test holds the host's
    lock) until each has left a run for the host, or one has exited: started one after
    another, each could write everything and commit it alone before the next began."""
    s = lakestream.open(uri, storage_options=options)
    runs = HostRuns.for_stream(s.uri, s.meta.created_ms)
    assert runs is not None and runs.lead()
    procs = spawn()
    try:
        deadline = time.monotonic() + 60
        while len({p.run.producer for p in runs.gather()}) < len(procs) and \
                time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.01)
    finally:
        runs.resign()
    return procs


def _layout(uri: str) -> list[str]:
    s = lakestream.open(uri)
    out = []
    for v in range(1, s.version + 1):
        e = read_entry(s.store, v)
        out.append(f"{v}:{type(e).__name__}:" + (",".join(
            f"{p.producer}[{p.first_seq}-{p.last_seq}]" for p in e.parts)
            if isinstance(e, SharedAppend) else ""))
    return out


def _finish(procs: list, timeout: float = 120) -> list[dict]:
    outs = [p.communicate(timeout=timeout) for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), [e[-3000:] for _, e in outs]
    return [json.loads(o.splitlines()[-1]) for o, _ in outs]


def test_producer_processes_of_a_host_share_commits_each_with_its_own_seqs_and_state(
        tmp_path: Path) -> None:
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=2)
    total = 40
    stats = _finish(_side_by_side(uri, None, lambda: [
        _spawn(uri, f"rollout-{k}", None, None, total=total, share="host") for k in range(4)]))
    assert _stream_ids(uri, None) == _expected(4, total)
    s = lakestream.open(uri)
    assert {n: (p[1], p[2]) for n, p in s.producers.items()} == {
        f"rollout-{k}": (total - 1, {"next": total}) for k in range(4)}
    kinds = _entries(uri)
    # Every append is shared, one process committing for the host at a time (a worker's
    # count is taken at its flush: it may commit for the others after it); entries carry
    # several producers' parts.
    assert kinds["Append"] == 0 and kinds["shared"] >= sum(st["commits"] for st in stats)
    assert kinds["parts"] > kinds["shared"], " ".join(_layout(uri))
    assert sum(st["fragments"] for st in stats) == 4 * total
    # Delta readers see every row, and each producer's own transaction version.
    dt = deltalake.DeltaTable(uri)
    assert dt.to_pyarrow_table().num_rows == 4 * total * 2
    assert all(dt.transaction_version(f"rollout-{k}") == total - 1 for k in range(4))
    _gapless(uri, None)


def test_threads_of_one_process_share_commits_too(tmp_path: Path) -> None:
    import threading

    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=2)

    def write(k: int) -> None:
        with Producer(uri, f"t-{k}", options=HOST) as p:
            for i in range(30):
                p.write(rows(k * 1_000_000 + 2 * i, 2), state={"next": i + 1})

    threads = [threading.Thread(target=write, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _stream_ids(uri, None) == _expected(3, 30)
    assert _entries(uri)["Append"] == 0


# Every point a producer of a shared host passes, the host's committer's included; in make
# test on the local store, in the soak on S3 as well.
HOST_MATRIX = [(store, point) for point in HOST_NAMES for store in ("local", "s3")
               if SOAK or store == "local"]


@pytest.mark.parametrize("seed", seeds(1, 3))
@pytest.mark.parametrize(("backend", "point"), HOST_MATRIX, indirect=["backend"])
def test_a_host_committer_killed_at_every_failpoint_loses_and_duplicates_nothing(
        backend, point: str, seed: int, tally: Counter[str]) -> None:
    uri = backend.uri()
    lakestream.create(uri, SCHEMA, global_batch_size=2, snapshot_interval=2,
                      storage_options=backend.options)
    names = [f"rollout-{k}" for k in range(3)]
    # At an upload's points each dies at another hit. At the others, each at its first:
    # whoever holds the host's lock dies there, another takes the lock over and dies there
    # too, and so on; or each that hands a run over dies having left it (a holder commits,
    # and a producer hands over, a few times a run: later hits may never come).
    upload = point in ("before_upload", "after_upload")  # each seed moves those kills
    first = _side_by_side(uri, backend.options, lambda: [
        _spawn(uri, n, backend.options,
               f"{point}@{1 + (k + 3 * seed) % 10 if upload else 1}", share="host")
        for k, n in enumerate(names)])
    codes = [p.wait(timeout=120) for p in first]
    assert -signal.SIGKILL in codes, f"no producer reached {point}: {codes}"
    # Restarted together: each resumes from what the log holds of it (runs its killed
    # instance left for the host are committed by whoever commits next, or fenced).
    again = _finish([_spawn(uri, n, backend.options, None, share="host") for n in names])
    _every_sample_once(backend, names, again, codes, tally, f"host-{backend.name}.{point}")


def _every_sample_once(backend, names: list[str], again: list[dict], codes: list[int],
                       tally: Counter[str], run: str) -> None:
    """After a crash run's restart (``again``, its workers' stats): every sample of
    ``names`` in the stream once, each producer's final state, a gapless log; tallied."""
    assert all(st["fragments"] <= FRAGMENTS for st in again)
    assert _stream_ids(backend.uri(), backend.options) == _expected(len(names), FRAGMENTS)
    final = lakestream.open(backend.uri(), storage_options=backend.options).producers
    assert all(final[n][2] == {"next": FRAGMENTS} for n in names)
    _gapless(backend.uri(), backend.options)
    tally["crash_runs"] += 1
    tally[f"crash_runs.{run}"] += 1
    tally["crash_kills"] += codes.count(-signal.SIGKILL)
    tally["samples_checked"] += len(names) * FRAGMENTS * 2


def test_a_stopped_host_committer_does_not_block_the_others(tmp_path: Path) -> None:
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=2)
    leader = _spawn(uri, "rollout-0", None, None, total=100_000, share="host",
                    max_interval_s=0.5)
    s = lakestream.open(uri)
    deadline = time.monotonic() + 60
    while "rollout-0" not in s.producers and time.monotonic() < deadline:
        time.sleep(0.05)
        s.refresh()
    leader.send_signal(signal.SIGSTOP)  # holds the host's lock, takes nothing
    try:
        started = time.monotonic()
        _finish([_spawn(uri, f"rollout-{k}", None, None, total=10, share="host",
                        max_interval_s=0.5) for k in (1, 2)], timeout=60)
        took = time.monotonic() - started
    finally:
        leader.send_signal(signal.SIGKILL)
        leader.wait(timeout=30)
    s.refresh()
    assert {n: s.producers[n][1] for n in ("rollout-1", "rollout-2")} == {
        "rollout-1": 9, "rollout-2": 9}
    assert took < 30
    got = [i for i in _stream_ids(uri, None) if i >= 1_000_000]
    assert got == _expected(3, 10)[20:]  # rollout-1 and -2, each id once


def test_a_shared_append_leaves_out_fenced_runs_committed_seqs_and_runs_past_a_gap() -> None:
    meta_log = lakestream.log.entries
    state = ReplayState()
    state.apply(0, meta_log.Create(meta_log.StreamMeta(SCHEMA, 2, 2, table_id="t",
                                                        created_ms=0)))
    state.apply(1, meta_log.Fence("a", 1))
    state.apply(2, meta_log.Fence("b", 2))
    state.apply(3, meta_log.Fence("c", 1))

    def run(p: str, epoch: int, seqs: list[int]) -> Run:
        return Run(p, epoch, [Stored(f"data/{p}/{epoch}-{q}-x.parquet", 2, 10, q, 0, {"q": q})
                              for q in seqs])

    build = sharing("s", "@h", [run("a", 1, [0, 1]), run("b", 1, [0]),  # b: fenced by 2
                                run("c", 1, [0, 2, 3])])  # c: 1 not here yet
    entry = build(state, "cid")
    assert isinstance(entry, SharedAppend)
    assert [(p.producer, [f.seq for f in p.fragments], p.state) for p in entry.parts] == [
        ("a", [0, 1], {"q": 1}), ("c", [0], {"q": 0})]
    assert [f.offset for f in entry.fragments] == [0, 2, 4]
    state.apply(4, entry)
    # Sent again (the answer lost): the log holds it all, nothing to commit.
    assert build(state, "cid2") is None
    state.apply(5, meta_log.Seal())
    with pytest.raises(StreamSealedError):
        build(state, "cid3")


def test_a_shared_append_takes_a_producer_s_newest_epoch_and_what_its_first_line_holds(
) -> None:
    from lakestream.log.codec import encode_entry
    from lakestream.log.entries import MAX_STATE_BYTES

    meta_log = lakestream.log.entries
    state = ReplayState()
    state.apply(0, meta_log.Create(meta_log.StreamMeta(SCHEMA, 2, 2, table_id="t",
                                                        created_ms=0)))
    big = "x" * (MAX_STATE_BYTES // 3)

    def run(p: str, epoch: int, rows: int = 2, st: object = None) -> Run:
        return Run(p, epoch, [Stored(f"data/{p}/{epoch}-0-x.parquet", rows, 10, 0, 0, st)])

    # A producer killed with runs left, reopened at a newer epoch before the holder's view
    # saw its fence: two epochs of one producer, one part (the newest); a run of a fragment
    # no writer writes (rows not a multiple of G) would void the entry: left out; states
    # past what the first line holds: left for the next commit.
    entry = sharing("s", "@h", [run("a", 3), run("a", 4), run("b", 1, rows=3),
                                *(run(f"c{k}", 1, st=big) for k in range(4))])(state, "cid")
    assert isinstance(entry, SharedAppend)
    assert [(p.producer, p.epoch) for p in entry.parts] == [
        ("a", 4), ("c0", 1), ("c1", 1), ("c2", 1)]
    encode_entry(entry)  # readers take it: its first line is within MAX_INFO_BYTES


def test_the_host_folder_trusts_only_whole_runs_of_the_producer_they_name(
        tmp_path: Path) -> None:
    runs = HostRuns(str(tmp_path / "h"))
    good = runs.publish("a", 1, [Stored("data/a/1-0-x.parquet", 2, 10, 0, 7, None),
                                 Stored("data/a/1-1-x.parquet", 2, 10, 1, 7, {"n": 2})])
    (Path(runs.folder) / "torn.json.tmp-1-abc").write_bytes(b'{"producer": "a"')
    (Path(runs.folder) / "1-0-0-b.json").write_text(json.dumps(
        {"producer": "b", "epoch": 1, "fragments": [[0, "data/a/1-0-x.parquet", 2, 10, 7, None]]}))
    (Path(runs.folder) / "1-0-0-c.json").write_text("{")
    # Damaged in ways that would make a holder write an entry readers refuse, or fail.
    bad = {"rows 0": [0, "data/d/1-0-x.parquet", 0, 10, 7, None],
           "crc as text": [0, "data/d/1-0-x.parquet", 2, 10, "7", None],
           "size past int64": [0, "data/d/1-0-x.parquet", 2, 2**63, 7, None],
           "NaN state": [0, "data/d/1-0-x.parquet", 2, 10, 7, float("nan")]}
    for k, fragment in enumerate(bad.values()):
        (Path(runs.folder) / f"1-0-{k}-d.json").write_text(json.dumps(
            {"producer": "d", "epoch": 1, "fragments": [fragment]}))
    (Path(runs.folder) / "1-0-9-d.json").write_text(
        '{"producer": "d", "epoch": 1, "fragments": [[0, "data/d/1-0-x.parquet", 2, 10, 7, '
        + "[" * 100_000 + "]" * 100_000 + "]]}")
    # No fragment at all: sorting the runs by their first seq failed the whole gather.
    (Path(runs.folder) / "1-0-0-e.json").write_text(
        json.dumps({"producer": "e", "epoch": 1, "fragments": []}))
    found = runs.gather()
    assert [p.name for p in found] == [good]
    assert found[0].run.fragments[-1].state == {"n": 2}
    old = Path(runs.folder) / good
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert runs.gather() == [] and not old.exists()  # too old to commit: removed


def test_one_process_holds_the_host_lock_and_a_fork_does_not_keep_it(tmp_path: Path) -> None:
    a, b = HostRuns(str(tmp_path / "h")), HostRuns(str(tmp_path / "h"))
    assert a.lead() and a.lead() and not b.lead()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child has closed its copy of the lock when fork returns in it
        os.write(w, b"x")
        time.sleep(0.5)
        os._exit(0)
    try:
        assert os.read(r, 1) == b"x"  # the child lives on, holding no lock
        a.resign()
        assert b.lead()
    finally:
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w)
        b.resign()


def test_share_commits_needs_the_adaptive_policy() -> None:
    with pytest.raises(ValueError, match="adaptive"):
        ProducerOptions(share_commits="host", commit_policy="per-fragment")
    with pytest.raises(ValueError, match="share_commits"):
        ProducerOptions(share_commits="cluster")  # type: ignore[arg-type]


def test_a_shared_append_naming_another_writer_s_file_is_void(monkeypatch) -> None:
    import lakestream.log.codec as codec
    from lakestream.log.entries import FragmentRef, Refused

    part = Append("a", 1, (FragmentRef("data/a/1-0-x.parquet", 2, 10, 0, 0),), None, "c")
    other = Append("b", 1, (FragmentRef("data/a/1-1-x.parquet", 2, 10, 2, 1),), None, "c")
    with pytest.raises(ValueError, match="not a file of its writer"):
        codec.encode_entry(SharedAppend("@h", (part, other)))
    with pytest.raises(ValueError, match="two parts"):
        codec.encode_entry(SharedAppend("@h", (part, part)))
    entry = SharedAppend("@h", (part,), "c")
    assert codec.decode_entry(7, codec.encode_entry(entry)) == entry
    # Written by a writer that does not keep to it: every reader voids it.
    monkeypatch.setattr(codec, "_shared_refusal", lambda host, parts: None)
    forged = codec.encode_entry(SharedAppend("@h", (part, other)))
    monkeypatch.undo()
    assert isinstance(codec.decode_entry(7, forged), Refused)


def test_the_host_committer_wakes_when_a_producer_leaves_a_run(tmp_path: Path) -> None:
    import threading

    holder, producer = HostRuns(str(tmp_path / "h")), HostRuns(str(tmp_path / "h"))
    producer.poke()  # nobody listens yet: nothing happens
    assert holder.lead()
    holder.wait(0.001)  # binds its socket; the poke above was never queued
    started = time.monotonic()
    holder.wait(0.2)
    assert time.monotonic() - started >= 0.15  # nothing pokes: the timeout
    threading.Timer(0.05, producer.poke).start()
    started = time.monotonic()
    holder.wait(10.0)
    assert time.monotonic() - started < 5.0
    holder.resign()
