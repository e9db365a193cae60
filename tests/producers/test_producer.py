"""The Producer in one process: writes, state, errors, fencing, staleness, orphans."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import lakestream
from lakestream.errors import ProducerFencedError, SchemaMismatchError, TooLargeError
from lakestream.log.progress import progress_key, publish_progress
from lakestream.ops.status import status
from lakestream.producers import Producer, ProducerOptions
from tests.helpers import SCHEMA, delta_ids, ids, rows


def _all_ids(s: lakestream.Stream) -> list[int]:
    s.refresh()
    return sorted(i for step in range(s.num_steps) for i in ids(s.read_step(step)))


def test_write_flush_and_resume_state(backend) -> None:
    uri = backend.uri()
    s = lakestream.create(uri, SCHEMA, global_batch_size=8, group_size=4,
                          storage_options=backend.options)
    with Producer(uri, "rollout-0", storage_options=backend.options) as p:
        assert p.state is None and p.epoch == 1
        seqs = [p.write(rows(4 * i, 4), state={"cursor": i}) for i in range(20)]
        assert seqs == list(range(20))
        p.flush()
        assert p.state == {"cursor": 19} and p.committed_seq == 19
        assert p.stats.fragments_committed == 20
    assert _all_ids(s) == list(range(80))
    assert s.producers["rollout-0"] == (1, 19, {"cursor": 19})
    with Producer(uri, "rollout-0", storage_options=backend.options) as again:
        assert again.state == {"cursor": 19} and again.epoch == 2
        assert again.write(rows(80, 4)) == 20
    assert delta_ids(uri, backend.options) == list(range(84))


def test_list_and_dict_inputs(tmp_path) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=2)
    with Producer(uri, "p") as p:
        p.write([{"id": 0, "tokens": [1], "reward": 0.0}, {"id": 1, "tokens": [], "reward": 1.0}])
        p.write({"id": [2, 3], "tokens": [[2], [3]], "reward": [0.5, 0.5]})
    assert _all_ids(s) == [0, 1, 2, 3]


def test_bad_writes_raise_at_once_and_upload_nothing(tmp_path) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4, group_size=2)
    opts = ProducerOptions(max_fragment_bytes=1000)
    with Producer(uri, "p", options=opts) as p:
        with pytest.raises(SchemaMismatchError, match="missing columns \\['reward'\\]"):
            p.write(rows(0, 2).drop_columns(["reward"]))
        with pytest.raises(ValueError, match="multiple of the group size 2"):
            p.write(rows(0, 3))
        with pytest.raises(ValueError, match="positive multiple"):
            p.write(rows(0, 0))
        with pytest.raises(TooLargeError, match="exceeds max_fragment_bytes=1000"):
            p.write(rows(0, 200))
        with pytest.raises(TypeError, match="JSON-serialisable"):
            p.write(rows(0, 2), state={"cursor": object()})
        p.write(rows(0, 2))
    s.refresh()
    assert s.num_samples == 2 and len(list(s.store.list("data/"))) == 1


@pytest.mark.parametrize("producer_id", ["", "../x", "a/b", "%2e%2e", "a\x00", ".hidden",
                                         "x" * 129])
def test_unsafe_producer_ids_are_refused(tmp_path, producer_id: str) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    with pytest.raises(ValueError, match="producer id"):
        Producer(uri, producer_id)
    assert s.refresh() == 0


def test_a_newer_instance_fences_the_older(backend) -> None:
    uri = backend.uri()
    s = lakestream.create(uri, SCHEMA, global_batch_size=4, storage_options=backend.options)
    old = Producer(uri, "w", storage_options=backend.options)
    old.write(rows(0, 4), state={"n": 1})
    old.flush()
    new = Producer(uri, "w", storage_options=backend.options)
    assert (old.epoch, new.epoch) == (1, 2) and new.state == {"n": 1}
    old.write(rows(100, 4))
    with pytest.raises(ProducerFencedError, match="epoch 1 was fenced by epoch 2"):
        old.flush()
    with pytest.raises(ProducerFencedError):
        old.write(rows(200, 4))
    old.close()
    new.write(rows(4, 4))
    new.close()
    assert _all_ids(s) == list(range(8))


def test_background_failures_surface_on_the_next_call(tmp_path) -> None:
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    p = Producer(uri, "w")

    def broken(*_args: object, **_kwargs: object) -> None:
        raise lakestream.StoreError("disk on fire")

    p.stream.store.put = broken  # type: ignore[method-assign]
    p.write(rows(0, 4))
    with pytest.raises(lakestream.StoreError, match="disk on fire"):
        p.flush()
    with pytest.raises(lakestream.StoreError):
        p.write(rows(4, 4))
    p.abort()


_WRITE_UNTIL_STOPPED = r"""
import sys, time
from lakestream.producers import Producer
from tests.helpers import rows
with Producer(sys.argv[1], "w") as p:
    put = p.stream.store.put
    def slow(key, data, **kw):  # uploads lag the writes: some are always in flight
        if key.startswith("data/"):
            time.sleep(0.05)
        return put(key, data, **kw)
    p.stream.store.put = slow
    i = 0
    while True:
        p.write(rows(4 * i, 4))
        i += 1
        print(i, flush=True)
