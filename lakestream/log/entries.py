"""Log entries: frozen records written as Delta Lake actions, one JSON file per version."""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from zlib_ng import zlib_ng

from lakestream.errors import CorruptLogError
from lakestream.schema.conform import (
    decode_schema,
    delta_schema_string,
    delta_table_features,
    encode_schema,
)
from lakestream.store.base import check_key
from lakestream.store.parse import MAX_INT, count

FORMAT_VERSION = 1
GROUP_ENTRY_FORMAT = 2
"""The format of ``register`` and ``remove_group`` entries: a lakestream from before them
reads format 1 only, so it stops at one with "upgrade lakestream", not "corrupt"."""
SEAL_ENTRY_FORMAT = 3
"""The format of ``seal`` entries, for the same reason: an older reader would take appends
after the seal as valid."""
COMPACTED_ENTRY_FORMAT = 4
"""The format of the tombstones gc leaves in place of compacted entries: a lakestream from
before them stops at one with "upgrade lakestream"."""
TOMBSTONE_TTL_S = 3600.0
"""gc deletes a tombstone only once it is this old by the store's clock, so a version it
compacted stays taken for at least this long after the entry there was written."""
REOPEN_IDLE_S = TOMBSTONE_TTL_S / 4
"""A handle whose view no read has confirmed at the log's head for this long reopens from
the newest snapshot before it reads the log or commits: the tombstone after its view may
be gone by then."""
MAX_ENTRY_BYTES = 32 << 20
"""The largest log entry written or read: 10,000 fragments (a commit's most) take ~5 MB, a
producer's state the rest. A larger one is refused as damage, so no entry costs an opener
more than this in time and memory."""
MAX_CHECKPOINT_ID = 4096
MAX_STATE_BYTES = 1 << 20
"""A producer's state (a prompt cursor, say) is at most this much JSON."""
LOG_DIR = "_delta_log/"
DATA_DIR = "data/"
_PLAIN_DATA_KEY = re.compile(r"data/(?:[A-Za-z0-9_-][A-Za-z0-9._-]*/)+[A-Za-z0-9_-][A-Za-z0-9._-]*"
                             r"\.parquet")
"""Keys check_data_key accepts without a closer look: ASCII names that cannot be '.' or '..'
(none starts with a dot)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Producer ids and consumer group names: they name folders and objects."""
# [0-9], not \d: \d also matches non-ASCII digits, which int() would accept.
_LOG_ENTRY = re.compile(r"_delta_log/([0-9]{20})\.json")
_CHECKPOINT = re.compile(
    r"_delta_log/([0-9]{20})\.checkpoint(?:\.([0-9]{10})\.([0-9]{10}))?\.parquet")


def log_key(version: int) -> str:
    return f"{LOG_DIR}{version:020d}.json"


def log_version(key: str) -> int:
    """The version of a log entry key, ``_delta_log/<20-digit version>.json``.

    Raises:
        ValueError: ``key`` is anything else under (or outside) the log: a Delta checkpoint,
            ``_last_checkpoint``, a ``.crc`` file, a compacted log file, a temporary file.
    """
    m = _LOG_ENTRY.fullmatch(key)
    if m is None:
        raise ValueError(f"{key!r} is not a log entry key ({LOG_DIR}<20-digit version>.json)")
    return int(m.group(1))


def is_delta_checkpoint_key(key: str) -> int | None:
    """The version of a Delta checkpoint file, or None if ``key`` is not one.

    Matches classic checkpoints, ``_delta_log/<version>.checkpoint.parquet``, and parts of
    multi-part ones, ``_delta_log/<version>.checkpoint.<part>.<parts>.parquet``. A multi-part
    checkpoint is usable only once all its parts exist: the caller checks that. UUID-named
    (v2) checkpoints are not matched: they are valid only in tables declaring the
    ``v2Checkpoint`` feature, which streams do not, so counting one could drop log entries
    that readers still need.
    """
    m = _CHECKPOINT.fullmatch(key)
    if m is None:
        return None
    if m.group(2) is not None and not 1 <= int(m.group(2)) <= int(m.group(3)):
        return None  # part 0, or part 3 of 2: no writer produces that
    return int(m.group(1))


def new_commit_id() -> str:
    return uuid.uuid4().hex


