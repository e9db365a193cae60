"""Sealing a stream: no more appends, from any writer, and nothing changes when one is
refused; readers, snapshots, status and the Delta view know the final size."""

from __future__ import annotations

import json

import pytest

import lakestream
from lakestream.errors import StreamSealedError
from lakestream.log.codec import decode_entry, encode_entry
from lakestream.log.entries import CHAINED_ENTRY_FORMAT, Append, FragmentRef, Seal
from lakestream.log.opening import load_state
from lakestream.ops.status import status
from lakestream.ops.verify import verify
from lakestream.producers import Producer
from tests.helpers import SCHEMA, delta_ids, ids, rows

B = 4


def _files(s: lakestream.Stream) -> list[str]:
    return sorted(m.key for m in s.store.list("data/"))


def test_a_sealed_stream_refuses_appends_and_changes_nothing(backend) -> None:
    s = lakestream.create(backend.uri(), SCHEMA, global_batch_size=B,
                          storage_options=backend.options)
    s.append(rows(0, 4))
    s.append(rows(4, 2))
    version = s.seal()
    assert version == 3 and s.sealed_at == 6
    assert s.seal() is None  # idempotent
    before = (s.version, s.num_samples, _files(s))
    with pytest.raises(StreamSealedError, match="is sealed .at 6 samples"):
        s.append(rows(6, 2))
    other = lakestream.open(backend.uri(), storage_options=backend.options)
    with pytest.raises(StreamSealedError):
        other.append(rows(6, 2))
    s.refresh()
    assert (s.version, s.num_samples, _files(s)) == before
    assert ids(s.read_step(0)) == [0, 1, 2, 3]
    assert sorted(delta_ids(s.uri, backend.options)) == list(range(6))


def test_a_handle_that_has_not_seen_the_seal_is_refused_at_commit(tmp_path) -> None:
    """The seal is checked against the head at commit time, so a writer that read the log
    before the seal cannot slip an append in after it; its upload is deleted."""
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    stale = lakestream.open(s.uri)
    s.seal()
    assert stale.sealed_at is None
    with pytest.raises(StreamSealedError):
        stale.append(rows(0, 2))
    s.refresh()
    assert s.num_samples == 0 and s.version == 1 and _files(s) == []


def test_an_append_after_a_seal_is_void_in_replay() -> None:
    """A writer that skips the check (an old version) commits an entry no reader counts."""
    from lakestream.log.entries import Create, StreamMeta
    from lakestream.log.replay import replay

    meta = StreamMeta(SCHEMA, B, 1, 100)
    ref = FragmentRef("data/a/0-0-x.parquet", 2, 10, 0, 0, 1)
    state = replay([(0, Create(meta)), (1, Seal()), (2, Append("a", 0, (ref,), None))])
    assert state.next_offset == 0 and state.sealed_at == 0
    assert [v for v, _ in state.voided] == [2]


def test_a_producer_gets_the_typed_error(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    with Producer(s.uri, "p") as p:
        p.write(rows(0, 2))
        p.flush()
        lakestream.open(s.uri).seal()
        # It has not seen the seal: the commit of its next write fails.
        p.write(rows(2, 2))
        with pytest.raises(StreamSealedError):
            p.flush()
    s.refresh()
    assert s.num_samples == 2
    with Producer(s.uri, "p") as again, pytest.raises(StreamSealedError):
        again.write(rows(2, 2))  # it opened after the seal: refused before any upload


def test_snapshots_status_and_verify_know_the_seal(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B,
                          snapshot_interval=2)
    s.append(rows(0, 4))
    s.seal()  # version 2: a snapshot is written after it
    assert load_state(s.store, s.uri).sealed_at == 4
    # A format a lakestream from before sealing cannot read as an open stream.
    manifest = s.store.get("_lakestream/snapshots/" + f"{2:020d}.json")
    assert json.loads(manifest.split(b"\ncrc32:")[0])["format"] == 5
    info = status(s)
    assert info["sealed_at"] == 4
    assert verify(s.store).problems == []


def test_a_seal_says_which_samples_no_step_will_deliver(tmp_path, caplog, capsys) -> None:
    """2,000 images at a batch of 64 make 31 steps: the last 16 were silently unreachable.
    They still are (a step is a whole global batch, as a DataLoader's drop_last), but the
    seal warns, and status says so, sealed or not."""
    from lakestream.ops.cli import main

    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B)
    s.append(rows(0, 6))
    assert s.undelivered_samples == 2 and status(s)["undelivered_samples"] == 2
    assert main(["status", s.uri]) == 0
    assert "the last 2 samples fill no whole step: delivered once the step fills" in \
        capsys.readouterr().out
    with caplog.at_level("WARNING", logger="lakestream"):
        s.seal()
    assert "sealed at 6 samples (a step is 4): the last 2 fill no whole step and are never " \
        "delivered (append 2 more before sealing" in caplog.text
    assert main(["status", s.uri]) == 0
    assert "the last 2 samples fill no whole step: never delivered (sealed)" in \
        capsys.readouterr().out
    caplog.clear()
    whole = lakestream.create(str(tmp_path / "w"), SCHEMA, global_batch_size=B)
    whole.append(rows(0, 8))
    with caplog.at_level("WARNING", logger="lakestream"):
        whole.seal()
    assert caplog.text == "" and status(whole)["undelivered_samples"] == 0


def test_the_seal_entry_has_a_format_older_readers_refuse_by_name() -> None:
    data = encode_entry(Seal())
    assert json.loads(data.split(b"\n")[0])["commitInfo"]["lakestream"]["format"] == \
        CHAINED_ENTRY_FORMAT == 5
    entry = decode_entry(5, data)
    assert isinstance(entry, Seal)
