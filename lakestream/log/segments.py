"""Index segments: the live fragments as columns (``Fragment``, ``Columns``) and as the
immutable Parquet files of the index (docs/design.md §4, "The index in memory"): their keys,
encoding, fetching and checking."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from zlib_ng import zlib_ng

from lakestream.errors import CorruptLogError, NotFoundError, TooLargeError
from lakestream.log.entries import FragmentRef
from lakestream.schema.arrays import as_numpy
from lakestream.store.base import ObjectStore

INDEX_DIR = "_lakestream/index/"
MAX_SEGMENT_BYTES = 64 << 20
"""The largest index segment read: 8,192 fragments take about 1 MB."""
FRAGMENT_SCHEMA = pa.schema([
    ("offset", pa.int64()), ("rows", pa.int64()), ("path", pa.string()),
    ("size", pa.int64()), ("version", pa.int64()), ("crc32", pa.int64()),
])
SEGMENT_FRAGMENTS = 8192
"""The most fragments a segment written by a snapshot holds: what a lookup fetches at most."""
_INTS = ("offset", "rows", "size", "version", "crc32")


class SegmentError(CorruptLogError):
    """An index segment a lookup needs is missing or damaged. A newer snapshot, or the log
    it was made from while it is retained, still holds the truth: the handle's view reopens
    (``LogView.recover``)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Fragment:
    """A live fragment: rows ``[offset, offset + rows)`` of the global order."""

    offset: int
    rows: int
    path: str
    size: int
    version: int
    crc32: int = -1

    @property
    def end(self) -> int:
        return self.offset + self.rows


@dataclass(frozen=True, eq=False)
class Columns:
    """Fragments in offset order, one numpy array per integer field and an Arrow array of
    paths."""

    offset: np.ndarray
    rows: np.ndarray
    size: np.ndarray
    version: np.ndarray
    crc32: np.ndarray
    paths: pa.Array

    def __len__(self) -> int:
        return len(self.offset)

    @property
    def start(self) -> int:
        return int(self.offset[0]) if len(self) else 0

    @property
    def end(self) -> int:
        return int(self.offset[-1] + self.rows[-1]) if len(self) else 0

    def fragment(self, i: int) -> Fragment:
        return Fragment(int(self.offset[i]), int(self.rows[i]), self.paths[i].as_py(),
                        int(self.size[i]), int(self.version[i]), int(self.crc32[i]))

    def fragments(self) -> list[Fragment]:
        paths = self.paths.to_pylist()
        return list(map(Fragment, self.offset.tolist(), self.rows.tolist(), paths,
                        self.size.tolist(), self.version.tolist(), self.crc32.tolist()))

    @classmethod
    def of(cls, ints: Sequence[np.ndarray], paths: pa.Array) -> Columns:
        """From the integer columns in ``_INTS`` order, and the paths."""
        offset, rows, size, version, crc32 = ints
        return cls(offset, rows, size, version, crc32, paths)

    def keep(self, mask: np.ndarray) -> Columns:
        return Columns.of([getattr(self, n)[mask] for n in _INTS],
                          self.paths.filter(pa.array(mask)))

    def slice(self, a: int, b: int) -> Columns:
        return Columns.of([getattr(self, n)[a:b] for n in _INTS], self.paths.slice(a, b - a))

    def table(self) -> pa.Table:
        return pa.Table.from_arrays(
            [pa.array(self.offset), pa.array(self.rows), self.paths, pa.array(self.size),
             pa.array(self.version), pa.array(self.crc32)], schema=FRAGMENT_SCHEMA)

    @classmethod
    def from_table(cls, table: pa.Table) -> Columns:
        if table.schema.names != FRAGMENT_SCHEMA.names:
            raise ValueError(f"columns {table.schema.names}, expected {FRAGMENT_SCHEMA.names}")
        ints = [as_numpy(table.column(n)).astype(np.int64, copy=False) for n in _INTS]
        return cls.of(ints, table.column("path").combine_chunks().cast(pa.string()))

    @classmethod
    def from_refs(cls, version: int, refs: Sequence[FragmentRef]) -> Columns:
        return cls(np.fromiter((f.offset for f in refs), np.int64, len(refs)),
                   np.fromiter((f.rows for f in refs), np.int64, len(refs)),
                   np.fromiter((f.size for f in refs), np.int64, len(refs)),
                   np.full(len(refs), version, np.int64),
                   np.fromiter((f.crc32 for f in refs), np.int64, len(refs)),
                   strings([f.path for f in refs]))

    @classmethod
    def from_fragments(cls, fragments: Sequence[Fragment]) -> Columns:
        n = len(fragments)
        return cls.of([np.fromiter((getattr(f, k) for f in fragments), np.int64, n)
                       for k in _INTS], strings([f.path for f in fragments]))

    @classmethod
    def concat(cls, parts: Sequence[Columns]) -> Columns:
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.from_fragments([])
        return cls.of([np.concatenate([getattr(p, n) for p in parts]) for n in _INTS],
                      pa.concat_arrays([p.paths for p in parts]))


