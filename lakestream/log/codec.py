"""Log entries as Delta Lake JSON lines: encoding an entry, and decoding (and checking) the
bytes of one, its checksum included."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import lakestream.log.checksum as checksum
from lakestream.errors import CorruptLogError
from lakestream.log.actions import (
    VOID_TAG,
    WRITER_FEATURE,
    add_line,
    delta_protocol,
    dump_line,
    remove_action,
)
from lakestream.log.entries import (
    CHAINED_ENTRY_FORMAT,
    COMPACTED_ENTRY_FORMAT,
    DIGEST_CHARS,
    FORMAT_VERSION,
    GROUP_ENTRY_FORMAT,
    MAX_CHECKPOINT_ID,
    MAX_ENTRY_BYTES,
    MAX_FRAGMENTS_PER_ENTRY,
    MAX_INFO_BYTES,
    SEAL_ENTRY_FORMAT,
    SHARED_ENTRY_FORMAT,
    Append,
    Checkpoint,
    Compacted,
    Create,
    Entry,
    Fence,
    FragmentRef,
    Link,
    Reclaim,
    Refused,
    Register,
    RemoveGroup,
    Seal,
    SharedAppend,
    StreamMeta,
    check_state,
)
from lakestream.log.keys import check_data_key, check_producer_id, key_writer
from lakestream.store.parse import MAX_INT, count


def entry_digest(data: bytes) -> str:
    """The digest of an entry's bytes as stored (``Link.digest``)."""
    return _sha256(data).digest()[:DIGEST_BYTES].hex()


_sha256 = hashlib.sha256
DIGEST_BYTES = DIGEST_CHARS // 2


def encode_entry(entry: Entry, prev: str | None = None) -> bytes:
    """The Delta Lake JSON lines of an entry; ``prev`` is the digest of the entry before it
    (``Link``), which every entry but a tombstone carries (None where the writer does not
    know it: version 0, or a state opened from a snapshot written before the chain).

    Raises:
        ValueError: an append's ``state`` holds NaN or Infinity (not JSON), the append is
            one readers would void (``refusal``, or a first line over ``MAX_INFO_BYTES``),
            or the entry is larger than ``MAX_ENTRY_BYTES``.
    """
    now = int(time.time() * 1000)
    chained = not isinstance(entry, Compacted)
    fmt = SHARED_ENTRY_FORMAT if isinstance(entry, SharedAppend) else \
        CHAINED_ENTRY_FORMAT if chained else COMPACTED_ENTRY_FORMAT
    info: dict[str, Any] = {"format": fmt, "commit_id": entry.commit_id}
    if chained:
        info["prev"] = prev
    operation, params, actions, lines = _operation(entry, info, now)
    commit_info = {"commitInfo": {"timestamp": now, "operation": operation,
                                  "operationParameters": params, "lakestream": info}}
    lines += [dump_line(a) for a in actions]
    # Each line is serialised once (allow_nan=False as a backstop: only the state holds
    # floats), and checksummed as written.
    head, body = dump_line(commit_info).encode(), "".join("\n" + line for line in lines).encode()
    if isinstance(entry, Append | SharedAppend) and len(head) + 32 > MAX_INFO_BYTES:
        raise ValueError(f"an append whose first line is {len(head):,} bytes, over "
                         f"{MAX_INFO_BYTES:,}: readers would void it (its state is too large)")
    data = checksum.with_checksum(head, checksum.entry_checksum(head, body)) + body + b"\n"
    if len(data) > MAX_ENTRY_BYTES:
        raise ValueError(f"the entry is {len(data):,} bytes, over {MAX_ENTRY_BYTES:,}: commit "
                         "fewer fragments at a time")
    return data


_TBL = "SET TBLPROPERTIES"


