"""Log entries: the frozen records of the log, one per version, the names and keys they carry,
and the limits they keep."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa

from lakestream.checks import check_int
from lakestream.errors import CorruptLogError
from lakestream.schema.delta import decode_schema, delta_schema_string, encode_schema
from lakestream.store.parse import count

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
CHAINED_ENTRY_FORMAT = 5
"""The format of every entry written now but tombstones: the entry names the digest of the
entry before it (``Link``), so that a rewritten entry breaks the chain for every reader. A
lakestream from before the chain stops at one with "upgrade lakestream" rather than commit
an unchained entry after it, which readers of the chain would refuse."""
SHARED_ENTRY_FORMAT = 6
"""The format of an append several producers of one host share (``SharedAppend``), chained
as format 5 is: a lakestream from before it stops there with "upgrade lakestream" rather
than read one producer's append where there are several."""
TOMBSTONE_TTL_S = 3600.0
"""gc deletes a tombstone only once it is this old by the store's clock, so a version it
compacted stays taken for at least this long after the entry there was written."""
REOPEN_IDLE_S = TOMBSTONE_TTL_S / 4
"""A handle whose view no read has confirmed at the log's head for this long reopens from
the newest snapshot before it reads the log or commits: the tombstone after its view may
be gone by then."""
MAX_GLOBAL_BATCH_SIZE = 1 << 24
"""Samples a step may hold (16,777,216): a global batch is read into memory whole by the
ranks together, and a size past this is a typo (``2**40``) that left readers waiting for a
first step no producer would ever fill."""
MAX_ENTRY_BYTES = 32 << 20
"""The largest log entry written or read: 10,000 fragments (a commit's most) take ~5 MB, a
producer's state the rest. A larger one is refused as damage, so no entry costs an opener
more than this in time and memory."""
MAX_FRAGMENTS_PER_ENTRY = 10_000
"""The most fragments an append adds, or a reclaim removes, in one entry: a writer commits
more in several. An append with more is void (no writer writes one)."""
MAX_CHECKPOINT_ID = 4096
MAX_STATE_BYTES = 1 << 20
"""A producer's state (a prompt cursor, say) is at most this much JSON."""
MAX_INFO_BYTES = MAX_STATE_BYTES + (16 << 10)
"""The longest first line (``commitInfo``) an entry may have: a state at its largest, a
checkpoint id, names and numbers. An append whose line is longer carries a state no writer
writes, and is void: a 30 MiB state in a snapshot manifest per producer id would make the
manifests too large to read."""
def new_commit_id() -> str:
    return uuid.uuid4().hex


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
        if not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= MAX_GLOBAL_BATCH_SIZE:
            raise ValueError(f"global_batch_size must be an int from 1 to "
                             f"{MAX_GLOBAL_BATCH_SIZE:,} (samples a step), got {b!r}")
        if not isinstance(g, int) or isinstance(g, bool) or g < 1 or b % g:
            raise ValueError(f"group_size must be a positive int dividing {b}, got {g!r}")
        object.__setattr__(self, "snapshot_interval",
                           check_int("snapshot_interval", self.snapshot_interval, least=1))

    def offset(self, step: int) -> int:
        """The first offset of ``step``. With ``step_of`` and ``first_whole_step``, the one
        home of the stream's step arithmetic: every reader, retention, status and the
        command line go through these."""
        return step * self.global_batch_size

    def step_of(self, offset: int) -> int:
        """The step holding ``offset``."""
        return offset // self.global_batch_size

    def first_whole_step(self, offset: int) -> int:
        """The first step that starts at or after ``offset``: the first one whole when
        everything below ``offset`` is gone."""
        return -(-offset // self.global_batch_size)

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


DIGEST_CHARS = 32
"""A link's digest: the first 128 bits of the SHA-256 of an entry's bytes, in hex."""


class Link(NamedTuple):
    """Where an entry read from the store stands in the log's chain (docs/design.md §2).

    ``digest`` is the digest of the entry's bytes as stored; ``prev``, for a chained entry,
    the digest of the entry before it as its writer read it (None where the writer did not
    know it: the first entries written on a stream created before the chain). An entry
    rewritten after it was committed changes its digest, so the next entry's ``prev`` no
    longer matches for readers who read the rewrite, and the rewrite's ``prev`` or digest no
    longer matches for readers who read the original."""

    digest: str
    prev: str | None = None
    chained: bool = False


@dataclass(frozen=True)
class _Logged:
    link: Link | None = field(default=None, kw_only=True, compare=False, repr=False)
    """Set on entries read from the store (and on a committer's own entry once it is
    encoded); None on an entry built in memory and not yet written."""


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
class Create(_Logged):
    meta: StreamMeta
    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class Append(_Logged):
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
class SharedAppend(_Logged):
    """The appends of several producers of one host, committed by one of them in one entry
    (``lakestream.producers.hostcommit``): each part keeps its producer, epoch, seqs and
    state, and the entry lands or is void whole. ``host`` names the committing host's
    producers as one writer, for pacing."""

    host: str
    parts: tuple[Append, ...]
    commit_id: str = field(default_factory=new_commit_id)

    @property
    def fragments(self) -> tuple[FragmentRef, ...]:
        return tuple(f for part in self.parts for f in part.fragments)


@dataclass(frozen=True)
class Fence(_Logged):
    producer: str
    epoch: int
    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class Checkpoint(_Logged):
    """Group ``group`` has a durable training checkpoint that resumes at ``step``."""

    group: str
    step: int
    checkpoint_id: str | None = None
    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class Register(_Logged):
    """Consumer group ``group`` exists and holds retention from ``step`` until its markers
    take over (a registered group with no marker holds every step from ``step`` on)."""

    group: str
    step: int
    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class RemoveGroup(_Logged):
    """Consumer group ``group`` is gone: its markers and registration stop holding data."""

    group: str
    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class Seal(_Logged):
    """No more appends: every append after this entry is void."""

    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class Reclaim(_Logged):
    """Retention's entry: every offset below ``below_offset`` is reclaimed; ``removed`` are
    the live fragments it takes out of the index (each wholly below the point), matched by
    path and offset, and ``void`` the files of void appends it takes off their list. An
    entry from before the split (``void`` None) matched its removals by path alone, against
    live fragments and void files alike."""

    below_offset: int
    removed: tuple[FragmentRef, ...]
    commit_id: str = field(default_factory=new_commit_id)
    void: tuple[FragmentRef, ...] | None = ()


@dataclass(frozen=True)
class Compacted(_Logged):
    """A tombstone: gc compacted the entry at this version away, and left this in its place
    so that the version stays taken (a put-if-absent from an old view fails there, and a
    read from one learns that it must reopen). Replay never folds it in."""

    snapshot: int
    """The newest snapshot when gc compacted the entry: a reader reopens from it or later."""
    replaced: str | None
    """The commit id of the entry it replaced (None if that entry could not be read): a
    committer whose put had an unknown outcome learns from it whether the entry was its own."""
    commit_id: str = field(default_factory=new_commit_id)


@dataclass(frozen=True)
class Refused(_Logged):
    """An entry that no Lakestream writer writes, though it parses: an append over the
    writers' limits (a state larger than ``MAX_STATE_BYTES``, more than
    ``MAX_FRAGMENTS_PER_ENTRY`` fragments, a file that is not its writer's). Replay folds it
    in as void, keeping none of its files: the log goes on past it, and nothing it names
    is trusted."""

    reason: str
    commit_id: str = field(default_factory=new_commit_id)


Entry = Create | Append | SharedAppend | Fence | Checkpoint | Register | RemoveGroup | Seal | \
    Reclaim | Compacted | Refused


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