def strings(values: Sequence[str]) -> pa.StringArray:
    """``values`` as an Arrow string array, built from their UTF-8 bytes: pyarrow's
    conversion of Python objects imports pandas where it is installed (0.2-0.4 s, which a
    reader's first step waited for)."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return pa.StringArray.from_buffers(len(encoded), pa.py_buffer(offsets),
                                       pa.py_buffer(b"".join(encoded)))


def encode_segment(cols: Columns) -> bytes:
    buf = io.BytesIO()
    pq.write_table(cols.table(), buf, compression="zstd", write_page_checksum=True)
    return buf.getvalue()


def decode_segment(data: bytes) -> Columns:
    """Raises ValueError, OSError or an ArrowException when the bytes are damaged.

    Read as one file (``pq.ParquetFile``), not through ``pq.read_table``, whose dataset
    layer a process imports on first use: 25 ms added to a reader's first step on 2 cores."""
    source = pa.BufferReader(data)
    return Columns.from_table(pq.ParquetFile(source, page_checksum_verification=True).read())


Fetch = Callable[[str], bytes]


def fetch_segment(fetch: Fetch, key: str, crc: int) -> Columns:
    """Segment ``key``, fetched and checked against the CRC-32 its manifest recorded.

    Raises:
        SegmentError: it is missing, damaged or unreadable.
        StoreError: the store failed.
    """
    try:
        data = fetch(key)
    except NotFoundError:
        raise SegmentError(f"index segment {key} is missing", key) from None
    found = zlib_ng.crc32(data)
    if found != crc:
        raise SegmentError(f"index segment {key} has CRC-32 {found}, the manifest recorded "
                           f"{crc}: it is damaged", key)
    try:
        return decode_segment(data)
    except (ValueError, OSError, pa.ArrowException) as e:
        raise SegmentError(f"index segment {key} cannot be read: {e}", key) from None


def check_order(cols: Columns, where: str) -> None:
    """Raises CorruptLogError unless fragments follow each other without overlap."""
    if len(cols) > 1 and bool(np.any(cols.offset[1:] < cols.offset[:-1] + cols.rows[:-1])):
        k = int(np.argmax(cols.offset[1:] < cols.offset[:-1] + cols.rows[:-1]))
        raise CorruptLogError(f"{where}: fragments {cols.paths[k].as_py()} and "
                              f"{cols.paths[k + 1].as_py()} overlap")


def segment_fetcher(store: ObjectStore) -> Callable[[str], bytes]:
    """How an index fetches its segments: a GET of at most ``MAX_SEGMENT_BYTES``."""

    def fetch(key: str) -> bytes:
        try:
            return store.get(key, max_bytes=MAX_SEGMENT_BYTES)
        except TooLargeError as e:
            raise SegmentError(f"index segment {key} cannot be read: {e}", key) from None

    return fetch


def segment_key(lo: int, hi: int, reclaim: int, n: int) -> str:
    """Run ``n`` of the fragments committed at versions ``(lo, hi]``, less those removed by
    reclaims up to version ``reclaim`` (0: none). Unpadded: every manifest names each of its
    segments, and opening parses the names (older streams' padded ones read the same)."""
    return f"{INDEX_DIR}{lo}-{hi}-{reclaim}-{n}.parquet"


def shrunk_key(key: str, reclaim: int) -> str:
    """Segment ``key`` less the fragments removed by reclaims up to version ``reclaim``."""
    stem = key.removesuffix(".parquet").split("~")[0]
    return f"{stem}~{reclaim}.parquet"
