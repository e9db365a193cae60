"""Snapshots of the replay state, and opening a stream in a number of requests that does not
grow with the log (docs/design.md §4).

A snapshot is a small JSON manifest (the producers, markers and counters, and a CRC-32) that
names the index segments holding its live fragments. Segments are immutable Parquet files
over aligned blocks of snapshot intervals, arranged like a binary counter: snapshot number
``n = version // interval`` uses one block per set bit of ``n``, so consecutive snapshots
share every block but the newest, and writing a snapshot re-encodes each fragment
O(log n) times over the life of the stream instead of once per snapshot. Opening reads the
manifest and at most ``log2(n) + 1`` segments, fetched in parallel.

A segment's key names its version range and the newest reclaim after that range, so its
content is a function of its key: any writer may write it, and a reclaim makes the next
snapshot write smaller segments in place of the ones it shrank.
"""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lakestream.errors import AlreadyExistsError, CorruptLogError, NotFoundError, StoreError
from lakestream.failpoints import failpoint
from lakestream.log import FragmentRef, StreamMeta, log_key
from lakestream.replay import Fragment, Marker, ProducerState, ReplayState
from lakestream.store.base import ObjectStore
from lakestream.tail import read_tail
from lakestream.threads import shared_pool

SNAPSHOT_DIR = "_lakestream/snapshots/"
INDEX_DIR = "_lakestream/index/"
HINT_KEY = "_lakestream/_last_snapshot"
SNAPSHOT_FORMAT = 2
_CRC_LINE = b"\ncrc32:"
# What decoding stored bytes can raise when they are damaged (pyarrow raises a bare OSError
# for a torn Parquet footer). Decoding touches no store, so none of these is an outage;
# store failures (StoreError) and bugs (AttributeError, ...) are never caught as corruption.
_PARSE_ERRORS = (ValueError, KeyError, TypeError, IndexError, OSError, pa.ArrowException)
_FRAGMENTS = pa.schema([
    ("offset", pa.int64()), ("rows", pa.int64()), ("path", pa.string()),
    ("size", pa.int64()), ("version", pa.int64()), ("crc32", pa.int64()),
])


def snapshot_key(version: int) -> str:
    return f"{SNAPSHOT_DIR}{version:020d}.json"


def snapshot_version(key: str) -> int:
    """The version a snapshot key names (ValueError if it names none)."""
    return int(key[len(SNAPSHOT_DIR):].split(".")[0])


def segment_key(lo: int, hi: int, reclaim: int) -> str:
    """The segment of fragments committed at versions ``(lo, hi]``, less those removed by
    reclaims up to version ``reclaim`` (0: no reclaim after ``hi``)."""
    return f"{INDEX_DIR}{lo:020d}-{hi:020d}-{reclaim:020d}.parquet"


def segment_ranges(version: int, interval: int) -> list[tuple[int, int]]:
    """The version ranges ``(lo, hi]`` of the segments of the snapshot after ``version``:
    one aligned power-of-two block of intervals per set bit of ``version // interval``,
    largest first, then the versions past the last whole interval (none in a snapshot
    written by a committer, whose version is a multiple of the interval)."""
    ranges, lo, n = [], 0, version // interval
    for bit in reversed(range(n.bit_length())):
        if n >> bit & 1:
            hi = lo + (interval << bit)
            ranges.append((lo, hi))
            lo = hi
    if version > lo:
        ranges.append((lo, version))
    return ranges


def _segment_keys(state: ReplayState) -> list[tuple[str, int, int]]:
    newest_reclaim = state.reclaim_versions[-1] if state.reclaim_versions else 0
    return [(segment_key(lo, hi, newest_reclaim if newest_reclaim > hi else 0), lo, hi)
            for lo, hi in segment_ranges(state.version, state.stream_meta.snapshot_interval)]


def _encode_segment(fragments: list[Fragment]) -> bytes:
    columns = {name: [getattr(f, name) for f in fragments] for name in _FRAGMENTS.names}
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pydict(columns, schema=_FRAGMENTS), buf, compression="zstd",
                   write_page_checksum=True)
    return buf.getvalue()


def _decode_segment(key: str, data: bytes, lo: int, hi: int, rows: int) -> list[Fragment]:
    table = pq.read_table(io.BytesIO(data), page_checksum_verification=True)
    if table.schema.names != _FRAGMENTS.names or table.num_rows != rows:
        raise ValueError(f"segment {key} holds {table.num_rows} fragments, manifest says {rows}")
    cols = [table.column(name).to_pylist() for name in _FRAGMENTS.names]
    fragments = list(map(Fragment, *cols))
    if fragments and not lo < fragments[0].version <= fragments[-1].version <= hi:
        raise ValueError(f"segment {key} holds fragments outside versions ({lo}, {hi}]")
    return fragments