def _operation(entry: Entry, info: dict[str, Any], now: int
               ) -> tuple[str, dict[str, Any], list[dict[str, Any]], list[str]]:
    """What ``entry`` is to Delta readers: its operation and parameters, its actions, and
    its lines written directly (an append's adds); its own fields go into ``info``.

    Raises:
        ValueError: an append readers would void, or whose state is not JSON.
        TypeError: an entry no writer writes.
    """
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
        why = refusal(entry.producer, entry.epoch, entry.fragments)
        if why is not None:
            raise ValueError(f"an append readers would void: {why}")
        info.update(op="append", producer=entry.producer, epoch=entry.epoch,
                    seq=[entry.first_seq, entry.last_seq], state=entry.state)
        lines = [add_line(f, now) for f in entry.fragments]
        if entry.producer is not None:
            lines.append(dump_line({"txn": {"appId": entry.producer,
                                            "version": entry.last_seq, "lastUpdated": now}}))
    elif isinstance(entry, SharedAppend):
        parts = []
        for part in entry.parts:
            check_state(part.state)
            parts.append({"producer": part.producer, "epoch": part.epoch,
                          "seq": [part.first_seq, part.last_seq],
                          "fragments": len(part.fragments), "state": part.state})
            lines += [add_line(f, now) for f in part.fragments]
        why = _shared_refusal(entry.host, entry.parts)
        if why is not None:
            raise ValueError(f"a shared append readers would void: {why}")
        info.update(op="shared_append", host=entry.host, parts=parts)
        lines += [dump_line({"txn": {"appId": part.producer, "version": part.last_seq,
                                     "lastUpdated": now}}) for part in entry.parts]
    elif isinstance(entry, Fence):
        info.update(op="fence", producer=entry.producer, epoch=entry.epoch)
        operation, params = _TBL, {}
    elif isinstance(entry, Checkpoint):
        info.update(op="checkpoint", group=entry.group, step=entry.step,
                    checkpoint_id=entry.checkpoint_id)
        operation, params = _TBL, {}
    elif isinstance(entry, Register):
        info.update(op="register", group=entry.group, step=entry.step)
        operation, params = _TBL, {}
    elif isinstance(entry, RemoveGroup):
        info.update(op="remove_group", group=entry.group)
        operation, params = _TBL, {}
    elif isinstance(entry, Seal):
        info["op"] = "seal"
        operation, params = _TBL, {}
    elif isinstance(entry, Reclaim):
        info.update(op="reclaim", below_offset=entry.below_offset)
        operation, params = "DELETE", {"predicate": f"offset < {entry.below_offset}"}
        actions = [remove_action(f, now) for f in entry.removed] + \
            [remove_action(f, now, void=True) for f in entry.void or ()]
    elif isinstance(entry, Compacted):
        info.update(op="compacted", snapshot=entry.snapshot, replaced=entry.replaced)
        operation, params = _TBL, {}
    else:  # Refused: decoding makes those, no writer writes one
        raise TypeError(f"not an entry a writer writes: {entry!r}")
    return operation, params, actions, lines


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
    """Parses the JSON lines of log version ``version``, with its ``Link`` (its digest, and
    the digest of the entry before it that it names). An append over the writers' limits
    comes back ``Refused``: replay voids it.

    Raises:
        CorruptLogError: the text is not JSON lines, is not a Lakestream entry, has an unknown
            format version, or names an unsafe key; the message names the version.
    """
    try:
        as_written = checksum.as_written(data)
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
                else stored != checksum.lines_checksum(actions)):
            raise ValueError(f"checksum {stored!r} does not match the content "
                             f"({checksum.lines_checksum(actions)}): the entry is damaged")
        fmt = info.get("format")
        if fmt not in _FORMATS:
            raise CorruptLogError(
                f"log version {version} has format version {fmt!r}; this lakestream reads "
                f"{FORMAT_VERSION}-{SHARED_ENTRY_FORMAT}: upgrade lakestream or check the "
                "writer"
            )
        chained = fmt in (CHAINED_ENTRY_FORMAT, SHARED_ENTRY_FORMAT)
        if (fmt == SHARED_ENTRY_FORMAT) != (info.get("op") == "shared_append"):
            raise ValueError(f"format {fmt} with op {info.get('op')!r}")
        link = Link(entry_digest(data), _prev(info["prev"]) if chained else None, chained)
        entry = _decode_op(version, info, by_kind, link)
        if isinstance(entry, Append | SharedAppend) and data.find(b"\n") > MAX_INFO_BYTES:
            entry = Refused(f"its first line is over {MAX_INFO_BYTES:,} bytes: a state no "
                            "writer writes", entry.commit_id, link=link)
        return entry
    except CorruptLogError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, IndexError,
            RecursionError) as e:  # AttributeError: an object where JSON held another type
        problem = "its JSON is nested too deeply" if isinstance(e, RecursionError) else e
        raise CorruptLogError(f"log version {version} cannot be read: {problem}") from None


