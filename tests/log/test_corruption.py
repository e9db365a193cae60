"""Entries that cannot be interpreted fail loudly, naming the version."""

from __future__ import annotations

import json

import pytest

import lakestream
from lakestream.errors import CorruptLogError
from lakestream.log.checksum import lines_checksum
from lakestream.log.codec import decode_entry
from lakestream.log.keys import log_key
from lakestream.log.manifest import snapshot_key
from lakestream.ops.verify import verify
from tests.helpers import SCHEMA, ids, rows


@pytest.fixture
def stream(tmp_path):
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 4))
    s.append(rows(4, 4))
    return s


def _rewrite(stream, version: int, edit) -> None:
    lines = [json.loads(x) for x in stream.store.get(log_key(version)).splitlines()]
    stream.store.put(log_key(version), edit(lines))


def _dump(lines) -> bytes:
    """The edited entry with a checksum that matches: as a buggy writer would write it."""
    infos = [x["commitInfo"]["lakestream"] for x in lines if "commitInfo" in x]
    for info in infos:
        info.pop("crc32", None)
    for info in infos:
        info["crc32"] = lines_checksum(lines)
    return b"\n".join(json.dumps(x, separators=(",", ":")).encode() for x in lines) + b"\n"


def _tag(lines, key, value):
    for a in lines:
        if "add" in a:
            a["add"]["tags"][key] = value
            if key == "path":
                a["add"]["path"] = value
    return _dump(lines)


def _path(lines, value):
    for a in lines:
        if "add" in a:
            a["add"]["path"] = value
    return _dump(lines)


def _format(lines, value):
    lines[0]["commitInfo"]["lakestream"]["format"] = value
    return _dump(lines)


@pytest.mark.parametrize("edit, match", [
    (lambda lines: _dump(lines)[:40], "log version 2 cannot be read"),
    (lambda lines: _dump(lines).replace(b'"lakestream.rows":"4"', b'"lakestream.rows":"3"'),
     "log version 2 cannot be read: checksum .* damaged"),
    (lambda lines: b"", "log version 2 cannot be read"),
    (lambda lines: _tag(lines, "lakestream.offset", "5"), "records offset 5 .* at 4"),
    (lambda lines: _format(lines, 99), "log version 2 has format version 99"),
    (lambda lines: _path(lines, "data/../../etc/passwd.parquet"), "log version 2: .*'\\.\\.'"),
    (lambda lines: _path(lines, "/etc/x.parquet"), "log version 2: .*absolute"),
    (lambda lines: _path(lines, "s3://other-bucket/data/x.parquet"), "log version 2: .*absolute"),
    (lambda lines: _path(lines, "_delta_log/x.parquet"), "log version 2: .*not a .parquet file"),
    (lambda lines: _dump([{"add": lines[1]["add"]}]), "log version 2 .*not written by Lakestream"),
])
def test_corrupt_entries_raise_naming_the_version(stream, edit, match) -> None:
    _rewrite(stream, 2, edit)
    with pytest.raises(CorruptLogError, match=match):
        lakestream.open(stream.uri)


def test_a_writer_behind_a_corrupt_entry_commits_nothing(stream) -> None:
    behind = lakestream.open(stream.uri)
    stream.store.put(log_key(3), b"{not json")
    with pytest.raises(CorruptLogError, match="log version 3"):
        behind.append(rows(8, 4))
    with pytest.raises(CorruptLogError):
        stream.refresh()
    assert behind.version == 2
    assert len(list(stream.store.list("data/"))) == 2  # its upload was deleted, not orphaned
    with pytest.raises(lakestream.NotFoundError):
        stream.store.head(log_key(4))


def test_a_corrupt_snapshot_falls_back_to_an_older_one(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4, snapshot_interval=2)
    for i in range(5):
        s.append(rows(4 * i, 4))
    s.store.put(snapshot_key(4), b"PAR1 garbage")
    reopened = lakestream.open(s.uri)
    assert reopened.version == 5 and ids(reopened.read_step(4)) == [16, 17, 18, 19]


def test_an_entry_or_manifest_cut_at_its_last_newline_is_caught(stream) -> None:
    # Regression (found by the corruption fuzz): the checksum covered the parsed lines, so a
    # copy that lost only its final newline read as sound.
    entry = stream.store.get(log_key(2))
    stream.store.put(log_key(2), entry[:-1])
    with pytest.raises(CorruptLogError, match="log version 2 .* truncated"):
        lakestream.open(stream.uri)
    stream.store.put(log_key(2), entry)
    manifest = stream.store.get(snapshot_key(0))
    stream.store.put(snapshot_key(0), manifest[:-1])
    problems = verify(stream.store).problems
    assert any(snapshot_key(0) in p and "damaged" in p for p in problems), problems


def test_every_single_bit_flip_of_every_entry_is_caught(stream) -> None:
    # Regression (found by the soak's corruption fuzz): entries were split with
    # str.splitlines(), which also splits on \v, \f and \x1c-\x1e, so a newline flipped to
    # \v still parsed to the same lines and passed the checksum.
    stream.mark_checkpoint("train", 1, "ckpt-1")
    for v in range(stream.version + 1):
        data = stream.store.get(log_key(v))
        for i in range(len(data)):
            for bit in range(8):
                flipped = bytearray(data)
                flipped[i] ^= 1 << bit
                with pytest.raises(CorruptLogError, match=f"log version {v}"):
                    decode_entry(v, bytes(flipped))
