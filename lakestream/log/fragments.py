"""Fragment files as the log names them: their keys (``data/<producer>/<epoch>-<seq>-<uuid>
.parquet``), encoding a table as one Parquet file, and putting it (docs/design.md §2)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lakestream.errors import AlreadyExistsError
from lakestream.schema.tensors import tensor_spec
from lakestream.store.base import ObjectStore

ROW_GROUP_TARGET_BYTES = 1 << 20
"""Row groups of about 1 MiB (decoded) let a rank slice read little of a large fragment."""
TENSOR_ROW_GROUP_BYTES = 4 << 20
"""Row groups of a table with a tensor column: its values are copied from the file without
a decode (``lakestream.read.tensors``), and each row group costs the reader's thread a page
header to parse and a copy to start, under the GIL; a 9.6 MB batch of 64 images came in
eleven row groups at 1 MiB, three at 4 MiB."""
ENCODE_SLACK_BYTES, COLUMN_SLACK_BYTES = 64 << 10, 1 << 10
"""Room past an eighth over a table's Arrow size that its encoding is given, and more per
column (levels, page headers, the footer): a file that does not fit is encoded again into a
buffer that grows."""
WHOLE_FILE_BYTES = 8 << 20
"""Fragments up to this size are read whole, in one GET, and checked against their CRC-32;
larger ones are read by row group, their pages checked by Parquet's page checksums."""


def put_fragment(store: ObjectStore, key: str, body: bytes | memoryview) -> None:
    """Creates the fragment at ``key`` (a key only this writer names, see ``fragment_key``).

    A 412 can only be our own earlier attempt, retried after its reply was lost: the object
    is ours, and the put succeeded.
    """
    try:
        store.put(key, body, mode="create")
    except AlreadyExistsError:
        pass


def check_rows(rows: int, group_size: int, where: str) -> int:
    """Returns ``rows`` if a fragment may hold that many: a positive multiple of the group
    size, so that no group is cut between fragments (or steps, or ranks).

    Raises:
        ValueError: it may not; the message starts with ``where``.
    """
    if rows == 0 or rows % group_size:
        raise ValueError(f"{where}: {rows} rows is not a positive multiple of the group size "
                         f"{group_size}")
    return rows


MOSTLY_READ_MAX_BYTES = 256 << 20
"""The largest fragment read whole because most of its rows are wanted."""


def read_whole(size: int, wanted: float = 0.0) -> bool:
    """Whether a fragment of ``size`` bytes is read whole, in one GET, and checked against the
    CRC-32 its commit records: up to ``WHOLE_FILE_BYTES``, or up to ``MOSTLY_READ_MAX_BYTES``
    when at least half its rows are ``wanted`` (a fraction); otherwise it is read by row
    group, its pages checked by the Parquet page checksums ``encode_fragment`` writes past
    ``WHOLE_FILE_BYTES``. (Read whole, a 9.6 MB fragment of 64 images costs 0.44 CPU-s/GB
    to fetch and check; by its eleven 1 MiB row groups, 1.1.)"""
    return size <= WHOLE_FILE_BYTES or (wanted >= 0.5 and size <= MOSTLY_READ_MAX_BYTES)


def _is_tensor(field: pa.Field) -> bool:
    try:
        return tensor_spec(field) is not None
    except ValueError:
        return False  # malformed metadata: the schema's checks say what is wrong


def _fixed_width(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) \
        or pa.types.is_temporal(t) and not pa.types.is_interval(t)


def _is_nested(t: pa.DataType) -> bool:
    return pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def row_group_target(schema: pa.Schema) -> int:
    """The decoded bytes a row group of a table of ``schema`` aims at: 4 MiB with a tensor
    column (``TENSOR_ROW_GROUP_BYTES``), else 1 MiB. A writer asks once per schema: the
    scan of its fields' metadata took 10 us, a write's whole size check about 40."""
    return TENSOR_ROW_GROUP_BYTES if any(_is_tensor(f) for f in schema) \
        else ROW_GROUP_TARGET_BYTES