_FORMATS = (FORMAT_VERSION, GROUP_ENTRY_FORMAT, SEAL_ENTRY_FORMAT, COMPACTED_ENTRY_FORMAT,
            CHAINED_ENTRY_FORMAT, SHARED_ENTRY_FORMAT)
def _prev(value: Any) -> str | None:
    """A chained entry's ``prev``: None or a string the length of a digest (one that is not
    hex matches no digest, and the entry then follows nothing)."""
    if value is None or type(value) is str and len(value) == DIGEST_CHARS:
        return value
    raise ValueError(f"prev {str(value)[:80]!r} is not a digest")


def _decode_op(version: int, info: dict[str, Any], by_kind: dict[str, list[dict[str, Any]]],
               link: Link) -> Entry:
    """The entry an entry's ``commitInfo.lakestream`` and actions describe.

    Raises:
        ValueError, KeyError, TypeError, AttributeError: they describe none.
    """
    op, cid = info["op"], str(info["commit_id"])
    if op == "create":
        if version != 0:
            raise ValueError("a create entry past version 0")
        return Create(StreamMeta.from_json(by_kind["metaData"][0]), cid, link=link)
    if "group" in info and not isinstance(info["group"], str):
        raise ValueError(f"group {str(info['group'])[:40]!r} is not a string")
    if op == "append":
        return _append(version, info, by_kind.get("add", []), link)
    if op == "shared_append":
        return _shared(version, info, by_kind.get("add", []), link)
    if op == "fence":
        epoch = count(info["epoch"], "epoch", low=-MAX_INT)
        return Fence(check_producer_id(info["producer"]), epoch, cid, link=link)
    if op == "checkpoint":
        return Checkpoint(info["group"], count(info["step"], "step"),
                          _checkpoint_id(info.get("checkpoint_id")), cid, link=link)
    if op == "register":
        return Register(info["group"], count(info["step"], "step"), cid, link=link)
    if op == "remove_group":
        return RemoveGroup(info["group"], cid, link=link)
    if op == "seal":
        return Seal(cid, link=link)
    if op == "reclaim":
        removes = by_kind.get("remove", [])
        below = count(info["below_offset"], "below_offset")
        if not link.chained:  # from before the split: matched by path alone
            return Reclaim(below, tuple(_fragment(a, version) for a in removes), cid, None,
                           link=link)
        live = tuple(_fragment(a, version) for a in removes if not _is_void(a))
        void = tuple(_fragment(a, version) for a in removes if _is_void(a))
        return Reclaim(below, live, cid, void, link=link)
    if op == "compacted":
        replaced = info.get("replaced")
        return Compacted(count(info["snapshot"], "snapshot"),
                         None if replaced is None else str(replaced), cid, link=link)
    raise ValueError(f"unknown operation {op!r}")


def _is_void(action: dict[str, Any]) -> bool:
    return (action.get("tags") or {}).get(VOID_TAG) == "true"


