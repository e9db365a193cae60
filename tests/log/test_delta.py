"""The log is a Delta Lake table: the protocol matches the schema, deltalake reads back every
column type, a Delta checkpoint works, entries are strict JSON, and log keys parse."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import lakestream
from lakestream.errors import CorruptLogError
from lakestream.log.actions import WRITER_FEATURE
from lakestream.log.checksum import lines_checksum
from lakestream.log.codec import decode_entry, encode_entry
from lakestream.log.entries import Append, Create, FragmentRef, StreamMeta
from lakestream.log.keys import is_delta_checkpoint_key, log_key, log_version
from lakestream.schema.conform import validate_schema
from lakestream.schema.delta import delta_table_features

UTC = dt.timezone.utc
NTZ = ["timestampNtz"]

# ---------------------------------------------------------------------------------------------
# Reading with deltalake, in a child process


_DELTA_CHILD = """
import base64, json, os, sys
import pyarrow as pa
import deltalake

def ipc(table):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode()

uri, checkpoint = sys.argv[1], sys.argv[2] == "1"
table = deltalake.DeltaTable(uri)
p = table.protocol()
out = {"protocol": [p.min_reader_version, p.min_writer_version, p.reader_features,
                    p.writer_features],
       "table": ipc(table.to_pyarrow_table())}
if checkpoint:
    table.create_checkpoint()
    out["after_checkpoint"] = ipc(deltalake.DeltaTable(uri).to_pyarrow_table())