def encode_fragment(table: pa.Table, group_size: int, *, compression: str = "zstd",
                    compression_level: int | None = 1, nbytes: int | None = None,
                    row_group_bytes: int | None = None) -> memoryview:
    """Parquet bytes for ``table``, with row groups aligned to ``group_size``: a view of
    Arrow's buffer, not a copy (stores, ``zlib_ng.crc32`` and files take it as it is).

    Statistics are kept for scalar columns, dictionary encoding for those that are not
    fixed-width numbers (strings repeat and are cheap to encode); both are off for list and
    binary columns (tokens, log-probs, images), where they cost time and save little, and
    fixed-width numbers (ids, rewards, versions: a few bytes a row) are stored PLAIN and
    uncompressed, so that a reader copies them straight from the file's bytes
    (``lakestream.read.tensors``). Binary columns (images, audio,
    tensors: encoded media does not compress, raw pixels little for the time it takes) are
    stored uncompressed, so that writing them costs about a copy.

    Every byte stays checked on read: a fragment up to ``WHOLE_FILE_BYTES`` is read whole
    and checked against the CRC-32 its commit records, so only larger ones carry Parquet
    page checksums (their row groups are read alone). One that grows past the bound
    despite a small table is encoded again, with them.

    ``nbytes`` is ``table.nbytes`` when the caller has it: Arrow walks every column to
    compute it (about 14 µs for a 16-sample RL fragment, a third of its size check);
    ``row_group_bytes`` is ``row_group_target(table.schema)``, likewise.
    """
    n = table.num_rows
    if nbytes is None:
        nbytes = table.nbytes
    per_row = max(1, nbytes // max(1, n))
    target = row_group_target(table.schema) if row_group_bytes is None else row_group_bytes
    rows = max(group_size, (target // per_row) // group_size * group_size)
    scalar = [f.name for f in table.schema if not _is_nested(f.type)]
    dictionary = [name for name in scalar if not _fixed_width(table.schema.field(name).type)]
    checksums = nbytes > WHOLE_FILE_BYTES // 2
    codecs, level = _codecs(table.schema, compression, compression_level)
    room = nbytes + nbytes // 8 + ENCODE_SLACK_BYTES + COLUMN_SLACK_BYTES * table.num_columns
    while True:
        body = _write_parquet(table, room, row_group_size=rows, compression=codecs,
                              compression_level=level, use_dictionary=dictionary,
                              write_statistics=scalar, write_page_checksum=checksums)
        if checksums or read_whole(len(body)):
            return body
        checksums = True


def _codecs(schema: pa.Schema, compression: str, level: int | None
            ) -> tuple[str | dict[str, str], int | dict[str, int] | None]:
    """The codec of each column and the level of those compressed: ``compression`` for all
    but binary columns and columns of one fixed-width value a row (ids, rewards, versions),
    which are stored as they are: a few bytes a row gain nothing from a codec, and a
    reader bounds what an uncompressed fixed-width chunk decodes to from its footer alone,
    without parsing its pages (``lakestream.read.bounds.decoded_bound``)."""
    raw = [f.name for f in schema if pa.types.is_binary(f.type)
           or pa.types.is_large_binary(f.type) or _fixed_width(f.type)]
    if compression == "none" or not raw:
        return compression, None if compression == "none" else level
    # Keyed by Parquet column (leaf) paths: a key naming a list column by its own name
    # matched none of its leaves, which were then left uncompressed.
    codecs = {path: "none" if f.name in raw else compression
              for f in schema for path in _leaf_paths(f.name, f.type)}
    levels = None if level is None else {n: level for n, c in codecs.items() if c != "none"}
    return codecs, levels


def _leaf_paths(name: str, t: pa.DataType) -> list[str]:
    """The Parquet column paths a field of type ``t`` is stored in (as pyarrow names them)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _leaf_paths(f"{name}.list.element", t.value_type)
    if pa.types.is_map(t):
        return _leaf_paths(f"{name}.key_value.key", t.key_type) + \
            _leaf_paths(f"{name}.key_value.value", t.item_type)
    if pa.types.is_struct(t):
        return [p for i in range(t.num_fields)
                for p in _leaf_paths(f"{name}.{t.field(i).name}", t.field(i).type)]
    return [name]


def _write_parquet(table: pa.Table, capacity: int, **options: Any) -> memoryview:
    """``pq.write_table`` into a buffer of ``capacity`` bytes allocated once; into one that
    grows (by doubling, each time copying what it holds) only if the file is larger."""
    buffer = pa.allocate_buffer(capacity)
    sink = pa.FixedSizeBufferWriter(buffer)
    try:
        pq.write_table(table, sink, **options)
    except OSError:  # past the end of the buffer (a codec's failure raises again below)
        grown = pa.BufferOutputStream()
        pq.write_table(table, grown, **options)
        return memoryview(grown.getvalue()).cast("B")
    return memoryview(buffer.slice(0, sink.tell())).cast("B")
