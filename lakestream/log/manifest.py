"""A snapshot's manifest: its key, its JSON (the producers, markers and counters, the
segments it names, and a CRC-32), written and read in bounded memory, each field checked
(``log/snapshot.py`` writes, decodes and rebases snapshots on it)."""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa
from zlib_ng import zlib_ng

from lakestream.errors import (
    CorruptLogError,
    TooLargeError,
)
from lakestream.log.entries import DIGEST_CHARS, MAX_CHECKPOINT_ID, FragmentRef, StreamMeta
from lakestream.log.index import Part
from lakestream.log.keys import check_data_key, check_group, check_producer_id
from lakestream.log.overlay import OverlayDict
from lakestream.log.replay import Marker, ProducerState, ReplayState
from lakestream.log.segments import (
    INDEX_DIR,
    SEGMENT_FRAGMENTS,
)
from lakestream.store.base import ObjectStore
from lakestream.store.parse import MAX_INT, count, loads

SNAPSHOT_DIR = "_lakestream/snapshots/"
HINT_KEY = "_lakestream/_last_snapshot"
SNAPSHOT_FORMAT = 5
"""Format 4 (format 3 plus ``sealed_at``) plus the chain: ``digest``, the digest of the entry
at the snapshot's version, and ``chained``. A lakestream from before the chain finds it
unreadable, falls back to the log, and stops at the first chained entry by name."""
READABLE_FORMATS = (2, 3, 4, 5)
SEGMENT_NAME = re.compile(r"[0-9A-Za-z._~-]{1,200}")
"""What a segment's name may be: ``<lo>-<hi>-<reclaim>-<n>.parquet``, ``<stem>~<reclaim>
.parquet`` (older streams padded the numbers). Nothing a terminal or a path would act on."""
CRC_LINE = b"\ncrc32:"
# What decoding stored bytes can raise when they are damaged (pyarrow raises a bare OSError
# for a torn Parquet footer). Decoding touches no store, so none of these is an outage;
# store failures (StoreError) and bugs (AttributeError, ...) are never caught as corruption.
PARSE_ERRORS = (ValueError, KeyError, TypeError, IndexError, OSError, pa.ArrowException)


MAX_MANIFEST_BYTES = 256 << 20
"""The largest manifest read: it grows by a row per segment and with every producer's state
and every marker (a million producers' cursors fit)."""



def read_manifest(store: ObjectStore, version: int) -> bytes:
    """The bytes of the snapshot manifest of ``version``, at most ``MAX_MANIFEST_BYTES``.

    Raises:
        NotFoundError: there is none. CorruptLogError: it is larger than that.
        StoreError: the store failed.
    """
    key = snapshot_key(version)
    try:
        return store.get(key, max_bytes=MAX_MANIFEST_BYTES)
    except TooLargeError as e:
        raise CorruptLogError(f"snapshot {key} cannot be read: {e}") from None


def snapshot_key(version: int) -> str:
    return f"{SNAPSHOT_DIR}{version:020d}.json"


def snapshot_version(key: str) -> int:
    """The version a snapshot key names (ValueError if it names none)."""
    return int(key[len(SNAPSHOT_DIR):].split(".")[0])


def encode_manifest(state: ReplayState, segments: list[list[object]]) -> bytes:
    """The manifest of ``state``.

    Raises:
        TooLargeError: it would be larger than ``MAX_MANIFEST_BYTES``, which readers refuse.
    """
    info = {
        "format": SNAPSHOT_FORMAT,
        "version": state.version,
        "digest": state.digest,
        "chained": state.chained,
        "next_offset": state.next_offset,
        "reclaimed_below": state.reclaimed_below,
        "reclaim_versions": state.reclaim_versions,
        "meta": state.stream_meta.to_json(),
        "producers": {k: [p.epoch, p.seq, p.state] for k, p in sorted(state.producers.items())},
        "markers": {g: [[m.step, m.checkpoint_id, m.version] for m in ms]
                    for g, ms in sorted(state.markers.items())},
        "registered": dict(sorted(state.registered.items())),
        "sealed_at": state.sealed_at,
        "voided": [[v, [[f.path, f.rows, f.size, f.offset, f.seq, f.crc32] for f in fs]]
                   for v, fs in state.voided],
        "segments": segments,
    }
    body = json.dumps(info, sort_keys=True, separators=(",", ":")).encode()
    if len(body) + 32 > MAX_MANIFEST_BYTES:
        raise TooLargeError(f"the snapshot of version {state.version} would be {len(body):,} "
                            f"bytes, over the {MAX_MANIFEST_BYTES:,} readers read: not written "
                            "(readers replay a longer tail)")
    return body + CRC_LINE + str(zlib_ng.crc32(body)).encode() + b"\n"


def manifest_json(data: bytes) -> dict[str, Any]:
    """The manifest's fields. Its last line is the CRC-32 of the JSON before it, so any
    damaged byte is caught, not only those that break the JSON."""
    body, sep, crc = data.rpartition(CRC_LINE)
    if not sep or crc != str(zlib_ng.crc32(body)).encode() + b"\n":
        raise ValueError("its checksum does not match its content: it is damaged")
    info = loads(body)
    if not isinstance(info, dict):
        raise ValueError("it is not a JSON object")
    return info