def _encode_manifest(state: ReplayState, segments: list[list[object]]) -> bytes:
    info = {
        "format": SNAPSHOT_FORMAT,
        "version": state.version,
        "next_offset": state.next_offset,
        "reclaimed_below": state.reclaimed_below,
        "reclaim_versions": state.reclaim_versions,
        "meta": state.stream_meta.to_json(),
        "producers": {k: [p.epoch, p.seq, p.state] for k, p in sorted(state.producers.items())},
        "markers": {g: [[m.step, m.checkpoint_id, m.version] for m in ms]
                    for g, ms in sorted(state.markers.items())},
        "voided": [[v, [[f.path, f.rows, f.size, f.offset, f.seq, f.crc32] for f in fs]]
                   for v, fs in state.voided],
        "segments": segments,
    }
    body = json.dumps(info, sort_keys=True, separators=(",", ":")).encode()
    return body + _CRC_LINE + str(zlib.crc32(body)).encode() + b"\n"


def _read_manifest(data: bytes) -> dict[str, Any]:
    """The manifest's fields. Its last line is the CRC-32 of the JSON before it, so any
    damaged byte is caught, not only those that break the JSON."""
    body, sep, crc = data.rpartition(_CRC_LINE)
    if not sep or crc != str(zlib.crc32(body)).encode() + b"\n":
        raise ValueError("its checksum does not match its content: it is damaged")
    info: dict[str, Any] = json.loads(body)
    return info


def decode_snapshot(version: int, manifest: bytes, fetch: Callable[[str], bytes]) -> ReplayState:
    """Parses a snapshot from its manifest, reading the segments it names with ``fetch``
    (in parallel when there are several).

    Raises:
        CorruptLogError: the manifest or a segment is missing, unreadable or inconsistent.
        StoreError: the store failed while fetching a segment (an outage, not damage).
    """
    key = snapshot_key(version)
    try:
        info = _read_manifest(manifest)
        if info["format"] != SNAPSHOT_FORMAT or info["version"] != version:
            raise ValueError(f"format {info['format']}, version {info['version']}")
        state = ReplayState()
        state.version = version
        state.meta = StreamMeta.from_json(info["meta"])
        state.next_offset = int(info["next_offset"])
        state.reclaimed_below = int(info["reclaimed_below"])
        state.reclaim_versions = [int(v) for v in info["reclaim_versions"]]
        state.producers = {k: ProducerState(int(e), int(s), st)
                           for k, (e, s, st) in info["producers"].items()}
        state.markers = {g: [Marker(g, int(s), c, int(v)) for s, c, v in ms]
                         for g, ms in info["markers"].items()}
        state.voided = [(int(v), tuple(FragmentRef(*f) for f in fs)) for v, fs in info["voided"]]
        segments = [(str(k), int(lo), int(hi), int(n), int(c))
                    for k, lo, hi, n, c in info["segments"]]
    except _PARSE_ERRORS as e:
        raise CorruptLogError(f"snapshot {key} cannot be read: {e}") from None

    def load(segment: tuple[str, int, int, int, int]) -> list[Fragment]:
        seg_key, lo, hi, rows, crc = segment
        try:
            data = fetch(seg_key)
        except NotFoundError:
            raise CorruptLogError(f"snapshot {key} names {seg_key}, which is missing") from None
        if zlib.crc32(data) != crc:
            raise CorruptLogError(f"snapshot {key}: segment {seg_key} has CRC-32 "
                                  f"{zlib.crc32(data)}, the manifest recorded {crc}: it is "
                                  "damaged")
        try:
            return _decode_segment(seg_key, data, lo, hi, rows)
        except _PARSE_ERRORS as e:
            raise CorruptLogError(f"snapshot {key}: segment {seg_key} cannot be read: {e}") \
                from None

    if len(segments) > 1:
        parts = list(shared_pool().map(load, segments))
    else:
        parts = [load(s) for s in segments]
    fragments = [f for part in parts for f in part]
    for a, b in zip(fragments, fragments[1:], strict=False):
        if b.offset < a.end:
            raise CorruptLogError(f"snapshot {key}: fragments {a.path} and {b.path} overlap")
    state.restore_fragments(fragments)
    return state


def write_snapshot(store: ObjectStore, state: ReplayState) -> None:
    """Writes the snapshot of ``state`` (the segments it lacks, then the manifest, each only
    if absent) and points the hint at it."""
    keys = _segment_keys(state)
    earlier = _earlier_segments(store, state) if len(keys) > 1 else {}
    named: list[list[object]] = []
    for i, (key, lo, hi) in enumerate(keys):
        fragments = state.fragments_committed_between(lo, hi)
        # Every block but the newest was written with the previous snapshot, which recorded
        # its checksum; unless that writer died first or a reclaim since gave it a new key.
        known = earlier.get(key)
        if i < len(keys) - 1 and known is not None and known[0] == len(fragments) \
                and _exists(store, key):
            named.append([key, lo, hi, len(fragments), known[1]])
            continue
        data = _encode_segment(fragments)
        try:
            store.put(key, data, mode="create")
        except AlreadyExistsError:
            data = store.get(key)  # another writer's bytes (maybe another pyarrow's)
        named.append([key, lo, hi, len(fragments), zlib.crc32(data)])
    try:
        store.put(snapshot_key(state.version), _encode_manifest(state, named), mode="create")
    except AlreadyExistsError:
        pass
    failpoint("during_snapshot")
    store.put(HINT_KEY, json.dumps({"version": state.version}).encode(), mode="overwrite")