def _append(version: int, info: dict[str, Any], adds: list[dict[str, Any]], link: Link
            ) -> Append | Refused:
    """An append, or ``Refused`` if it breaks what every writer keeps to: at most
    ``MAX_FRAGMENTS_PER_ENTRY`` fragments, and (chained) what ``refusal`` checks."""
    cid = str(info["commit_id"])
    if len(adds) > MAX_FRAGMENTS_PER_ENTRY:
        return Refused(f"it adds {len(adds):,} fragments, over {MAX_FRAGMENTS_PER_ENTRY:,}", cid,
                       link=link)
    frags = tuple(_fragment(a, version) for a in adds)
    if not frags:
        raise ValueError("an append with no add actions")
    seqs = [f.seq for f in frags]
    if info["seq"] != [seqs[0], seqs[-1]]:
        raise ValueError(f"seq range {info['seq']} disagrees with the adds {seqs}")
    producer = info["producer"]
    if producer is not None:
        check_producer_id(producer)
    epoch = count(info["epoch"], "epoch", low=-MAX_INT)
    why = refusal(producer, epoch, frags) if link.chained else None
    if why is not None:
        return Refused(why, cid, link=link)
    return Append(producer, epoch, frags, info.get("state"), cid, link=link)


MAX_HOST_CHARS = 64


def _shared(version: int, info: dict[str, Any], adds: list[dict[str, Any]], link: Link
            ) -> SharedAppend | Refused:
    """A shared append, or ``Refused`` if one of its parts breaks what every writer keeps to
    (``refusal``, a producer twice, no parts, over ``MAX_FRAGMENTS_PER_ENTRY`` in all)."""
    cid, host = str(info["commit_id"]), info["host"]
    if len(adds) > MAX_FRAGMENTS_PER_ENTRY:
        return Refused(f"it adds {len(adds):,} fragments, over {MAX_FRAGMENTS_PER_ENTRY:,}", cid,
                       link=link)
    parts, at = [], 0
    for p in info["parts"]:
        n = count(p["fragments"], "fragments")
        frags = tuple(_fragment(a, version) for a in adds[at:at + n])
        at += n
        if len(frags) != n or not frags:
            raise ValueError(f"a part of {n} fragments where the entry has {len(adds)} adds")
        if p["seq"] != [frags[0].seq, frags[-1].seq]:
            raise ValueError(f"seq range {p['seq']} disagrees with the adds")
        parts.append(Append(check_producer_id(p["producer"]),
                            count(p["epoch"], "epoch", low=-MAX_INT), frags, p.get("state"),
                            cid))
    if at != len(adds):
        raise ValueError(f"{len(adds)} adds where the parts name {at}")
    why = _shared_refusal(host, tuple(parts))
    if why is not None:
        return Refused(why, cid, link=link)
    return SharedAppend(str(host), tuple(parts), cid, link=link)


def _shared_refusal(host: Any, parts: tuple[Append, ...]) -> str | None:
    """Why readers void a shared append by ``host`` of these parts, or None."""
    if not isinstance(host, str) or not 0 < len(host) <= MAX_HOST_CHARS:
        return f"its host {str(host)[:80]!r} is not a string of 1-{MAX_HOST_CHARS} characters"
    if not parts:
        return "it has no parts"
    if len({p.producer for p in parts}) != len(parts):
        return "it names a producer in two parts"
    total = sum(len(p.fragments) for p in parts)
    if total > MAX_FRAGMENTS_PER_ENTRY:
        return f"it adds {total:,} fragments, over {MAX_FRAGMENTS_PER_ENTRY:,}"
    for p in parts:
        why = refusal(p.producer, p.epoch, p.fragments)
        if why is not None:
            return why
    return None


def refusal(producer: str | None, epoch: int, fragments: tuple[FragmentRef, ...]) -> str | None:
    """Why readers void an append of these fragments, or None: more than
    ``MAX_FRAGMENTS_PER_ENTRY``, or a file not named as its writer names its files
    (``data/<producer>/<epoch>-<seq>-...``), so that no append can name another writer's
    file, nor one already live (a producer's seqs are committed once). ``encode_entry``
    refuses to write what this refuses."""
    if len(fragments) > MAX_FRAGMENTS_PER_ENTRY:
        return f"it adds {len(fragments):,} fragments, over {MAX_FRAGMENTS_PER_ENTRY:,}"
    for f in fragments:
        if key_writer(f.path) != (producer, epoch, f.seq):
            return (f"it names {f.path}, which is not a file of its writer "
                    f"({producer or 'Stream.append'}, epoch {epoch}, seq {f.seq})")
    return None


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