def check_producer_id(producer_id: str) -> str:
    """Returns ``producer_id`` if it can name a folder of the stream.

    Raises:
        ValueError: not 1-128 characters of letters, digits, ``.``, ``_``, ``-``, starting
            with a letter or digit.
    """
    if not isinstance(producer_id, str) or not _NAME.fullmatch(producer_id):
        raise ValueError(
            f"producer id {producer_id!r} is not valid: use 1-128 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit"
        )
    return producer_id


def valid_group(group: object) -> bool:
    """Whether ``group`` can name a consumer group (see ``check_group``)."""
    return isinstance(group, str) and _NAME.fullmatch(group) is not None


def check_group(group: str) -> str:
    """Returns ``group`` if it can name a consumer group.

    Raises:
        ValueError: not 1-128 letters, digits, '.', '_' or '-', starting with a letter or
            digit.
    """
    if not valid_group(group):
        raise ValueError(f"consumer group {group!r} is not valid: use 1-128 letters, digits, "
                         "'.', '_' or '-', starting with a letter or digit")
    return group


def check_data_key(key: str) -> str:
    """A fragment key must be a safe key under ``data/``.

    Raises:
        ValueError: it is not.
    """
    if type(key) is str and _PLAIN_DATA_KEY.fullmatch(key):
        return key  # what producers write: the full check would pass, at a fifth the cost
    check_key(key)
    if not key.startswith(DATA_DIR) or not key.endswith(".parquet"):
        raise ValueError(f"fragment key {key!r} is not a .parquet file under {DATA_DIR}")
    return key


@dataclass(frozen=True)
class StreamMeta:
    """What version 0 fixes for the life of the stream."""

    schema: pa.Schema
    global_batch_size: int
    group_size: int
    snapshot_interval: int = 100
    table_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    created_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def __post_init__(self) -> None:
        b, g = self.global_batch_size, self.group_size
        if not isinstance(b, int) or b < 1:
            raise ValueError(f"global_batch_size must be a positive int, got {b!r}")
        if not isinstance(g, int) or g < 1 or b % g:
            raise ValueError(f"group_size must be a positive int dividing {b}, got {g!r}")
        k = self.snapshot_interval
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"snapshot_interval must be a positive int, got {k!r}")

    def configuration(self) -> dict[str, str]:
        return {
            "lakestream.globalBatchSize": str(self.global_batch_size),
            "lakestream.groupSize": str(self.group_size),
            "lakestream.formatVersion": str(FORMAT_VERSION),
            "lakestream.snapshotInterval": str(self.snapshot_interval),
            "lakestream.arrowSchema": encode_schema(self.schema),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.table_id,
            "format": {"provider": "parquet", "options": {}},
            "schemaString": delta_schema_string(self.schema),
            "partitionColumns": [],
            "configuration": self.configuration(),
            "createdTime": self.created_ms,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StreamMeta:
        conf = d["configuration"]
        fmt = count(conf.get("lakestream.formatVersion", -1), "format version", low=-1)
        if fmt < 1 or fmt > FORMAT_VERSION:
            raise CorruptLogError(
                f"stream format version {fmt} is not supported by this lakestream "
                f"(it reads 1..{FORMAT_VERSION}); upgrade lakestream"
            )
        return cls(
            schema=decode_schema(conf["lakestream.arrowSchema"]),
            global_batch_size=count(conf["lakestream.globalBatchSize"], "global batch size",
                                    low=1),
            group_size=count(conf["lakestream.groupSize"], "group size", low=1),
            snapshot_interval=count(conf.get("lakestream.snapshotInterval", 100),
                                    "snapshot interval", low=1),
            table_id=d["id"],
            created_ms=count(d.get("createdTime", 0), "createdTime"),
        )


@dataclass(frozen=True)
class FragmentRef:
    """One Parquet file an append adds (or a reclaim removes)."""

    path: str
    rows: int
    size: int
    offset: int
    seq: int
    crc32: int = -1
    """CRC-32 of the whole file (-1: not recorded)."""


@dataclass(frozen=True)
class Create:
    meta: StreamMeta
    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class Append:
    """Fragments from one producer epoch; ``producer=None`` is a plain, unfenced append."""

    producer: str | None
    epoch: int
    fragments: tuple[FragmentRef, ...]
    state: Any = None
    commit_id: str = field(default_factory=new_commit_id)

    @property
    def first_seq(self) -> int:
        return self.fragments[0].seq

    @property
    def last_seq(self) -> int:
        return self.fragments[-1].seq

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.fragments)


