"""Writing fragments: one encoding into a buffer sized from the table, and the checksums the
commit records being CRC-32 as zlib computes it."""

from __future__ import annotations

import zlib

import pyarrow as pa
import pyarrow.parquet as pq

import lakestream
import lakestream.log.fragments as fragment
from lakestream.log.fragments import encode_fragment


def _table(n: int, width: int) -> pa.Table:
    return pa.table({"id": pa.array(range(n), pa.int64()),
                     "tokens": pa.array([list(range(i, i + width)) for i in range(n)],
                                        pa.list_(pa.int32()))})


def test_a_fragment_is_encoded_once_into_room_sized_from_its_table(monkeypatch) -> None:
    """The encoder writes into one buffer sized from the table; a file that outgrows it (here
    a small table given no room past an eighth over its size, where the footer alone is
    larger) is encoded again into one that grows, and comes out the same."""
    calls: list[int] = []
    real = pq.write_table

    def counted(*args, **kwargs) -> None:
        calls.append(1)
        real(*args, **kwargs)

    monkeypatch.setattr(fragment.pq, "write_table", counted)
    table = _table(64, 256)
    body = bytes(encode_fragment(table, 4, compression="none"))
    assert len(calls) == 1 and pq.read_table(pa.BufferReader(body)).equals(table)
    monkeypatch.setattr(fragment, "ENCODE_SLACK_BYTES", 0)
    monkeypatch.setattr(fragment, "COLUMN_SLACK_BYTES", 0)
    small = _table(4, 2)
    calls.clear()
    tight = bytes(encode_fragment(small, 4, compression="none"))
    assert len(calls) == 2 and len(tight) > small.nbytes * 2
    assert pq.read_table(pa.BufferReader(tight)).equals(small)


def test_the_checksums_recorded_are_zlib_crc32(tmp_path) -> None:
    """A fragment's checksum in its add action, and the entry's own, are CRC-32 as zlib
    computes it: what streams written before carry, and what any other reader recomputes."""
    import json

    from lakestream.producers import Producer
    from tests.helpers import SCHEMA, rows

    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    with Producer(uri, "w") as p:
        p.write(rows(0, 4))
    entry = (tmp_path / "s" / "_delta_log" / f"{2:020d}.json").read_bytes()
    lines = [json.loads(line) for line in entry.splitlines()]
    add = next(a["add"] for a in lines if "add" in a)
    body = (tmp_path / "s" / add["path"]).read_bytes()
    assert add["tags"]["lakestream.crc32"] == str(zlib.crc32(body))
    stored = lines[0]["commitInfo"]["lakestream"]["crc32"]
    compact = [lines[0] | {"commitInfo": lines[0]["commitInfo"] | {"lakestream": {
        k: v for k, v in lines[0]["commitInfo"]["lakestream"].items() if k != "crc32"}}},
        *lines[1:]]
    assert stored == zlib.crc32("\n".join(json.dumps(a, separators=(",", ":"))
                                          for a in compact).encode())


def test_a_table_with_a_tensor_column_gets_fewer_larger_row_groups() -> None:
    """Tensor values are copied from the file without a decode; each row group costs the
    reader a page header and a copy under the GIL, so those tables get 4 MiB row groups where
    others keep 1 MiB (a rank's slice of a large fragment still reads little of it)."""
    import numpy as np

    image = lakestream.tensor_field("image", (224, 224, 3))
    pixels = [np.zeros(224 * 224 * 3, np.uint8).tobytes()] * 64
    tensors = pa.table({"image": pa.array(pixels, pa.binary())}, schema=pa.schema([image]))
    blobs = pa.table({"blob": pa.array(pixels, pa.binary())})
    rows_of = {name: [md.row_group(g).num_rows for g in range(md.num_row_groups)]
               for name, md in (("tensors", pq.ParquetFile(pa.BufferReader(
                   encode_fragment(tensors, 1))).metadata),
                                ("blobs", pq.ParquetFile(pa.BufferReader(
                                    encode_fragment(blobs, 1))).metadata))}
    assert rows_of["tensors"] == [27, 27, 10]  # 4 MiB of 150,528-byte rows: 27 a group
    assert rows_of["blobs"] == [6] * 10 + [4]