"""


def test_ctrl_c_commits_every_write_that_returned(tmp_path) -> None:
    """Ctrl-C in a ``with Producer`` loop leaves the block by KeyboardInterrupt: the writes
    ``write`` returned for are committed on the way out, not dropped."""
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    child = subprocess.Popen([sys.executable, "-c", _WRITE_UNTIL_STOPPED, uri],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[2])
    try:
        assert child.stdout is not None and child.stderr is not None
        printed = []
        for line in child.stdout:
            printed.append(int(line))
            if printed[-1] >= 30:
                break
        child.send_signal(signal.SIGINT)
        # What the loop above read ahead of its last line is in the reader's buffer, not
        # the pipe: read on through the same reader, not communicate().
        printed += [int(x) for x in child.stdout.read().split()]
        err = child.stderr.read()
        child.wait(60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    returned = printed[-1]
    assert "KeyboardInterrupt" in err
    got = _all_ids(s)
    # the interrupt may land inside a write after it was accepted, before it printed
    assert got == list(range(len(got))) and len(got) in (4 * returned, 4 * returned + 4), \
        (len(got), returned)


def test_max_lag_steps_blocks_until_the_trainer_catches_up(tmp_path) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    p = Producer(uri, "w", max_lag_steps=2,
                 options=ProducerOptions(progress_poll_s=0.01))
    for i in range(2):
        p.write(rows(4 * i, 4))
    p.flush()  # 2 steps committed, no progress yet: lag 2 <= 2
    p.write(rows(8, 4))
    p.flush()  # lag 3 now; the next write must wait
    polled, done = threading.Event(), threading.Event()
    real_get = p.stream.store.get

    def get(key: str, *args: object, **kwargs: object) -> bytes:
        if key == progress_key("train"):
            polled.set()  # only a write waiting for the lag bound reads progress
        return real_get(key, *args, **kwargs)  # type: ignore[arg-type]

    p.stream.store.get = get  # type: ignore[method-assign]

    def writer() -> None:
        p.write(rows(12, 4))
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    assert polled.wait(30)  # the writer is inside the wait
    blocked_at = time.monotonic()
    assert not done.wait(0.5)
    released_at = time.monotonic()
    publish_progress(s.store, "train", step=1, policy_version=7)
    assert done.wait(30)
    t.join()
    p.close()
    # It began waiting before its first poll and ended after the release: the stat holds
    # at least the stretch in between, however late the threads ran.
    assert p.stats.lag_wait_s >= released_at - blocked_at >= 0.5
    assert _all_ids(s) == list(range(16))


def test_wait_for_lag_gives_up_after_its_timeout_and_admits_nothing(tmp_path) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    with Producer(uri, "w", max_lag_steps=0,
                  options=ProducerOptions(progress_poll_s=0.01)) as p:
        assert p.wait_for_lag(timeout=0.2)  # nothing committed: lag 0
        p.write(rows(0, 4))
        p.flush()  # a step committed, no progress: lag 1 > 0
        t0 = time.monotonic()
        assert not p.wait_for_lag(timeout=0.2)
        assert 0.2 <= time.monotonic() - t0 < 5
        publish_progress(s.store, "train", step=1, policy_version=1)
        assert p.wait_for_lag(timeout=5)


def test_max_lag_steps_zero_lets_one_producer_fill_the_step_the_trainer_waits_for(
        tmp_path) -> None:
    """With groups smaller than a step, the lag counted in fractions of a step stopped a
    lone producer after its first group, and the trainer waited for a step never filled."""
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4, group_size=2)
    with Producer(uri, "w", max_lag_steps=0,
                  options=ProducerOptions(progress_poll_s=0.01)) as p:
        for i in range(2):
            assert p.wait_for_lag(timeout=2)
            p.write(rows(2 * i, 2))
            p.flush()
        assert not p.wait_for_lag(timeout=0.2)  # step 0 is full; the trainer is at 0
        publish_progress(s.store, "train", step=1, policy_version=1)
        assert p.wait_for_lag(timeout=5)
    assert _all_ids(s) == list(range(4))


def test_status_lists_orphans(tmp_path) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    s.append(rows(0, 4))
    s.store.put("data/w/1-0-deadbeef.parquet", b"never committed")
    info = status(lakestream.open(uri))
    assert info["unreferenced_files"] == 1 and info["unreferenced_bytes"] == 15
    # `lakestream status --json` prints this: plain JSON, nothing lost or stringified on
    # the way (the CLI's default=str would hide a value JSON cannot hold).
    assert json.loads(json.dumps(info)) == info


def test_per_fragment_policy_commits_one_fragment_each(tmp_path) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    with Producer(uri, "w", options=ProducerOptions(commit_policy="per-fragment")) as p:
        for i in range(10):
            p.write(rows(4 * i, 4))
        p.flush()
        assert p.stats.commits == 10
    assert s.refresh() == 11 and _all_ids(s) == list(range(40))


def _slow_commits(p: Producer, seconds: float, before: Any = None) -> None:
    """Makes each log-entry put of ``p`` take ``seconds`` longer, calling ``before()``
    first."""
    real_put = p.stream.store.put

    def slow_put(key: str, data: bytes, *, mode: str = "overwrite") -> None:
        if key.startswith("_delta_log/"):
            if before is not None:
                before()
            time.sleep(seconds)
        real_put(key, data, mode=mode)  # type: ignore[arg-type]

    p.stream.store.put = slow_put  # type: ignore[method-assign]


def test_group_commit_batches_under_a_slow_store(tmp_path) -> None:
    """With commits slower than writes, each adaptive commit carries many fragments."""
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    p = Producer(uri, "w")
    _slow_commits(p, 0.05)
    for i in range(40):
        p.write(rows(4 * i, 4))
    p.close()
    assert p.stats.fragments_committed == 40 and p.stats.commits < 20
    assert _all_ids(s) == list(range(160))


def test_the_committer_tells_dac_the_rival_producers_since_its_last_commit(
        tmp_path, monkeypatch) -> None:
    """DAC is told how many other producers committed since this producer's previous commit,
    however their entries were folded in. Regressions: the entries between its commits were
    taken for rival producers (a slower producer, seeing more of them, backed off further
    and fell behind); and they were counted from the stream's version just before the
    commit, which the writer's own refreshes move forward (the lag admission does), so
    rivals read as none."""
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    p = Producer(uri, "a")
    mine: list[int] = []
    controller = p._committer._controller
    observe = controller.observe

    def recording(window_s: float, rivals: int, **kwargs: Any) -> float:
        mine.append(rivals)
        return observe(window_s, rivals, **kwargs)

    monkeypatch.setattr(controller, "observe", recording)
    with Producer(uri, "b") as q, Producer(uri, "c") as r:
        for i in (1, 2, 3):  # three entries, one rival
            q.write(rows(4 * i, 4))
            q.flush()
        p.write(rows(0, 4))
        p.flush()
        for i in (4, 5, 6):  # four entries, two rivals
            q.write(rows(4 * i, 4))
            q.flush()
        r.write(rows(28, 4))
        r.flush()
    p.stream.refresh()  # as the writer's lag admission does: the rivals are folded in here
    p.write(rows(32, 4))
    p.close()
    assert mine == [1, 2]

def test_the_committer_tells_dac_when_writes_wait_for_the_upload_threads(
        tmp_path, monkeypatch) -> None:
    """DAC is told each commit's CPU, and whether writes wait for the upload threads (the
    producer is then bound by its own CPU and commits less often: ``IntervalController``):
    so while a backlog of writes waits for one slow upload thread, and not once it has
    drained."""
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    p = Producer(uri, "a", options=ProducerOptions(upload_threads=1))
    seen: list[tuple[bool, float]] = []
    controller = p._committer._controller
    observe = controller.observe

    def recording(window_s: float, rivals: int, *, cpu_s: float = 0.0,
                  bound: bool = False) -> float:
        seen.append((bound, cpu_s))
        return observe(window_s, rivals, cpu_s=cpu_s, bound=bound)

    monkeypatch.setattr(controller, "observe", recording)
    upload = p._upload

    def slow_upload(*args: Any) -> None:
        time.sleep(0.005)
        upload(*args)

    monkeypatch.setattr(p, "_upload", slow_upload)
    for i in range(60):
        p.write(rows(4 * i, 4))
    p.flush()
    p.write(rows(240, 4))
    p.close()
    assert any(bound for bound, _ in seen) and not seen[-1][0], seen
    assert all(cpu > 0 for _, cpu in seen)


def test_per_fragment_uploads_wait_for_the_commits_they_feed(tmp_path) -> None:
    """One fragment per commit: uploads run at most a round of the pool ahead of commits,
    not the whole in-flight budget (which took the CPU the commits needed)."""
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    threads = 2
    p = Producer(uri, "w", options=ProducerOptions(commit_policy="per-fragment",
                                                   upload_threads=threads))
    ahead: list[int] = []
    _slow_commits(p, 0.02, lambda: ahead.append(
        p.stats.fragments_uploaded - p.stats.fragments_committed))
    for i in range(30):
        p.write(rows(4 * i, 4))
    p.close()
    assert p.stats.fragments_committed == 30 and _all_ids(s) == list(range(120))
    # The fragment being committed, and one uploaded or uploading per pool thread; without
    # the bound, nearly all 30 are ahead.
    assert 1 <= max(ahead) <= 1 + threads, ahead


def test_writers_on_two_threads_never_strand_a_seq_behind_the_upload_window(
        tmp_path) -> None:
    """A seq taken by one writer thread reaches the pool before any later one, or the pool's
    threads could all wait for commits that need it while it sits in the queue."""
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    p = Producer(uri, "w", options=ProducerOptions(commit_policy="per-fragment",
                                                   upload_threads=1))
    real_submit = p._pool.submit
    first = threading.Event()

    def slow_first_submit(fn: Any, seq: int, *args: Any) -> Any:
        if seq == 0:  # the writer of seq 0 is descheduled just before it submits
            first.set()
            time.sleep(0.3)
        return real_submit(fn, seq, *args)

    p._pool.submit = slow_first_submit  # type: ignore[method-assign]
    a = threading.Thread(target=p.write, args=(rows(0, 4),))
    try:
        a.start()
        first.wait(5)
        for i in range(1, 5):
            p.write(rows(4 * i, 4))  # seqs 1-4, from this thread
        a.join()
        p.flush(timeout=10)
        assert p.stats.fragments_committed == 5
    finally:
        p.abort()  # stops the pool's threads even if they were stranded


def test_a_column_of_the_wrong_type_names_it(tmp_path) -> None:
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    bad = rows(0, 4).set_column(2, "reward", pa.array([1.0] * 4, pa.float64()))
    with Producer(uri, "w") as p, pytest.raises(SchemaMismatchError, match="reward: double"):
        p.write(bad)


def test_the_committer_is_woken_only_when_it_can_act(tmp_path) -> None:
    """Uploads that land out of order, behind a missing seq, or without filling half the
    budget leave the committer asleep; the missing seq, or the upload that fills half the
    budget, wakes it. Woken for every upload, it took a thread switch per fragment."""
    from lakestream.producers.committer import Committer, Uploaded

    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    with Producer(uri, "w", options=ProducerOptions(max_inflight_fragments=8)) as p:
        # not started: only its hand-off is exercised
        c = Committer(p.stream, "w", p.epoch, p.options, p.stats, p._inflight, 1)
        woken: list[int] = []
        real = c._cond.notify_all
        c._cond.notify_all = lambda: (woken.append(1), real())[1]  # type: ignore[method-assign]

        def upload(seq: int) -> None:
            c.ready(Uploaded(seq, f"k{seq}", 4, 100, None, 100, 0))

        upload(1)
        upload(2)
        assert woken == []  # seq 0 is missing
        upload(0)
        assert len(woken) == 1
        upload(3)  # four ready: half the budget of 8
        assert len(woken) == 2
        upload(5)
        assert len(woken) == 2  # already full: nothing new to act on


def test_a_producer_writing_flat_out_commits_at_most_every_min_interval(tmp_path) -> None:
    """By default a commit starts no sooner than 10 ms after the previous one landed, so a
    fast producer carries many fragments per commit (with no floor, one upload thread on a
    local disk committed about every fragment, and the commits took CPU from encoding);
    a write after a quiet spell still commits at once."""
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    t0 = time.monotonic()
    with Producer(uri, "w", options=ProducerOptions(upload_threads=1)) as p:
        assert p.options.min_interval_s == 0.01
        for i in range(400):
            p.write(rows(4 * i, 4))
    elapsed = time.monotonic() - t0
    assert p.stats.fragments_committed == 400
    assert p.stats.commits <= elapsed / 0.01 + 2, (p.stats.commits, elapsed)
    with Producer(uri, "w", options=ProducerOptions(min_interval_s=0.5)) as p:
        p.write(rows(0, 4))
        p.flush()
        time.sleep(0.6)
        t = time.monotonic()
        p.write(rows(4, 4))
        p.flush()
        assert time.monotonic() - t < 0.3


def test_the_upload_pool_has_a_thread_per_core_up_to_four_on_a_local_disk(
        tmp_path, monkeypatch) -> None:
    """On a local disk a put is CPU work like the encoding: threads past the cores only
    take turns. A remote store keeps 4 (its puts wait on the network); a set value wins."""
    from lakestream.producers import producer as producer_module

    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    for cores, threads in ((1, 1), (2, 2), (16, 4)):
        monkeypatch.setattr(producer_module.os, "sched_getaffinity",
                            lambda _, n=cores: set(range(n)))
        with Producer(uri, "w") as p:
            assert p.upload_threads == threads == p._pool._max_workers
            p.write(rows(0, 4))
    with Producer(uri, "w", options=ProducerOptions(upload_threads=3)) as p:
        assert p.upload_threads == 3
    remote = type("Remote", (), {"uri": "s3://bucket/s"})()  # only its URI is asked
    assert producer_module.upload_threads_for(remote) == 4


def test_the_commit_floor_and_dac_s_cap_are_set_independently() -> None:
    """A cap on DAC's wait below the default floor is valid (it was refused once the floor
    became 10 ms by default: the two were checked as one range)."""
    assert ProducerOptions(max_interval_s=0).max_interval_s == 0
    assert ProducerOptions(min_interval_s=1.0, max_interval_s=0.1).min_interval_s == 1.0
    for bad in ({"min_interval_s": -0.1}, {"max_interval_s": -1.0}):
        with pytest.raises(ValueError, match="must be >= 0"):
            ProducerOptions(**bad)  # type: ignore[arg-type]


def test_on_commit_is_told_each_commit_and_a_failure_in_it_fails_the_producer(tmp_path) -> None:
    """``on_commit`` hears the last seq of every commit, in order, up to the last write, before
    a flush waiting for that commit returns; what it raises is the producer's failure,
    raised by its flush."""
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    heard: list[int] = []

    def slow(seq: int) -> None:
        time.sleep(0.05)  # a flush must still wait for it
        heard.append(seq)

    with Producer(uri, "w", on_commit=slow) as p:
        for k in range(20):
            p.write(rows(k * 4, 4))
        p.flush()
        assert heard and heard[-1] == 19  # heard before the flush returned
    assert heard == sorted(heard)
    assert len(set(heard)) == len(heard)

    def refuse(seq: int) -> None:
        raise RuntimeError(f"the callback refused seq {seq}")

    p = Producer(uri, "w", on_commit=refuse)
    p.write(rows(80, 4))
    with pytest.raises(RuntimeError, match="the callback refused seq 20"):
        p.flush()
    p.abort()


def test_a_producer_does_pyarrows_first_conversion_of_python_objects_while_it_opens(
        tmp_path) -> None:
    """pyarrow imports pandas (installed here) on its first conversion of Python objects:
    0.4 s that the first write of lists, with its samples, waited for (the first second of
    ``bench/delivered.py`` ran 0.5-0.9 s late). Opening does it in an upload thread. In a
    process of its own: another test may have converted lists already."""
    code = f"""
import sys
import lakestream
from lakestream.producers import Producer
from tests.helpers import SCHEMA
lakestream.create({str(tmp_path / "s")!r}, SCHEMA, global_batch_size=4)
before = "pandas" in sys.modules
Producer({str(tmp_path / "s")!r}, "p").close()  # close waits for the upload threads
print(before, "pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"]
