"""Replay is deterministic and follows the void rules; snapshots + tail equal full replay."""

from __future__ import annotations

import dataclasses
import tempfile
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from lakestream.log.codec import decode_entry, encode_entry
from lakestream.log.entries import (
    Append,
    Checkpoint,
    Create,
    Entry,
    Fence,
    FragmentRef,
    SharedAppend,
    StreamMeta,
)
from lakestream.log.manifest import snapshot_key
from lakestream.log.replay import ReplayState, replay
from lakestream.log.snapshot import decode_snapshot, write_snapshot
from lakestream.store import LocalStore

META = StreamMeta(pa.schema([("x", pa.int64())]), 4, 1, table_id="t", created_ms=0)
PRODUCERS = ["a", "b", "c"]

op = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(PRODUCERS), st.sampled_from([-1, 0, 0, 0, 1]),
              st.sampled_from([-1, 0, 1, 1, 1]), st.lists(st.integers(0, 3), min_size=1,
                                                           max_size=3)),
    st.tuples(st.just("fence"), st.sampled_from(PRODUCERS), st.sampled_from([-1, 0, 1, 1])),
    st.tuples(st.just("checkpoint"), st.sampled_from(["train", "eval"]), st.integers(0, 9)),
    st.tuples(st.just("anon"), st.integers(1, 3)),
    # A host's shared append: parts of distinct producers, void whole if one part is.
    st.tuples(st.just("shared"), st.lists(
        st.tuples(st.sampled_from(PRODUCERS), st.sampled_from([-1, 0, 0, 0, 1]),
                  st.sampled_from([-1, 1, 1, 1]), st.lists(st.integers(0, 3), min_size=1,
                                                           max_size=2)),
        min_size=1, max_size=3, unique_by=lambda part: part[0])),
)


def _model_and_log(ops: list[tuple[Any, ...]]) -> tuple[list[tuple[int, Entry]], dict[str, Any]]:
    """Builds the log for ``ops`` and what replay must make of it, by a separate, simple model."""
    epochs: dict[str, int] = {}
    seqs: dict[str, int] = {}
    states: dict[str, Any] = {}
    offset, live, markers = 0, [], []
    log: list[tuple[int, Entry]] = [(0, Create(META, "c0"))]
    for o in ops:
        v = len(log)
        if o[0] in ("append", "shared"):
            at, void, parts = offset, False, []
            for p, de, ds, sizes in ([o[1:]] if o[0] == "append" else o[1]):
                epoch = max(0, epochs.get(p, 0) + de)  # a key holds no negative epoch
                first = max(0, seqs.get(p, -1) + ds)
                known = p in epochs or p in seqs
                void = void or known and (epoch < epochs.get(p, 0) or first <= seqs.get(p, -1)) \
                    or 0 in sizes  # no writer writes an empty fragment
                frags = []
                for i, n in enumerate(sizes):
                    frags.append(FragmentRef(f"data/{p}/{epoch}-{first + i}-{v}.parquet", n, 10,
                                             at, first + i))
                    at += n
                parts.append(Append(p, epoch, tuple(frags), {"cursor": v}, f"c{v}"))
            entry: Entry = parts[0] if o[0] == "append" else SharedAppend("@h", tuple(parts),
                                                                          f"c{v}")
            if not void:
                offset = at
                for part in parts:
                    p = part.producer
                    live += [(f.path, f.offset, f.rows) for f in part.fragments if f.rows]
                    epochs[p] = max(epochs.get(p, 0), part.epoch)
                    seqs[p], states[p] = part.last_seq, {"cursor": v}
        elif o[0] == "fence":
            _, p, de = o
            epoch = epochs.get(p, 0) + de
            entry = Fence(p, epoch, f"c{v}")
            if epoch > epochs.get(p, 0):
                epochs[p] = epoch
        elif o[0] == "checkpoint":
            entry = Checkpoint(o[1], o[2], None, f"c{v}")
            if o[2] <= offset // META.global_batch_size:  # a step past the end is void
                markers.append((o[1], o[2], v))
        else:
            ref = FragmentRef(f"data/_append/0-0-{v}.parquet", o[1], 10, offset, 0)
            entry = Append(None, 0, (ref,), None, f"c{v}")
            live.append((ref.path, offset, o[1]))
            offset += o[1]
        log.append((v, entry))
    model = {
        "next_offset": offset,
        "fragments": live,
        "producers": {p: (epochs.get(p, 0), seqs.get(p, -1), states.get(p))
                      for p in set(epochs) | set(seqs)},
        "markers": sorted(markers),
    }
    return log, model


def _summary(s: ReplayState) -> dict[str, Any]:
    return {
        "next_offset": s.next_offset,
        "fragments": [(f.path, f.offset, f.rows) for f in s.all_fragments()],
        "producers": {p: (x.epoch, x.seq, x.state) for p, x in s.producers.items()},
        "markers": sorted((m.group, m.step, m.version) for ms in s.markers.values() for m in ms),
    }


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=25))
def test_replay_matches_the_model(ops: list[tuple[Any, ...]]) -> None:
    log, model = _model_and_log(ops)
    assert _summary(replay(log)) == model


@settings(max_examples=60, deadline=None)
@given(st.lists(op, max_size=20), st.data())
def test_snapshot_plus_tail_equals_full_replay(ops: list[tuple[Any, ...]], data: Any) -> None:
    log, _ = _model_and_log(ops)
    interval = data.draw(st.integers(1, 6))  # small: snapshots of several segments
    log[0] = (0, Create(dataclasses.replace(META, snapshot_interval=interval), "c0"))
    full = replay(log)
    cut = data.draw(st.integers(0, len(log) - 1))
    with tempfile.TemporaryDirectory() as root:
        store = LocalStore(root)
        # As committers do: a snapshot at every interval, each naming the segments of the
        # one before and writing what came since, then one at the cut.
        state = ReplayState()
        for v, entry in log[: cut + 1]:
            state.apply(v, entry)
            if v % interval == 0 or v == cut:
                write_snapshot(store, state)
        prefix = state
        restored = decode_snapshot(cut, store.get(snapshot_key(cut)), store.get)
        # Inside: the restored index fetches its segments from the store when read.
        assert _summary(restored) == _summary(prefix)
        assert _summary(replay(log[cut + 1:], restored)) == _summary(full)


@settings(max_examples=100, deadline=None)
@given(st.lists(op, max_size=15))
def test_entries_round_trip_through_delta_json(ops: list[tuple[Any, ...]]) -> None:
    log, _ = _model_and_log(ops)
    for v, entry in log[1:]:
        assert decode_entry(v, encode_entry(entry)) == entry


def test_a_zombie_append_after_a_fence_takes_no_offsets() -> None:
    ref = FragmentRef("data/p/1-0-x.parquet", 4, 10, 0, 0)
    log: list[tuple[int, Entry]] = [
        (0, Create(META)), (1, Fence("p", 1)), (2, Fence("p", 2)),
        (3, Append("p", 1, (ref,), None)),  # the epoch-1 instance was fenced by epoch 2
    ]
    s = replay(log)
    assert s.next_offset == 0 and s.all_fragments() == [] and [v for v, _ in s.voided] == [3]