def _earlier_segments(store: ObjectStore, state: ReplayState) -> dict[str, tuple[int, int]]:
    """``{key: (fragments, crc32)}`` of the previous snapshot's segments ({} if unreadable)."""
    previous = state.version - state.stream_meta.snapshot_interval
    if previous < 0:
        return {}
    try:
        info = _read_manifest(store.get(snapshot_key(previous)))
        return {str(k): (int(n), int(c)) for k, _lo, _hi, n, c in info["segments"]}
    except (NotFoundError, StoreError, *_PARSE_ERRORS):
        return {}  # missing, unreachable or damaged: it only costs re-encoding its blocks


def snapshot_segments(store: ObjectStore, version: int) -> list[str]:
    """The segment keys the snapshot of ``version`` names.

    Raises:
        NotFoundError: there is no such snapshot.
        CorruptLogError: its manifest cannot be read.
        StoreError: the store failed.
    """
    data = store.get(snapshot_key(version))
    try:
        info = _read_manifest(data)
        return [str(s[0]) for s in info["segments"]]
    except _PARSE_ERRORS as e:
        raise CorruptLogError(f"snapshot {snapshot_key(version)} cannot be read: {e}") from None


def _exists(store: ObjectStore, key: str) -> bool:
    try:
        store.head(key)
        return True
    except NotFoundError:
        return False


def read_version_pointer(store: ObjectStore, key: str) -> int | None:
    """The version a pointer object (``{"version": v, ...}``, overwritten in place) names, or
    None if it is missing, torn or foreign.

    Raises:
        StoreError: the store failed.
    """
    try:
        v = json.loads(store.get(key))["version"]
        return v if isinstance(v, int) and v >= 0 else None
    except (NotFoundError, ValueError, KeyError, TypeError):
        return None


def read_hint(store: ObjectStore) -> int | None:
    """The version the hint names, or None if it is unusable (a hint is only a hint: the
    opener probes instead)."""
    return read_version_pointer(store, HINT_KEY)


def _latest_snapshot(store: ObjectStore, known: int, interval: int) -> int:
    """The newest snapshot version at or after ``known`` (which exists), by exponential then
    binary search over multiples of ``interval`` with HEAD requests."""
    step, lo = interval, known
    while _exists(store, snapshot_key(lo + step)):
        lo, step = lo + step, step * 2
    hi = lo + step  # absent
    while hi - lo > interval:
        mid = lo + ((hi - lo) // interval // 2) * interval
        if _exists(store, snapshot_key(mid)):
            lo = mid
        else:
            hi = mid
    return lo


def load_state(store: ObjectStore, uri: str) -> ReplayState:
    """Opens the stream's state: hint -> newest snapshot -> the tail of the log.

    A missing or stale hint costs a few HEADs (exponential, then binary search over snapshot
    versions); a corrupt snapshot falls back to an older one plus replay.

    Raises:
        NotFoundError: no stream exists at ``uri``.
        CorruptLogError: a log entry, or every snapshot and the log itself, is unreadable.
    """
    errors: list[str] = []
    state = _newest_snapshot(store, errors)
    if state is None:
        if not _exists(store, log_key(0)):
            if errors:
                raise CorruptLogError(f"no readable snapshot of {uri}: {errors}")
            raise NotFoundError(f"no Lakestream stream at {uri} (no {log_key(0)}); create it")
        state = ReplayState()
    return read_tail(store, state)


def _newest_snapshot(store: ObjectStore, errors: list[str]) -> ReplayState | None:
    start = read_hint(store)
    if start is None and _exists(store, snapshot_key(0)):
        start = 0
    if start is not None:
        try:
            known = decode_snapshot(start, store.get(snapshot_key(start)), store.get)
        except (NotFoundError, CorruptLogError) as e:
            errors.append(str(e))
        else:
            latest = _latest_snapshot(store, start, known.stream_meta.snapshot_interval)
            if latest == start:
                return known
            try:
                return decode_snapshot(latest, store.get(snapshot_key(latest)), store.get)
            except (NotFoundError, CorruptLogError) as e:
                errors.append(str(e))
                return known
    # The hint and its snapshot are unusable: list the (few, retained) snapshots instead.
    for key in sorted((m.key for m in store.list(SNAPSHOT_DIR)), reverse=True):
        try:
            version = snapshot_version(key)
            return decode_snapshot(version, store.get(key), store.get)
        except (ValueError, NotFoundError, CorruptLogError) as e:
            errors.append(str(e))
    return None
