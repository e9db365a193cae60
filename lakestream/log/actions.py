"""The Delta Lake actions a log entry writes, as lines: its ``add`` lines (formatted
directly, an append carrying hundreds), ``remove`` actions, and the ``protocol`` that keeps
other Delta writers out (``log/codec.py`` puts an entry's lines together)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from lakestream.log.entries import FragmentRef
from lakestream.schema.delta import delta_table_features


def dump_line(action: dict[str, Any]) -> str:
    """One line of an entry: compact JSON (NaN refused, so that every line is JSON)."""
    return json.dumps(action, separators=(",", ":"), allow_nan=False)


def add_line(f: FragmentRef, now_ms: int) -> str:
    """The add action of ``f`` as one line, formatted directly rather than built as a dict
    and serialised (an append carries hundreds); it is exactly ``dump_line`` of that dict::

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


def fragment_tags(f: FragmentRef) -> dict[str, str]:
    return {"lakestream.offset": str(f.offset), "lakestream.rows": str(f.rows),
            "lakestream.seq": str(f.seq), "lakestream.crc32": str(f.crc32)}


VOID_TAG = "lakestream.void"
"""On a reclaim's ``remove`` of a void append's file: it leaves the list of void files, never
the index (a live fragment of the same path stays live)."""


def remove_action(f: FragmentRef, now_ms: int, void: bool = False) -> dict[str, Any]:
    tags = fragment_tags(f)
    if void:
        tags[VOID_TAG] = "true"
    return {"remove": {
        "path": f.path,
        "deletionTimestamp": now_ms,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {},
        "size": f.size,
        "tags": tags,
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