@dataclass(frozen=True)
class Fence:
    producer: str
    epoch: int
    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class Checkpoint:
    """Group ``group`` has a durable training checkpoint that resumes at ``step``."""

    group: str
    step: int
    checkpoint_id: str | None = None
    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class Register:
    """Consumer group ``group`` exists and holds retention from ``step`` until its markers
    take over (a registered group with no marker holds every step from ``step`` on)."""

    group: str
    step: int
    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class RemoveGroup:
    """Consumer group ``group`` is gone: its markers and registration stop holding data."""

    group: str
    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class Seal:
    """No more appends: every append after this entry is void."""

    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class Reclaim:
    below_offset: int
    removed: tuple[FragmentRef, ...]
    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class Compacted:
    """A tombstone: gc compacted the entry at this version away, and left this in its place
    so that the version stays taken (a put-if-absent from an old view fails there, and a
    read from one learns that it must reopen). Replay never folds it in."""

    snapshot: int
    """The newest snapshot when gc compacted the entry: a reader reopens from it or later."""
    replaced: str | None
    """The commit id of the entry it replaced (None if that entry could not be read): a
    committer whose put had an unknown outcome learns from it whether the entry was its own."""
    commit_id: str = field(default_factory=new_commit_id)


Entry = Create | Append | Fence | Checkpoint | Register | RemoveGroup | Seal | Reclaim | Compacted


def _dump(action: dict[str, Any]) -> str:
    """One line of an entry: compact JSON (NaN refused, so that every line is JSON)."""
    return json.dumps(action, separators=(",", ":"), allow_nan=False)


def _add_line(f: FragmentRef, now_ms: int) -> str:
    """The add action of ``f`` as one line, formatted directly rather than built as a dict
    and serialised (an append carries hundreds); it is exactly ``_dump`` of that dict::

        {"add": {"path": ..., "partitionValues": {}, "size": ..., "modificationTime": ...,
                 "dataChange": true, "stats": "{\\"numRecords\\": <rows>}",
                 "tags": {"lakestream.offset": "<offset>", "lakestream.rows": "<rows>",
                          "lakestream.seq": "<seq>", "lakestream.crc32": "<crc32>"}}}
    """
    return (f'{{"add":{{"path":{json.dumps(f.path)},"partitionValues":{{}},"size":{int(f.size)},'
            f'"modificationTime":{int(now_ms)},"dataChange":true,'
            f'"stats":"{{\\"numRecords\\": {int(f.rows)}}}",'
            f'"tags":{{"lakestream.offset":"{int(f.offset)}","lakestream.rows":"{int(f.rows)}",'
            f'"lakestream.seq":"{int(f.seq)}","lakestream.crc32":"{int(f.crc32)}"}}}}}}')


def _tags(f: FragmentRef) -> dict[str, str]:
    return {"lakestream.offset": str(f.offset), "lakestream.rows": str(f.rows),
            "lakestream.seq": str(f.seq), "lakestream.crc32": str(f.crc32)}


def _remove(f: FragmentRef, now_ms: int) -> dict[str, Any]:
    return {"remove": {
        "path": f.path,
        "deletionTimestamp": now_ms,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {},
        "size": f.size,
        "tags": _tags(f),
    }}


WRITER_FEATURE = "lakestreamLog"
"""A writer feature no other Delta writer knows: the protocol says that writers which do
not support every writer feature must not write, so delta-rs, Spark and others refuse to
append to a stream (their commits would break replay), while readers, who check reader
features only, read it as any table."""


def delta_protocol(schema: pa.Schema) -> dict[str, Any]:
    """The body of the ``protocol`` action of a stream with this schema.

    Writer version 7 with ``WRITER_FEATURE`` keeps other Delta writers out. Readers see
    reader version 1 when the schema needs no table feature (more Delta readers accept it),
    else reader version 3 naming exactly the features needed, as readers refuse e.g.
    ``timestamp_ntz`` columns without them.
    """
    features = delta_table_features(schema)
    reader: dict[str, Any] = {"minReaderVersion": 3, "readerFeatures": features} if features \
        else {"minReaderVersion": 1}
    return {"minReaderVersion": reader["minReaderVersion"], "minWriterVersion": 7,
            **({"readerFeatures": features} if features else {}),
            "writerFeatures": [*features, WRITER_FEATURE]}