def parse_manifest(version: int, manifest: bytes) -> tuple[ReplayState, list[list[Any]],
                                                             int]:
    """The state a manifest records, less its index; its segment rows; its format."""
    info = manifest_json(manifest)
    if info["format"] not in READABLE_FORMATS or info["version"] != version:
        raise ValueError(f"format {info['format']}, version {info['version']}")
    state = ReplayState()
    state.version = version
    state.meta = StreamMeta.from_json(info["meta"])
    state.next_offset = count(info["next_offset"], "next_offset")
    state.reclaimed_below = count(info["reclaimed_below"], "reclaimed_below")
    state.reclaim_versions = tuple(count(v, "reclaim version")
                                   for v in info["reclaim_versions"])
    state.producers = OverlayDict({check_producer_id(k): ProducerState(
        count(e, "epoch", low=-MAX_INT), count(s, "seq", low=-MAX_INT), st)
        for k, (e, s, st) in info["producers"].items()})
    state.markers = OverlayDict({check_group(g): tuple(
        Marker(g, count(s, "step"), checkpoint_id_of(c), count(v, "version")) for s, c, v in ms)
        for g, ms in info["markers"].items()})
    # Manifests written before registration existed have none: no log held a Register.
    state.registered = OverlayDict({check_group(g): count(s, "step")
                                    for g, s in info.get("registered", {}).items()})
    sealed = info.get("sealed_at")  # absent before sealing existed: not sealed
    state.sealed_at = None if sealed is None else count(sealed, "sealed_at")
    state.voided = tuple((count(v, "version"), tuple(void_file(f) for f in fs))
                         for v, fs in info["voided"])
    if info["format"] >= 5:
        digest, chained = info["digest"], info["chained"]
        if not (digest is None or isinstance(digest, str) and _DIGEST.fullmatch(digest)) \
                or not isinstance(chained, bool) or chained and digest is None:
            raise ValueError(f"digest {str(digest)[:80]!r}, chained {str(chained)[:8]!r}")
        state.digest, state.chained = digest, chained
    return state, list(info["segments"]), int(info["format"])


_DIGEST = re.compile(rf"[0-9a-f]{{{DIGEST_CHARS}}}")


def checkpoint_id_of(value: Any) -> str | None:
    if value is None or isinstance(value, str) and len(value) <= MAX_CHECKPOINT_ID:
        return value
    raise ValueError(f"checkpoint id {str(value)[:80]!r}")


def void_file(row: list[Any]) -> FragmentRef:
    path, rows, size, offset, seq, crc = row
    return FragmentRef(check_data_key(path), count(rows, "rows"), count(size, "size"),
                       count(offset, "offset"), count(seq, "seq", low=-MAX_INT),
                       count(crc, "crc32", low=-1))


def overlaps(prev_lo: int, prev_hi: int, prev_end: int, lo: int, hi: int, start: int) -> bool:
    """Whether a segment overlaps the one before it (pieces of one run share their
    versions, and only their offsets must not overlap)."""
    return start < prev_end or (lo, hi) != (prev_lo, prev_hi) and lo < prev_hi


def stored_parts(rows: list[list[Any]]) -> list[Part]:
    """Format 3 rows: [name under INDEX_DIR, lo, hi, count, crc, start, end], checked to be
    in order. Made as plain tuples: at a million fragments (120 rows) this loop was half of
    opening when each row went through ``Part(...)``.

    Raises:
        ValueError: a row holds other than integers, or the rows overlap.
    """
    make = tuple.__new__
    parts: list[Part] = []
    prev_lo = prev_hi = prev_end = -1
    for name, lo, hi, n, c, start, end in rows:
        if not type(lo) is type(hi) is type(n) is type(c) is type(start) is type(end) is int \
                or not 0 <= min(lo, hi, n, c, start, end) <= max(lo, hi, c, start, end) \
                <= MAX_INT or n > SEGMENT_FRAGMENTS or not isinstance(name, str) \
                or not SEGMENT_NAME.fullmatch(name):
            raise ValueError(f"segment row {ascii([name, lo, hi, n, c, start, end])[:200]} is "
                             "not a name and numbers in range")
        if overlaps(prev_lo, prev_hi, prev_end, lo, hi, start):
            raise ValueError(f"segment {name} overlaps the one before it")
        parts.append(make(Part, (lo, hi, start, end, n, INDEX_DIR + name, c, None, ())))
        prev_lo, prev_hi, prev_end = lo, hi, end
    return parts


def manifest_row(part: Part) -> list[object]:
    if part.key is None or not part.key.startswith(INDEX_DIR):  # kept under python -O
        raise ValueError(f"an index segment outside {INDEX_DIR}: {part.key!r}")
    return [part.key[len(INDEX_DIR):], part.lo, part.hi, part.fragments, part.crc, part.start,
            part.end]