print(json.dumps(out), flush=True)
os._exit(0)
"""


def delta_read(uri: str, *, checkpoint: bool = False) -> dict[str, Any]:
    """What deltalake sees at ``uri``: ``protocol`` as [reader, writer, reader features,
    writer features], ``table`` (the whole table), and with ``checkpoint`` the table read
    again after ``create_checkpoint()``.

    A child process that leaves with ``os._exit`` does the reading: deltalake 1.x aborts the
    interpreter at exit after a pyarrow read, which would take pytest down with it.
    """
    out = subprocess.run([sys.executable, "-c", _DELTA_CHILD, uri, "1" if checkpoint else "0"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"deltalake failed on {uri}: {out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    for k in ("table", "after_checkpoint"):
        if k in result:
            result[k] = pa.ipc.open_stream(base64.b64decode(result[k])).read_all()
    return result


# ---------------------------------------------------------------------------------------------
# Every column type: (name, Arrow type, two rows of values, the type deltalake reads back)
#
# deltalake reads back in Delta's types, so some columns come back in another Arrow type and
# are compared by value after a cast to it (a safe cast: it fails rather than lose data):
# - large_string, large_binary, large_list and fixed_size_list come back as their 32-bit
#   offset, variable-size forms, and list items are named "element" (the Parquet name);
# - timestamps come back in microseconds (Delta's unit); zoned ones in UTC, the same
#   instants (Delta's timestamp is an instant, the zone name is not kept);
# - decimal256 of at most 38 digits comes back as decimal128.
# A nanosecond timestamp reads back only if its values are whole microseconds: deltalake
# fails the whole read otherwise ("would lose data"), so the values here are whole.


def _list(t: pa.DataType) -> pa.DataType:
    return pa.list_(pa.field("element", t))


_STRUCT = pa.struct([("a", pa.int32()), ("b", pa.string()),
                     ("c", pa.list_(pa.timestamp("us", tz="UTC")))])
_MAP = pa.map_(pa.string(), pa.float64())

COLUMNS: list[tuple[str, pa.DataType, list[Any], pa.DataType | None]] = [
    ("i8", pa.int8(), [-128, None], None),
    ("i16", pa.int16(), [32767, -1], None),
    ("i32", pa.int32(), [-(2**31), None], None),
    ("i64", pa.int64(), [2**63 - 1, -(2**63)], None),
    ("f32", pa.float32(), [1.5, float("-inf")], None),
    ("f64", pa.float64(), [1e-300, None], None),
    ("flag", pa.bool_(), [True, None], None),
    ("text", pa.string(), ["héllo ✓", ""], None),
    ("large_text", pa.large_string(), ["x" * 300, None], pa.string()),
    ("blob", pa.binary(), [b"\x00\xff", None], None),
    ("large_blob", pa.large_binary(), [b"", b"\x01" * 70], pa.binary()),
    ("day", pa.date32(), [dt.date(1969, 12, 31), dt.date(2262, 4, 12)], None),
    ("ts_utc", pa.timestamp("us", tz="UTC"),
     [dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
      dt.datetime(1900, 1, 1, tzinfo=UTC)], None),
    ("ts_naive", pa.timestamp("us"), [dt.datetime(2024, 1, 2, 3, 4, 5, 6), None], None),
    ("ts_ms_tokyo", pa.timestamp("ms", tz="Asia/Tokyo"),
     [dt.datetime(2001, 1, 1, 9, tzinfo=UTC), None], pa.timestamp("us", tz="UTC")),
    ("ts_ns_naive", pa.timestamp("ns"), [dt.datetime(1999, 12, 31, 23, 59, 59, 1), None],
     pa.timestamp("us")),
    ("ts_s_naive", pa.timestamp("s"), [dt.datetime(1970, 1, 1), dt.datetime(1960, 6, 1)],
     pa.timestamp("us")),
    ("dec", pa.decimal128(38, 10),
     [Decimal("-9999999999999999999999999999.9999999999"), Decimal("0.0000000001")], None),
    ("dec256", pa.decimal256(20, 2), [Decimal("123.45"), None], pa.decimal128(20, 2)),
    ("ints", pa.list_(pa.int32()), [[1, None, 3], []], _list(pa.int32())),
    ("words", pa.large_list(pa.string()), [["a", "b"], None], _list(pa.string())),
    ("pair", pa.list_(pa.float32(), 2), [[0.5, -0.5], None], _list(pa.float32())),
    ("record", _STRUCT,
     [{"a": 1, "b": None, "c": [dt.datetime(2020, 5, 5, tzinfo=UTC)]}, None],
     pa.struct([("a", pa.int32()), ("b", pa.string()),
                ("c", _list(pa.timestamp("us", tz="UTC")))])),
    ("scores", _MAP, [[("x", 1.0), ("y", None)], []], None),
]
NAIVE = {"ts_naive", "ts_ns_naive", "ts_s_naive"}


def _schema(columns: list[tuple[str, pa.DataType, list[Any], pa.DataType | None]],
            *, read_back: bool) -> pa.Schema:
    fields = [pa.field("id", pa.int64(), nullable=False)]
    fields += [pa.field(n, (r or t) if read_back else t) for n, t, _, r in columns]
    return pa.schema(fields)


def _table(columns: list[tuple[str, pa.DataType, list[Any], pa.DataType | None]],
           first_id: int) -> pa.Table:
    data: dict[str, Any] = {"id": [first_id, first_id + 1]}
    data.update({n: v for n, _, v, _ in columns})
    return pa.table(data, schema=_schema(columns, read_back=False))


@pytest.mark.parametrize("with_naive, protocol", [
    (True, [3, 7, NTZ, [*NTZ, WRITER_FEATURE]]),
    (False, [1, 7, None, [WRITER_FEATURE]]),
], ids=["naive-timestamps", "zoned-timestamps-only"])
def test_deltalake_reads_back_every_column_type(tmp_path: Path, with_naive: bool,
                                                protocol: list[Any]) -> None:
    columns = [c for c in COLUMNS if with_naive or c[0] not in NAIVE]
    uri = str(tmp_path / "s")
    stream = lakestream.create(uri, _schema(columns, read_back=False), global_batch_size=2,
                               group_size=1)
    written = [_table(columns, 0), _table(columns, 2)]
    for t in written:
        stream.append(t)

    seen = delta_read(uri, checkpoint=True)
    assert seen["protocol"] == protocol
    expected = pa.concat_tables(written).cast(_schema(columns, read_back=True))
    for key in ("table", "after_checkpoint"):
        got = seen[key].sort_by("id")
        assert got.schema == expected.schema, key
        for name in expected.column_names:
            assert got.column(name).to_pylist() == expected.column(name).to_pylist(), name
        assert got.equals(expected), key

    # The checkpoint alone carries the protocol, schema and files: a copy without the JSON
    # entries it covers reads the same (what log retention relies on).
    log = tmp_path / "s" / "_delta_log"
    versions = [is_delta_checkpoint_key(f"_delta_log/{p.name}") for p in log.iterdir()]
    assert [v for v in versions if v is not None] == [2]
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "s", copy)
    for v in range(3):
        os.remove(copy / log_key(v))
    trimmed = delta_read(str(copy))
    assert trimmed["protocol"] == protocol
    assert trimmed["table"].sort_by("id").equals(expected)

    # Lakestream keeps committing after a Delta checkpoint; deltalake reads the new entry on
    # top of it.
    lakestream.open(uri).append(_table(columns, 4))
    assert sorted(delta_read(uri)["table"].column("id").to_pylist()) == list(range(6))


@pytest.mark.parametrize("column", [
    pa.list_(pa.struct([("t", pa.timestamp("us"))])),
    pa.map_(pa.string(), pa.timestamp("ms")),
], ids=["list-of-struct", "map-value"])
def test_a_nested_naive_timestamp_gets_the_feature(tmp_path: Path, column: pa.DataType) -> None:
    uri = str(tmp_path / "s")
    schema = pa.schema([("id", pa.int64()), ("nested", column)])
    stream = lakestream.create(uri, schema, global_batch_size=1)
    value: Any = ([{"t": dt.datetime(2020, 1, 1)}] if pa.types.is_list(column)
                  else [("k", dt.datetime(2020, 1, 1))])
    stream.append(pa.table({"id": [7], "nested": [value]}, schema=schema))
    seen = delta_read(uri)
    assert seen["protocol"] == [3, 7, NTZ, [*NTZ, WRITER_FEATURE]]
    assert seen["table"].column("id").to_pylist() == [7]
    assert seen["table"].column("nested").to_pylist() == [value]


# ---------------------------------------------------------------------------------------------
# Table features and the protocol action


@pytest.mark.parametrize("t, features", [
    (pa.int64(), []),
    (pa.timestamp("us", tz="UTC"), []),
    (pa.timestamp("ns", tz="+01:00"), []),
    (pa.timestamp("us"), NTZ),
    (pa.timestamp("s"), NTZ),
    (pa.list_(pa.timestamp("us")), NTZ),
    (pa.large_list(pa.timestamp("us")), NTZ),
    (pa.list_(pa.timestamp("us"), 3), NTZ),
    (pa.list_(pa.timestamp("us", tz="UTC")), []),
    (pa.struct([("a", pa.int8()), ("b", pa.struct([("t", pa.timestamp("ms"))]))]), NTZ),
    (pa.struct([("a", pa.int8()), ("t", pa.timestamp("ms", tz="UTC"))]), []),
    (pa.map_(pa.timestamp("us"), pa.int8()), NTZ),
    (pa.map_(pa.string(), pa.list_(pa.timestamp("us"))), NTZ),
    (pa.map_(pa.string(), pa.timestamp("us", tz="UTC")), []),
])
def test_table_features_of_a_schema(t: pa.DataType, features: list[str]) -> None:
    assert delta_table_features(pa.schema([("x", pa.int32()), ("y", t)])) == features


def test_features_are_listed_once() -> None:
    schema = pa.schema([("a", pa.timestamp("us")), ("b", pa.list_(pa.timestamp("ns")))])
    assert delta_table_features(schema) == NTZ


def _actions(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().split("\n") if line]


def _protocol(data: bytes) -> dict[str, Any]:
    (body,) = [a["protocol"] for a in _actions(data) if "protocol" in a]
    return dict(body)


def test_the_create_entry_declares_what_the_schema_needs() -> None:
    plain = StreamMeta(pa.schema([("t", pa.timestamp("us", tz="UTC"))]), 1, 1)
    assert _protocol(encode_entry(Create(plain))) == {
        "minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": [WRITER_FEATURE]}
    naive = StreamMeta(pa.schema([("t", pa.list_(pa.timestamp("us")))]), 1, 1)
    data = encode_entry(Create(naive))
    assert _protocol(data) == {"minReaderVersion": 3, "minWriterVersion": 7,
                               "readerFeatures": NTZ, "writerFeatures": [*NTZ, WRITER_FEATURE]}
    decoded = decode_entry(0, data)
    assert isinstance(decoded, Create) and decoded.meta.schema.equals(naive.schema)


def _with_legacy_protocol(data: bytes) -> bytes:
    """``data`` as an older lakestream wrote it: protocol (1, 2) whatever the schema."""
    lines = _actions(data)
    for a in lines:
        if "protocol" in a:
            a["protocol"] = {"minReaderVersion": 1, "minWriterVersion": 2}
    info = lines[0]["commitInfo"]["lakestream"]
    del info["crc32"]
    info["crc32"] = lines_checksum(lines)
    return ("\n".join(json.dumps(a, separators=(",", ":")) for a in lines) + "\n").encode()


def test_streams_created_with_the_legacy_protocol_still_decode() -> None:
    meta = StreamMeta(pa.schema([("t", pa.timestamp("us"))]), 2, 1)
    old = _with_legacy_protocol(encode_entry(Create(meta)))
    assert _protocol(old) == {"minReaderVersion": 1, "minWriterVersion": 2}
    decoded = decode_entry(0, old)
    assert isinstance(decoded, Create) and decoded.meta == meta


# ---------------------------------------------------------------------------------------------
# Types Delta cannot hold are refused when the stream is created


@pytest.mark.parametrize("t, match", [
    (pa.decimal256(39, 0), "precision 1..38"),
    (pa.decimal128(10, -2), "scale 0..precision"),
    (pa.list_(pa.decimal256(50, 5)), "precision 1..38"),
    (pa.struct([]), "a struct needs a field"),
    (pa.uint32(), "no Delta Lake equivalent"),
    (pa.float16(), "no Delta Lake equivalent"),
    (pa.time64("us"), "no Delta Lake equivalent"),
])
def test_types_delta_cannot_hold_are_refused(tmp_path: Path, t: pa.DataType, match: str) -> None:
    schema = pa.schema([("x", t)])
    with pytest.raises(ValueError, match=match):
        validate_schema(schema)
    with pytest.raises(ValueError, match=match):
        lakestream.create(str(tmp_path / "s"), schema, global_batch_size=1)
    assert not (tmp_path / "s" / "_delta_log").exists()


# ---------------------------------------------------------------------------------------------
# Entries are strict JSON


def _append(state: Any) -> Append:
    return Append("p0", 1, (FragmentRef("data/p0/1-0-x.parquet", 4, 100, 0, 0),), state)


@pytest.mark.parametrize("state", [
    float("nan"),
    {"loss": float("inf")},
    {"history": [1.0, -float("inf")]},
])
def test_a_state_with_nan_or_infinity_is_refused(state: Any) -> None:
    with pytest.raises(ValueError, match="entry state holds NaN or Infinity, which is not JSON"):
        encode_entry(_append(state))


def test_a_finite_state_round_trips_as_strict_json() -> None:
    state = {"loss": 0.25, "step": 3, "tags": ["a"], "big": 1e308}
    data = encode_entry(_append(state))
    for line in data.decode().split("\n")[:-1]:
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON token {c}"))
    decoded = decode_entry(1, data)
    assert isinstance(decoded, Append) and decoded.state == state


def test_every_line_of_an_append_is_the_compact_json_of_what_it_parses_to() -> None:
    """The checksum covers each line as compact JSON, and the add lines are formatted
    directly: they must be exactly what serialising their parsed values gives."""
    refs = tuple(FragmentRef(f"data/p-0.x_Y/2-{k}-{k:06d}b.parquet", k + 1, 10 * k + 7,
                             100 * k, k, -1 if k == 0 else 2**32 - k) for k in range(3))
    data = encode_entry(Append("p-0.x_Y", 2, refs, {"k": [1, "é", 0.5]}))
    lines = data.decode().split("\n")
    assert lines[-1] == "" and len(lines) == 1 + 3 + 1 + 1  # commitInfo, adds, txn
    for line in lines[:-1]:
        assert json.dumps(json.loads(line), separators=(",", ":")) == line
    adds = [json.loads(line)["add"] for line in lines[1:4]]
    assert [a["stats"] for a in adds] == [json.dumps({"numRecords": f.rows}) for f in refs]
    assert [a["tags"]["lakestream.crc32"] for a in adds] == [str(f.crc32) for f in refs]
    decoded = decode_entry(1, data)
    assert isinstance(decoded, Append) and decoded.fragments == refs


def test_an_append_is_serialised_once_and_checked_without_serialising_it_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Encoding and decoding an append sit in a commit's race window: serialising each add
    twice and again to check it made a 680-fragment commit's window several times wider."""
    import lakestream.log.checksum as checksum
    import lakestream.log.codec as log

    refs = tuple(FragmentRef(f"data/p0/1-{k}-x.parquet", 4, 100, 4 * k, k) for k in range(500))
    dumps, calls = json.dumps, [0]

    def counting(*args: Any, **kwargs: Any) -> str:
        calls[0] += 1
        return dumps(*args, **kwargs)

    monkeypatch.setattr(log.json, "dumps", counting)
    data = encode_entry(Append("p0", 1, refs, None))
    assert calls[0] <= len(refs) + 10  # a path each, and a few lines
    monkeypatch.setattr(checksum, "lines_checksum", lambda lines: pytest.fail("serialised again"))
    assert decode_entry(1, data).fragments == refs  # type: ignore[union-attr]


