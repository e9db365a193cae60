"""Snapshots of the replay state, and opening a stream in O(1) requests in log length (§4)."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from lakestream.errors import AlreadyExistsError, CorruptLogError, NotFoundError
from lakestream.failpoints import failpoint
from lakestream.log import Entry, FragmentRef, StreamMeta, decode_entry, log_key
from lakestream.replay import Fragment, Marker, ProducerState, ReplayState
from lakestream.store.base import ObjectStore

SNAPSHOT_DIR = "_lakestream/snapshots/"
HINT_KEY = "_lakestream/_last_snapshot"
SNAPSHOT_FORMAT = 1
_META_KEY = b"lakestream.snapshot"
_FRAGMENTS = pa.schema([
    ("offset", pa.int64()), ("rows", pa.int64()), ("path", pa.string()),
    ("size", pa.int64()), ("version", pa.int64()),
])


def snapshot_key(version: int) -> str:
    return f"{SNAPSHOT_DIR}{version:020d}.parquet"


def encode_snapshot(state: ReplayState) -> bytes:
    """The snapshot of ``state`` as Parquet bytes; deterministic for a given state."""
    meta = state.stream_meta
    info = {
        "format": SNAPSHOT_FORMAT,
        "version": state.version,
        "next_offset": state.next_offset,
        "reclaimed_below": state.reclaimed_below,
        "reclaim_versions": state.reclaim_versions,
        "meta": meta.to_json(),
        "producers": {k: [p.epoch, p.seq, p.state] for k, p in sorted(state.producers.items())},
        "markers": {g: [[m.step, m.checkpoint_id, m.version] for m in ms]
                    for g, ms in sorted(state.markers.items())},
        "voided": [[v, [[f.path, f.rows, f.size, f.offset, f.seq] for f in fs]]
                   for v, fs in state.voided],
    }
    frags = state.fragments
    columns = {name: [getattr(f, name) for f in frags] for name in _FRAGMENTS.names}
    table = pa.Table.from_pydict(columns, schema=_FRAGMENTS.with_metadata(
        {_META_KEY: json.dumps(info, sort_keys=True).encode()}))
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def decode_snapshot(version: int, data: bytes) -> ReplayState:
    """Parses a snapshot.

    Raises:
        CorruptLogError: it is not a readable snapshot of ``version``.
    """
    try:
        table = pq.read_table(io.BytesIO(data))
        info = json.loads(table.schema.metadata[_META_KEY])
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
        cols = table.to_pydict()
        state.restore_fragments([
            Fragment(*row) for row in zip(cols["offset"], cols["rows"], cols["path"],
                                          cols["size"], cols["version"], strict=True)])
    except CorruptLogError:
        raise
    except Exception as e:  # noqa: BLE001 - any parse failure of stored bytes is corruption
        raise CorruptLogError(f"snapshot {snapshot_key(version)} cannot be read: {e}") from None
    return state


def write_snapshot(store: ObjectStore, state: ReplayState) -> None:
    """Writes the snapshot of ``state`` (if absent) and points the hint at it."""
    try:
        store.put(snapshot_key(state.version), encode_snapshot(state), mode="create")
    except AlreadyExistsError:
        pass
    failpoint("during_snapshot")
    store.put(HINT_KEY, json.dumps({"version": state.version}).encode(), mode="overwrite")


def read_entry(store: ObjectStore, version: int) -> Entry:
    """Reads and parses log version ``version``.

    Raises:
        NotFoundError: the version does not exist (yet).
        CorruptLogError: it exists but cannot be parsed.
    """
    return decode_entry(version, store.get(log_key(version)))


def read_tail(store: ObjectStore, state: ReplayState) -> ReplayState:
    """Folds every entry after ``state.version`` into ``state``, until one is absent."""
    while True:
        try:
            entry = read_entry(store, state.version + 1)
        except NotFoundError:
            return state
        state.apply(state.version + 1, entry)


def _exists(store: ObjectStore, key: str) -> bool:
    try:
        store.head(key)
        return True
    except NotFoundError:
        return False


def _read_hint(store: ObjectStore) -> int | None:
    try:
        v = json.loads(store.get(HINT_KEY))["version"]
        return int(v) if isinstance(v, int) and v >= 0 else None
    except NotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None  # a torn or foreign hint is only a hint: probe instead


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
    start = _read_hint(store)
    if start is None and _exists(store, snapshot_key(0)):
        start = 0
    if start is not None:
        try:
            known = decode_snapshot(start, store.get(snapshot_key(start)))
        except (NotFoundError, CorruptLogError) as e:
            errors.append(str(e))
        else:
            latest = _latest_snapshot(store, start, known.stream_meta.snapshot_interval)
            if latest == start:
                return known
            try:
                return decode_snapshot(latest, store.get(snapshot_key(latest)))
            except (NotFoundError, CorruptLogError) as e:
                errors.append(str(e))
                return known
    # The hint and its snapshot are unusable: list the (few, retained) snapshots instead.
    for key in sorted((m.key for m in store.list(SNAPSHOT_DIR)), reverse=True):
        try:
            version = int(key[len(SNAPSHOT_DIR):].split(".")[0])
            return decode_snapshot(version, store.get(key))
        except (ValueError, NotFoundError, CorruptLogError) as e:
            errors.append(str(e))
    return None
