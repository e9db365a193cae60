"""Mixing streams by proportion, shuffling by window, epochs over sealed streams: every rank,
every world size and every restart reads the same samples at the same step."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
import pytest

import lakestream
from lakestream.errors import StepNotAvailableError
from lakestream.loaders import Source, StreamDataset, StreamLoader
from lakestream.ops.cli import main
from tests.helpers import SCHEMA, count_reads, rows, step_ids, worker_options

A_TAKE, B_TAKE = 8, 4
A_SIZE, B_SIZE = 64, 32  # 8 steps per epoch from each


def _sources(tmp_path: Any, seal: bool = True) -> tuple[str, str]:
    a = lakestream.create(str(tmp_path / "a"), SCHEMA, global_batch_size=8, group_size=2)
    for k in range(0, A_SIZE, 8):
        a.append(rows(k, 8))
    b = lakestream.create(str(tmp_path / "b"), SCHEMA, global_batch_size=4)
    for k in range(0, B_SIZE, 4):
        b.append(rows(1000 + k, 4))
    if seal:
        a.seal()
        b.seal()
    return a.uri, b.uri


def _mix(uris: tuple[str, str], rank: int = 0, world: int = 1, **kwargs: Any) -> StreamDataset:
    kwargs.setdefault("shuffle_window", 3)
    kwargs.setdefault("seed", 11)
    kwargs.setdefault("epochs", 2)
    return StreamDataset([Source(uris[0], take=A_TAKE), Source(uris[1], take=B_TAKE)],
                         rank=rank, world_size=world, group=None, timeout=30, **kwargs)


def _split(ids: list[int]) -> tuple[list[int], list[int]]:
    return [x for x in ids if x < 1000], [x for x in ids if x >= 1000]


def test_every_rank_reads_its_share_and_each_sample_comes_once_per_epoch(tmp_path) -> None:
    uris = _sources(tmp_path)
    whole = step_ids(_mix(uris))
    assert [s for s, _ in whole] == list(range(16))
    for epoch in range(2):
        part = [ids for s, ids in whole if s // 8 == epoch]
        a = [x for ids in part for x in _split(ids)[0]]
        b = [x for ids in part for x in _split(ids)[1]]
        assert sorted(a) == list(range(A_SIZE)) and sorted(b) == list(range(1000, 1000 + B_SIZE))
        assert all(len(_split(ids)[0]) == A_TAKE and len(_split(ids)[1]) == B_TAKE
                   for ids in part)
        # Groups of source A (G = 2) stay whole.
        assert all(a[j] % 2 == 0 and a[j + 1] == a[j] + 1 for j in range(0, len(a), 2))
    first, second = ([ids for s, ids in whole if s // 8 == e] for e in range(2))
    assert first != second  # each epoch in a fresh order
    assert [x for ids in first for x in ids] != sorted(x for ids in first for x in ids)
    for world in (2, 4):
        per_rank = [step_ids(_mix(uris, r, world)) for r in range(world)]
        for step, ids in whole:
            a, b = _split(ids)
            for r in range(world):
                ra, rb = _split(per_rank[r][step][1])
                assert ra == a[r * A_TAKE // world:(r + 1) * A_TAKE // world]
                assert rb == b[r * B_TAKE // world:(r + 1) * B_TAKE // world]


# Step 5 is inside the second shuffle window (3-5), step 9 inside the second epoch.
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("at, workers", [(5, 0), (9, 2)])
def test_resume_mid_window_and_mid_epoch_equals_the_uninterrupted_run(
        tmp_path, at: int, world: int, workers: int) -> None:
    uris = _sources(tmp_path)
    whole = step_ids(_mix(uris))
    first = _mix(uris, 0, 2)
    head = step_ids(first, at)
    assert [s for s, _ in head] == list(range(at))
    state = first.state_dict()
    assert state["next_step"] == at
    for rank in range(world):
        ds = _mix(uris, rank, world)
        ds.load_state_dict(state)
        tail = step_ids(StreamLoader(ds, **worker_options(workers)))
        assert [s for s, _ in tail] == list(range(at, 16))
        for (_, ids), (_, mine) in zip(whole[at:], tail, strict=True):
            a, b = _split(ids)
            k_a, k_b = A_TAKE // world, B_TAKE // world
            assert _split(mine) == (a[rank * k_a:(rank + 1) * k_a], b[rank * k_b:(rank + 1) * k_b])


def test_a_live_window_is_read_only_once_it_is_all_committed(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 12))  # a window of 2 steps holds 8 samples: one and a half windows
    ds = StreamDataset(s.uri, group=None, rank=0, world_size=1, shuffle_window=2, seed=3,
                       timeout=0.3, max_steps=4)
    it = iter(ds)
    got = [next(it), next(it)]
    assert sorted(int(x) for b in got for x in b["id"]) == list(range(8))
    with pytest.raises(StepNotAvailableError, match="step 2"):
        next(it)

    def produce() -> None:
        time.sleep(0.2)
        s.append(rows(12, 4))

    t = threading.Thread(target=produce)
    t.start()
    late = StreamDataset(s.uri, group=None, rank=0, world_size=1, shuffle_window=2, seed=3,
                         timeout=30, start_step=2, max_steps=4)
    tail = [int(x) for b in late for x in b["id"]]
    t.join()
    assert sorted(tail) == list(range(8, 16))


def test_a_mix_ends_where_a_sealed_source_runs_out(tmp_path) -> None:
    uris = _sources(tmp_path, seal=False)
    lakestream.open(uris[1]).seal()  # 32 samples: 8 steps of 4
    ds = StreamDataset([Source(uris[0], take=4), Source(uris[1], take=4)], group=None,
                       rank=0, world_size=1, timeout=30)
    got = step_ids(ds)
    assert [s for s, _ in got] == list(range(8))  # source a still has samples: no matter
    cycled = StreamDataset([Source(uris[0], take=4), Source(uris[1], take=8, cycle=True)],
                           group=None, rank=0, world_size=1, timeout=0.3, max_steps=17)
    got = step_ids(cycled, 16)  # a (64 samples, live) runs out of committed data at step 16
    b = [x for _, ids in got for x in _split(ids)[1]]
    assert b == list(range(1000, 1032)) * 4  # cycled in order, no shuffle


def test_markers_hold_each_source_from_where_the_mix_resumes(tmp_path, capsys) -> None:
    uris = _sources(tmp_path, seal=False)
    ds = StreamDataset([Source(uris[0], take=8), Source(uris[1], take=2)], group="train",
                       rank=0, world_size=1, shuffle_window=2, timeout=30, max_steps=3)
    assert len(step_ids(ds)) == 3
    ds.commit_checkpoint(checkpoint_id="c3")
    a, b = lakestream.open(uris[0]), lakestream.open(uris[1])
    # Step 3 lies in the second window (steps 2-3): a from offset 16 (its step 2), b from
    # offset 4 (its step 1).
    assert [(m.step, m.checkpoint_id) for m in a.checkpoints("train")] == [(2, "c3")]
    assert [(m.step, m.checkpoint_id) for m in b.checkpoints("train")] == [(1, "c3")]
    # `group list` names the checkpoint and the step of this source it reads from, not a
    # bare "resume step" that reads as the mix's own.
    assert main(["group", "list", uris[1]]) == 0
    assert "1 marker (newest: c3 reads from step 1)" in capsys.readouterr().out
    a.retain(keep_last=1)
    b.retain(keep_last=1)
    again = StreamDataset([Source(uris[0], take=8), Source(uris[1], take=2)], group="train",
                          rank=0, world_size=1, shuffle_window=2, timeout=30, max_steps=6)
    again.load_state_dict(ds.state_dict())
    assert [s for s, _ in step_ids(again)] == [3, 4, 5]


def test_a_source_added_on_resume_leaves_the_others_where_they_were(tmp_path) -> None:
    uris = _sources(tmp_path, seal=False)
    one = StreamDataset([Source(uris[0], take=8)], group=None, rank=0, world_size=1,
                        timeout=30, max_steps=3)
    assert [ids for _, ids in step_ids(one)][-1] == list(range(16, 24))
    two = StreamDataset([Source(uris[0], take=8), Source(uris[1], take=4)], group=None,
                        rank=0, world_size=1, timeout=30, max_steps=5)
    two.load_state_dict(one.state_dict())
    got = step_ids(two)
    assert got == [(3, list(range(24, 32)) + [1000, 1001, 1002, 1003]),
                   (4, list(range(32, 40)) + [1004, 1005, 1006, 1007])]


@pytest.mark.parametrize("change", ["added", "take"])
def test_a_changed_mix_reads_a_cycling_shuffled_source_at_most_once_an_epoch(
        tmp_path, change: str) -> None:
    uris = _sources(tmp_path)  # source b: 32 samples, cycled
    one = StreamDataset([Source(uris[1], take=4, cycle=True)], group=None, rank=0,
                        world_size=1, timeout=30, max_steps=3, shuffle_window=2, seed=5)
    seen = [x for _, ids in step_ids(one) for x in ids]  # 12 of the first epoch's 32
    if change == "added":
        sources = [Source(uris[0], take=8), Source(uris[1], take=4, cycle=True)]
    else:
        sources = [Source(uris[1], take=2, cycle=True)]
    two = StreamDataset(sources, group=None, rank=0, world_size=1, timeout=30,
                        max_steps=3 + 16, shuffle_window=2, seed=5)
    two.load_state_dict(one.state_dict())
    rest = [x for _, ids in step_ids(two) for x in _split(ids)[1]]
    if change == "added":  # the same permutations: the epoch goes on where it was
        assert sorted(seen + rest[:20]) == list(range(1000, 1032))
    else:  # other windows: the next epoch starts whole, rather than this one remapped
        assert sorted(rest) == list(range(1000, 1032))


def test_a_finished_mix_with_epochs_leaves_no_lag_on_its_sources(tmp_path) -> None:
    from lakestream.ops.status import groups

    uris = _sources(tmp_path)
    ds = StreamDataset([Source(uris[0], take=A_TAKE), Source(uris[1], take=B_TAKE)],
                       group="train", timeout=30, shuffle_window=3, seed=11, epochs=2,
                       rank=0, world_size=1)
    assert [s for s, _ in step_ids(ds)] == list(range(16))
    ds.close()
    for uri in uris:
        shown = groups(lakestream.open(uri))["train"]
        assert shown["lag_steps"] == 0, shown


def test_bad_mixes_are_refused_naming_the_source(tmp_path) -> None:
    uris = _sources(tmp_path, seal=False)
    with pytest.raises(ValueError, match=r"source 1 \(.*b\): cycle needs a sealed"):
        StreamDataset([Source(uris[0], take=8), Source(uris[1], take=4, cycle=True)])
    with pytest.raises(ValueError, match="epochs needs sealed sources"):
        StreamDataset([Source(uris[0], take=8)], epochs=2)
    with pytest.raises(ValueError, match="source 0 takes 8 samples per step"):
        StreamDataset([Source(uris[0], take=8), Source(uris[1], take=4)], rank=0,
                      world_size=8)
    other = lakestream.create(str(tmp_path / "c"), pa.schema([("id", pa.string())]),
                              global_batch_size=2)
    with pytest.raises(ValueError, match="sources disagree on column 'id'"):
        StreamDataset([Source(uris[0], take=8), Source(other.uri, take=2)])


def test_a_binary_column_reads_back_byte_exact(tmp_path) -> None:
    schema = pa.schema([("id", pa.int64()), ("image", pa.binary())])
    s = lakestream.create(str(tmp_path / "s"), schema, global_batch_size=4)
    blobs = [bytes([i]) * (i * 37) + bytes(range(256)) for i in range(8)]
    s.append({"id": list(range(8)), "image": blobs})
    s.seal()
    ds = StreamDataset(s.uri, group=None, rank=0, world_size=1, shuffle_window=2, epochs=1)
    got = {}
    for b in ds:
        data, at = b["image"].numpy().tobytes(), b["image_offsets"].tolist()
        got.update({int(i): data[at[k]:at[k + 1]] for k, i in enumerate(b["id"])})
    assert got == dict(enumerate(blobs))


def test_a_changed_mix_is_not_rebased_per_worker(tmp_path) -> None:
    """Each worker of a StatefulDataLoader holds its own step: rebasing there would give the
    workers different bases (samples read twice, others never)."""
    uris = _sources(tmp_path, seal=False)
    one = StreamDataset([Source(uris[0], take=8)], group=None, rank=0, world_size=1)
    state = {**one.state_dict(), "worker": 0, "num_workers": 2, "worker_next_step": 5}
    two = StreamDataset([Source(uris[0], take=8), Source(uris[1], take=4)], group=None,
                        rank=0, world_size=1)
    with pytest.raises(lakestream.LakestreamError, match="workers would each take over"):
        two.load_state_dict(state)


def test_a_rebased_stream_checkpoints_and_resumes_where_it_was(tmp_path) -> None:
    """A dataset over one stream that took over from a mix has a base: its DCP state keeps
    it, so a resume reads on from its position, not from step x B."""
    from lakestream.loaders import load_checkpoint, save_checkpoint

    uris = _sources(tmp_path, seal=False)
    mix = StreamDataset([Source(uris[0], take=4), Source(uris[1], take=4)], group="train",
                        rank=0, world_size=1, max_steps=3)
    assert len(step_ids(mix)) == 3  # source a is at position 12
    alone = StreamDataset(uris[0], group="train", rank=0, world_size=1, max_steps=5)
    alone.load_state_dict(mix.state_dict())
    assert step_ids(alone, 1) == [(3, list(range(12, 20)))]
    save_checkpoint({}, str(tmp_path / "ckpt"), alone)
    again = StreamDataset(uris[0], group="train", rank=0, world_size=1, max_steps=5)
    load_checkpoint({}, str(tmp_path / "ckpt"), again)
    assert step_ids(again) == [(4, list(range(20, 28)))]


def test_progress_counts_a_shuffled_window_as_taken(tmp_path) -> None:
    """Producers held to max_lag_steps behind the published progress must be able to
    complete the window the reader waits for."""
    from lakestream.log.progress import read_progress

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 16))  # two windows of 2 steps
    ds = StreamDataset(s.uri, group="train", rank=0, world_size=1, shuffle_window=2,
                       max_steps=1, progress_interval_s=0)
    assert len(step_ids(ds)) == 1
    ds.publish_progress()
    progress = read_progress(s.store, "train")
    assert progress is not None and progress.step == 2  # the end of the first window


def test_cycle_and_epochs_refuse_a_stream_retention_trimmed(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 8))
    s.mark_checkpoint("train", 1)
    s.retain(keep_last=1)
    s.seal()
    with pytest.raises(ValueError, match="reclaimed its samples below offset 4"):
        StreamDataset([Source(s.uri, take=4, cycle=True)], group=None)
    with pytest.raises(ValueError, match="reclaimed its samples below offset 4"):
        StreamDataset(s.uri, group=None, epochs=2)


@pytest.mark.parametrize("shuffled", [False, True], ids=["log order", "shuffled 45+15"])
@pytest.mark.parametrize("threads, prefetch", [(None, None), (6, 12)],
                         ids=["defaults", "prefetch-12"])
def test_a_reader_fetches_each_fragment_once_however_many_steps_draw_on_it(
        tmp_path, shuffled: bool, threads: int | None, prefetch: int | None) -> None:
    # An SFT mix of single-sample groups written 64 to a fragment, and the same samples in
    # log order (steps of 60: most fragments span two), read through the reader's threads.
    a = lakestream.create(str(tmp_path / "a"), SCHEMA, global_batch_size=45)
    b = lakestream.create(str(tmp_path / "b"), SCHEMA, global_batch_size=15)
    plain = lakestream.create(str(tmp_path / "plain"), SCHEMA, global_batch_size=60)
    for stream, n, first in ((a, 960, 0), (b, 320, 1000)):
        for k in range(first, first + n, 64):
            stream.append(rows(k, 64))
            plain.append(rows(k, 64))
    tuning = {"read_threads": threads, "prefetch": prefetch}
    ds = StreamDataset([Source(a.uri, 45), Source(b.uri, 15)], shuffle_window=10,
                       group=None, max_steps=20, **tuning) if shuffled \
        else StreamDataset(plain.uri, group=None, max_steps=20, **tuning)
    ds.mix  # noqa: B018 - opens the streams before counting
    with count_reads() as (gets, decoded):
        seen = [i for batch in ds for i in batch["id"].tolist()]
    assert len(seen) == len(set(seen)) == 20 * 60
    assert set(gets.values()) == {1} and decoded[0] == len(gets)