def test_an_entry_laid_out_by_another_writer_is_checked_line_by_line() -> None:
    """Bytes laid out otherwise than encode_entry lays them out (spaces after separators)
    are checked by serialising their lines again; a damaged entry is refused either way,
    and so are two values on one line."""
    data = encode_entry(_append({"a": 1}))
    spaced = ("\n".join(json.dumps(a) for a in _actions(data)) + "\n").encode()
    assert spaced != data and decode_entry(1, spaced) == decode_entry(1, data)
    for damaged in (data.replace(b'"size":100', b'"size":101'),
                    spaced.replace(b'"size": 100', b'"size": 101')):
        with pytest.raises(CorruptLogError, match="checksum"):
            decode_entry(1, damaged)
    first, rest = data.split(b"\n", 1)
    with pytest.raises(CorruptLogError, match="cannot be read"):
        decode_entry(1, first + b"," + rest)
    # The same values with a line break moved into an object: not JSON lines, though the
    # lines joined as one array would parse to the entry and its checksum.
    moved = first + b"," + rest.replace(b',"partitionValues"', b'\n"partitionValues"', 1)
    assert len(moved) == len(data)
    with pytest.raises(CorruptLogError, match="cannot be read"):
        decode_entry(1, moved)


def test_every_path_checksums_the_same_bytes_with_one_function(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing an entry, reading it as written and reading it laid out otherwise all take
    its checksum from ``entry_checksum``, over the same bytes: the entry's lines as compact
    JSON, the checksum cut from the first."""
    import lakestream.log.checksum as codec

    seen: list[tuple[bytes, bytes]] = []
    real = codec.entry_checksum

    def recorded(first: bytes, rest: bytes) -> int:
        seen.append((bytes(first), bytes(rest)))
        return real(first, rest)

    monkeypatch.setattr(codec, "entry_checksum", recorded)
    refs = tuple(FragmentRef(f"data/p0/1-{k}-x.parquet", 4, 100, 4 * k, k, 7 * k) for k in range(3))
    data = encode_entry(Append("p0", 1, refs, {"cursor": [1, "é", 0.25]}))
    spaced = ("\n".join(json.dumps(a) for a in _actions(data)) + "\n").encode()
    assert decode_entry(1, data) == decode_entry(1, spaced)
    assert len(seen) == 3 and seen[0] == seen[1] == seen[2]
    first, rest = seen[0]
    assert b'"crc32"' not in first
    assert first + rest + b"\n" == data.replace(b',"crc32":%d}}}' % real(first, rest), b"}}}", 1)


def test_an_old_entry_with_nan_state_still_decodes() -> None:
    # Written before the check: reading it must not fail, or the stream would not open.
    lines = _actions(encode_entry(_append(0.0)))
    info = lines[0]["commitInfo"]["lakestream"]
    del info["crc32"]
    info["state"] = float("nan")
    info["crc32"] = lines_checksum(lines)
    data = ("\n".join(json.dumps(a, separators=(",", ":")) for a in lines) + "\n").encode()
    assert b"NaN" in data
    decoded = decode_entry(1, data)
    assert isinstance(decoded, Append) and decoded.state != decoded.state  # NaN


def test_verify_flags_an_old_entry_delta_readers_cannot_parse(tmp_path: Path) -> None:
    from lakestream.ops.verify import verify

    s = lakestream.create(str(tmp_path / "s"), pa.schema([("id", pa.int64())]),
                          global_batch_size=1)
    s.append({"id": [1]})
    lines = _actions(s.store.get(log_key(1)))
    info = lines[0]["commitInfo"]["lakestream"]
    del info["crc32"]
    info["state"] = float("nan")
    info["crc32"] = lines_checksum(lines)
    s.store.put(log_key(1), ("\n".join(json.dumps(a) for a in lines) + "\n").encode())
    problems = verify(s.store).problems
    assert len(problems) == 1 and "log version 1 holds NaN" in problems[0]
    assert lakestream.open(s.uri).num_samples == 1  # still readable here


_FOREIGN_APPEND = """
import os, sys
import pyarrow as pa
import deltalake
try:
    deltalake.write_deltalake(sys.argv[1], pa.table({"id": [7]}), mode="append")
    print("appended", flush=True)
except Exception as e:
    print(f"refused: {e}", flush=True)
os._exit(0)
"""


def _foreign_append(uri: str) -> str:
    out = subprocess.run([sys.executable, "-c", _FOREIGN_APPEND, uri], capture_output=True,
                         text=True, timeout=120)
    return out.stdout.strip()


def test_other_delta_writers_are_kept_out_and_named(tmp_path: Path) -> None:
    """A stream declares a writer feature other Delta writers do not know, so delta-rs
    refuses to append (and the stream is unchanged); on a stream created before it, the
    foreign commit is named for what it is, not taken for a truncated entry."""
    schema = pa.schema([("id", pa.int64())])
    s = lakestream.create(str(tmp_path / "s"), schema, global_batch_size=1)
    s.append({"id": [1]})
    files = sorted(p.name for p in (tmp_path / "s").rglob("*"))
    refused = _foreign_append(s.uri)
    assert refused.startswith("refused") and "lakestreamLog" in refused
    assert sorted(p.name for p in (tmp_path / "s").rglob("*")) == files
    assert lakestream.open(s.uri).num_samples == 1

    old = lakestream.create(str(tmp_path / "old"), schema, global_batch_size=1)
    old.store.put(log_key(0), _with_legacy_protocol(old.store.get(log_key(0))))
    assert _foreign_append(old.uri) == "appended"
    with pytest.raises(CorruptLogError, match=r"log version 1 was committed by delta-rs.*not by "
                                              r"Lakestream"):
        lakestream.open(old.uri)


# ---------------------------------------------------------------------------------------------
# Log keys


@pytest.mark.parametrize("version", [0, 42, 10**19, 10**20 - 1])
def test_log_version_inverts_log_key(version: int) -> None:
    assert log_version(log_key(version)) == version


@pytest.mark.parametrize("key", [
    "_delta_log/00000000000000000010.checkpoint.parquet",
    "_delta_log/00000000000000000010.checkpoint.0000000001.0000000002.parquet",
    "_delta_log/_last_checkpoint",
    "_delta_log/00000000000000000010.crc",
    "_delta_log/00000000000000000001.00000000000000000009.compacted.json",
    "_delta_log/_staged_commits/00000000000000000001.3a0d65cd-4d5e-4f26-9e6c.json",
    "_delta_log/.00000000000000000010.json.tmp",
    "_delta_log/00000000000000000010.json.tmp",
    "_delta_log/0000000000000000010.json",
    "_delta_log/000000000000000000010.json",
    "_delta_log/-0000000000000000010.json",
    "_delta_log/0000000000000000001٣.json",
    "00000000000000000010.json",
    "x/_delta_log/00000000000000000010.json",
    "_lakestream/snapshots/00000000000000000010.json",
    "",
])
def test_log_version_refuses_other_keys(key: str) -> None:
    with pytest.raises(ValueError, match="not a log entry key"):
        log_version(key)


@pytest.mark.parametrize("key, version", [
    ("_delta_log/00000000000000000010.checkpoint.parquet", 10),
    ("_delta_log/00000000000000000000.checkpoint.parquet", 0),
    ("_delta_log/00000000000000000123.checkpoint.0000000001.0000000002.parquet", 123),
    ("_delta_log/00000000000000000123.checkpoint.0000000002.0000000002.parquet", 123),
    ("_delta_log/00000000000000000123.checkpoint.0000000000.0000000002.parquet", None),
    ("_delta_log/00000000000000000123.checkpoint.0000000003.0000000002.parquet", None),
    ("_delta_log/00000000000000000123.checkpoint.001.002.parquet", None),
    ("_delta_log/00000000000000000010.checkpoint."
     "80a083e8-7026-4e79-81be-64bd76c43a11.parquet", None),
    ("_delta_log/00000000000000000010.checkpoint.parquet.tmp", None),
    ("_delta_log/00000000000000000010.json", None),
    ("_delta_log/_last_checkpoint", None),
    ("_delta_log/10.checkpoint.parquet", None),
    ("other/00000000000000000010.checkpoint.parquet", None),
])
def test_is_delta_checkpoint_key(key: str, version: int | None) -> None:
    assert is_delta_checkpoint_key(key) == version


def test_a_damaged_create_is_still_caught() -> None:
    # The protocol line is covered by the checksum like any other.
    meta = StreamMeta(pa.schema([("t", pa.timestamp("us"))]), 1, 1)
    data = encode_entry(Create(meta)).replace(b'"minReaderVersion":3', b'"minReaderVersion":1')
    with pytest.raises(CorruptLogError, match="checksum"):
        decode_entry(0, data)