def _non_string_key(value: Any, path: str) -> str | None:
    """Where ``value`` holds a dict key that is not a string, or None."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{path}[{k!r}]"
            found = _non_string_key(v, f"{path}[{k!r}]")
            if found:
                return found
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            found = _non_string_key(v, f"{path}[{i}]")
            if found:
                return found
    return None


def check_state(state: Any) -> None:
    """Checks that ``state`` can be an entry's state: strict JSON that reads back as written.

    Raises:
        ValueError: it holds NaN or Infinity; Python's json writes those tokens, but they
            are not JSON and other Delta readers reject the entry.
        TypeError: it is not JSON-serialisable at all, or a dict key is not a string (JSON
            would hand ``{1: "a"}`` back as ``{"1": "a"}``).
    """
    where = _non_string_key(state, "state")
    if where is not None:
        raise TypeError(f"entry state key at {where} is not a string: JSON keys are strings, "
                        "so it would come back changed after a restart; use string keys")
    try:
        size = len(json.dumps(state, allow_nan=False))
    except ValueError as e:
        raise ValueError(
            f"entry state holds NaN or Infinity, which is not JSON ({e}); Delta readers "
            "would reject the log entry: replace them (with None or a string, say) before "
            "committing"
        ) from None
    except TypeError as e:
        raise TypeError(f"entry state must be JSON-serialisable: {e}") from None
    except RecursionError:
        raise ValueError("entry state is nested too deeply to be JSON") from None
    if size > MAX_STATE_BYTES:
        raise ValueError(f"entry state is {size:,} bytes of JSON, over {MAX_STATE_BYTES:,}: "
                         "keep a cursor in it, not data")


def encode_entry(entry: Entry) -> bytes:
    """The Delta Lake JSON lines of an entry.

    Raises:
        ValueError: an append's ``state`` holds NaN or Infinity (not JSON).
    """
    now = int(time.time() * 1000)
    fmt = GROUP_ENTRY_FORMAT if isinstance(entry, Register | RemoveGroup) \
        else SEAL_ENTRY_FORMAT if isinstance(entry, Seal) \
        else COMPACTED_ENTRY_FORMAT if isinstance(entry, Compacted) else FORMAT_VERSION
    info: dict[str, Any] = {"format": fmt, "commit_id": entry.commit_id}
    actions: list[dict[str, Any]] = []
    lines: list[str] = []
    operation, params = "WRITE", {"mode": "Append"}
    if isinstance(entry, Create):
        info["op"] = "create"
        operation, params = "CREATE TABLE", {"mode": "ErrorIfExists"}
        actions = [{"protocol": delta_protocol(entry.meta.schema)},
                   {"metaData": entry.meta.to_json()}]
    elif isinstance(entry, Append):
        check_state(entry.state)
        info.update(op="append", producer=entry.producer, epoch=entry.epoch,
                    seq=[entry.first_seq, entry.last_seq], state=entry.state)
        lines = [_add_line(f, now) for f in entry.fragments]
        if entry.producer is not None:
            lines.append(_dump({"txn": {"appId": entry.producer, "version": entry.last_seq,
                                        "lastUpdated": now}}))
    elif isinstance(entry, Fence):
        info.update(op="fence", producer=entry.producer, epoch=entry.epoch)
        operation, params = "SET TBLPROPERTIES", {}
    elif isinstance(entry, Checkpoint):
        info.update(op="checkpoint", group=entry.group, step=entry.step,
                    checkpoint_id=entry.checkpoint_id)
        operation, params = "SET TBLPROPERTIES", {}
    elif isinstance(entry, Register):
        info.update(op="register", group=entry.group, step=entry.step)
        operation, params = "SET TBLPROPERTIES", {}
    elif isinstance(entry, RemoveGroup):
        info.update(op="remove_group", group=entry.group)
        operation, params = "SET TBLPROPERTIES", {}
    elif isinstance(entry, Seal):
        info["op"] = "seal"
        operation, params = "SET TBLPROPERTIES", {}
    elif isinstance(entry, Reclaim):
        info.update(op="reclaim", below_offset=entry.below_offset)
        operation, params = "DELETE", {"predicate": f"offset < {entry.below_offset}"}
        actions = [_remove(f, now) for f in entry.removed]
    elif isinstance(entry, Compacted):
        info.update(op="compacted", snapshot=entry.snapshot, replaced=entry.replaced)
        operation, params = "SET TBLPROPERTIES", {}
    else:  # pragma: no cover - the union is closed
        raise TypeError(f"not a log entry: {entry!r}")
    commit_info = {"commitInfo": {"timestamp": now, "operation": operation,
                                  "operationParameters": params, "lakestream": info}}
    lines += [_dump(a) for a in actions]
    # Each line is serialised once: the checksum covers the commitInfo line without it, then
    # the action lines as they are written (``entry_checksum`` of the same lines), and goes
    # in as the last key of ``lakestream``, the last object of the line: the tail that
    # ``_as_written`` cuts. allow_nan=False as a backstop: only the state holds floats.
    head, body = _dump(commit_info), "".join("\n" + line for line in lines)
    crc = zlib_ng.crc32((head + body).encode())
    data = (head[:-3] + f',"crc32":{crc}}}}}}}' + body + "\n").encode()
    if len(data) > MAX_ENTRY_BYTES:
        raise ValueError(f"the entry is {len(data):,} bytes, over {MAX_ENTRY_BYTES:,}: commit "
                         "fewer fragments at a time")
    return data


def _parse_lines(data: bytes, as_written: bool) -> list[Any]:
    """The JSON values of the lines of ``data``, blank lines skipped. Bytes laid out as
    ``encode_entry`` writes them (``as_written``) are parsed as one JSON array, an append
    having hundreds of lines; any others line by line, so that a line that is not one JSON
    value is refused as other Delta readers refuse it."""
    if as_written:
        values = json.loads(b"[" + data[:-1].replace(b"\n", b",") + b"]")
        if len(values) == data.count(b"\n"):  # a value a line
            return values
    # Split on "\n" alone, as Delta readers do: splitlines() also splits on \v, \f, \x1c...
    return [json.loads(line) for line in data.decode("utf-8").split("\n") if line.strip()]


_CRC_TAIL = re.compile(rb',"crc32":(0|[1-9][0-9]{0,9})\}\}\}\Z')


def _as_written(data: bytes) -> int | None:
    """The checksum of ``data`` if it is byte for byte as ``encode_entry`` writes it (the
    CRC-32 at the end of its first line matches the raw lines with it cut out), else None:
    checking the raw bytes saves serialising every line again (``entry_checksum``)."""
    first = data.find(b"\n")
    if first < 0 or not data.endswith(b"\n"):
        return None
    tail = _CRC_TAIL.search(data[:first])
    if tail is None:
        return None
    stored = int(tail.group(1))
    crc = zlib_ng.crc32(data[:first - len(tail.group(0))] + b"}}}")
    return stored if zlib_ng.crc32(data[first:-1], crc) == stored else None


def entry_checksum(lines: list[dict[str, Any]]) -> int:
    """CRC-32 of an entry's lines, compactly serialised, without the checksum itself: a
    damaged entry that still parses is caught (object stores check transfers, not rot)."""
    return zlib_ng.crc32("\n".join(json.dumps(a, separators=(",", ":")) for a in lines).encode())


def _fragment(action: dict[str, Any], version: int) -> FragmentRef:
    tags = action.get("tags") or {}
    crc = tags.get("lakestream.crc32", -1)
    ref = FragmentRef(
        path=action["path"],
        rows=count(tags["lakestream.rows"], "rows"),
        size=count(action["size"], "size"),
        offset=count(tags["lakestream.offset"], "offset"),
        seq=count(tags["lakestream.seq"], "seq", low=-MAX_INT),
        crc32=count(crc, "crc32", low=-1),
    )
    try:
        check_data_key(ref.path)
    except ValueError as e:
        raise CorruptLogError(f"log version {version}: {e}") from None
    return ref


def _foreign(version: int, info: dict[str, Any]) -> str:
    engine = info.get("engineInfo") or info.get("clientVersion")
    return (f"log version {version} was committed by {engine} ({info.get('operation', '?')}), "
            "not by Lakestream: other Delta writers may read a stream but not write to it, "
            f"and replay cannot place their files in the global order. Streams created now "
            f"declare the writer feature {WRITER_FEATURE!r}, which keeps such writers out; "
            "for this one, remove that version's file (its data files stay orphans for gc) "
            "and append the data through Lakestream")


def decode_entry(version: int, data: bytes) -> Entry:
    """Parses the JSON lines of log version ``version``.

    Raises:
        CorruptLogError: the text is not JSON lines, is not a Lakestream entry, has an unknown
            format version, or names an unsafe key; the message names the version.
    """
    try:
        as_written = _as_written(data)
        try:
            actions = _parse_lines(data, as_written is not None)
        except ValueError:
            if not data.endswith(b"\n"):
                raise ValueError("it does not end with a newline: it is truncated") from None
            raise
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for a in actions:
            if not isinstance(a, dict) or len(a) != 1:
                raise ValueError(f"not a Delta action: {str(a)[:80]}")
            (kind, body), = a.items()
            by_kind.setdefault(kind, []).append(body)
        infos = by_kind.get("commitInfo", [])
        if len(infos) != 1 or not isinstance(infos[0].get("lakestream"), dict):
            if len(infos) == 1 and ("engineInfo" in infos[0] or "clientVersion" in infos[0]):
                raise CorruptLogError(_foreign(version, infos[0]))
            raise ValueError("no commitInfo.lakestream: not written by Lakestream")
        if not data.endswith(b"\n"):
            raise ValueError("it does not end with a newline: it is truncated")
        info = infos[0]["lakestream"]
        stored = info.pop("crc32", None)
        if (stored != as_written if as_written is not None
                else stored != entry_checksum(actions)):
            raise ValueError(f"checksum {stored!r} does not match the content "
                             f"({entry_checksum(actions)}): the entry is damaged")
        fmt = info.get("format")
        if fmt not in (FORMAT_VERSION, GROUP_ENTRY_FORMAT, SEAL_ENTRY_FORMAT,
                       COMPACTED_ENTRY_FORMAT):
            raise CorruptLogError(
                f"log version {version} has format version {fmt!r}; this lakestream reads "
                f"{FORMAT_VERSION}-{COMPACTED_ENTRY_FORMAT}: upgrade lakestream or check the "
                "writer"
            )
        op, cid = info["op"], str(info["commit_id"])
        if op == "create":
            if version != 0:
                raise ValueError("a create entry past version 0")
            return Create(StreamMeta.from_json(by_kind["metaData"][0]), cid)
        if "group" in info and not isinstance(info["group"], str):
            raise ValueError(f"group {str(info['group'])[:40]!r} is not a string")
        if op == "append":
            frags = tuple(_fragment(a, version) for a in by_kind.get("add", []))
            if not frags:
                raise ValueError("an append with no add actions")
            seqs = [f.seq for f in frags]
            if info["seq"] != [seqs[0], seqs[-1]]:
                raise ValueError(f"seq range {info['seq']} disagrees with the adds {seqs}")
            producer = info["producer"]
            if producer is not None:
                check_producer_id(producer)
            epoch = count(info["epoch"], "epoch", low=-MAX_INT)
            return Append(producer, epoch, frags, info.get("state"), cid)
        if op == "fence":
            epoch = count(info["epoch"], "epoch", low=-MAX_INT)
            return Fence(check_producer_id(info["producer"]), epoch, cid)
        if op == "checkpoint":
            return Checkpoint(info["group"], count(info["step"], "step"),
                              _checkpoint_id(info.get("checkpoint_id")), cid)
        if op == "register":
            return Register(info["group"], count(info["step"], "step"), cid)
        if op == "remove_group":
            return RemoveGroup(info["group"], cid)
        if op == "seal":
            return Seal(cid)
        if op == "reclaim":
            removed = tuple(_fragment(a, version) for a in by_kind.get("remove", []))
            return Reclaim(count(info["below_offset"], "below_offset"), removed, cid)
        if op == "compacted":
            replaced = info.get("replaced")
            return Compacted(count(info["snapshot"], "snapshot"),
                             None if replaced is None else str(replaced), cid)
        raise ValueError(f"unknown operation {op!r}")
    except CorruptLogError:
        raise
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, IndexError,
            RecursionError) as e:
        problem = "its JSON is nested too deeply" if isinstance(e, RecursionError) else e
        raise CorruptLogError(f"log version {version} cannot be read: {problem}") from None


def _checkpoint_id(value: Any) -> str | None:
    """A marker's checkpoint id: None or a string of at most ``MAX_CHECKPOINT_ID``
    characters. It is data that names a location: the loaders decide whether to open it
    (``lakestream.loaders.locations``), and terminals get it escaped."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_CHECKPOINT_ID:
        raise ValueError(f"checkpoint id {str(value)[:80]!r} is not a string of at most "
                         f"{MAX_CHECKPOINT_ID} characters")
    return value
