"""Columns read straight from a fragment's bytes into a caller's arrays: the same values as
the decoded table's, every other layout taken the general way, a lying length prefix named,
and a mix's step laid into one array source by source."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lakestream
import lakestream.read.tensors as tensors
from lakestream import CorruptLogError, tensor_field
from lakestream.log.fragments import encode_fragment
from lakestream.read.steps import MixSteps, Source, mix_steps
from lakestream.read.tensors import Direct, copy_rows, direct_columns, plain_values

SHAPE = (4, 5)
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("score", pa.float32()),
                    pa.field("small", pa.int8()), pa.field("name", pa.string()),
                    tensor_field("x", SHAPE, "float32", nullable=True)])


def _rows(first: int, n: int, *, null_at: tuple[int, ...] = ()) -> pa.Table:
    ids = range(first, first + n)
    xs = [None if i - first in null_at else
          np.full(SHAPE, i, np.float32).tobytes() for i in ids]
    return pa.Table.from_arrays(
        [pa.array(ids, pa.int64()),
         pa.array([None if i - first in null_at else i / 2 for i in ids], pa.float32()),
         pa.array([i % 100 for i in ids], pa.int8()), pa.array([f"s{i}" for i in ids]),
         pa.array(xs, pa.binary())], schema=SCHEMA)


def _alloc(made: dict[str, np.ndarray]) -> Any:
    def alloc(name: str, rows: int) -> np.ndarray:
        nbytes = direct_columns(SCHEMA, [name])[name].nbytes
        made[name] = np.full((rows, nbytes), 0xAB, np.uint8)  # not zeros: all overwritten
        return made[name]
    return alloc


def _as(made: dict[str, np.ndarray], name: str, dtype: str) -> np.ndarray:
    return made[name].reshape(-1).view(dtype)


@pytest.mark.parametrize("null_at", [(), (1, 6)], ids=["plain pages", "nulls"])
def test_columns_read_directly_hold_what_the_decoded_table_holds(tmp_path, null_at) -> None:
    """The stream's writer lays tensor and 32/64-bit number columns out plainly, and they are
    copied from the file's bytes; a fragment with a null is decoded the general way. Either
    way the arrays hold what the table would, a null as zeros, and the table keeps only the
    other columns. Numbers are read directly only where every column read is (beside a
    column Arrow decodes, they are decoded with it)."""
    stream = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=8)
    stream.append(_rows(0, 8, null_at=null_at))
    stream.append(_rows(8, 8))
    steps = MixSteps.single(lakestream.open(stream.uri))
    for step in (0, 1):
        whole = steps.read(step, 0, 1)
        made: dict[str, np.ndarray] = {}
        rest = steps.read(step, 0, 1, alloc=_alloc(made))
        assert set(made) == {"x"}  # int8 is stored widened, strings decoded: so are numbers
        assert rest.equals(whole.select(["id", "score", "small", "name"]))
        made = {}
        rest = steps.read(step, 0, 1, ["id", "score", "x"], alloc=_alloc(made))
        assert set(made) == {"id", "score", "x"} and rest.num_columns == 0
        assert _as(made, "id", "<i8").tolist() == whole.column("id").to_pylist()
        assert _as(made, "score", "<f4").tolist() == \
            whole.column("score").fill_null(0).to_pylist()
        x = made["x"].view(np.float32).reshape(8, *SHAPE)
        for i, v in enumerate(whole.column("x").to_pylist()):
            want = np.zeros(SHAPE, np.float32) if v is None else \
                np.frombuffer(v, np.float32).reshape(SHAPE)
            assert np.array_equal(x[i], want)


def test_a_step_of_a_mix_lays_each_sources_rows_into_one_array_in_source_order(
        tmp_path) -> None:
    a = lakestream.create(str(tmp_path / "a"), SCHEMA, global_batch_size=6)
    b = lakestream.create(str(tmp_path / "b"), SCHEMA, global_batch_size=2)
    a.append(_rows(0, 12))
    b.append(_rows(1_000, 4))
    steps = mix_steps([Source(a.uri, 6), Source(b.uri, 2)],
                      [lakestream.open(a.uri), lakestream.open(b.uri)], keyed=False)
    made: dict[str, np.ndarray] = {}
    rest = steps.read(1, 1, 2, ["id", "small", "x"], alloc=_alloc(made))  # rank 1 of 2:
    assert set(made) == {"x"}  # 3 of a's, 1 of b's; small is decoded, and id with it
    assert made["x"].view(np.float32)[:, 0].tolist() == [9, 10, 11, 1_003]
    assert rest.column("id").to_pylist() == [9, 10, 11, 1_003]
    assert rest.column("small").to_pylist() == [9, 10, 11, 3]


def _parquet(table: pa.Table, **kwargs: Any) -> tuple[bytes, pq.FileMetaData]:
    sink = io.BytesIO()
    pq.write_table(table, sink, **kwargs)
    body = sink.getvalue()
    return body, pq.ParquetFile(pa.BufferReader(body)).metadata


@pytest.mark.parametrize("kwargs", [{}, {"compression": "zstd", "use_dictionary": False},
                                    {"compression": "none", "use_dictionary": True},
                                    {"compression": "none", "use_dictionary": False,
                                     "data_page_version": "2.0"}],
                         ids=["pyarrow defaults", "compressed", "dictionary", "v2 pages"])
def test_another_writers_layout_is_not_read_directly(kwargs) -> None:
    """What another writer makes (a dictionary, compression, v2 pages) is decoded the general
    way: the direct reader answers None rather than guess at the bytes."""
    table = _rows(0, 50).select(["id"])
    direct = direct_columns(SCHEMA, ["id"])["id"]
    body, md = _parquet(table, **kwargs)
    assert plain_values(body, md, 0, direct) is None


def test_the_writers_layout_is_read_directly_across_pages_and_row_groups() -> None:
    table = _rows(0, 300)
    body = bytes(encode_fragment(table, 1, compression="zstd"))
    md = pq.ParquetFile(pa.BufferReader(body)).metadata
    x = SCHEMA.names.index("x")
    direct = direct_columns(SCHEMA, ["x"])["x"]
    layout = plain_values(body, md, x, direct)
    assert layout is not None
    out = np.zeros((290 - 7, direct.nbytes), np.uint8)
    copy_rows(body, layout, 7, 290, out)
    assert out.view(np.float32).reshape(-1, *SHAPE)[:, 0, 0].tolist() == list(range(7, 290))


def test_a_length_prefix_that_lies_is_named_not_copied(tmp_path, monkeypatch) -> None:
    """A tensor value of another length written around the producer's checks: the direct
    reader sees a prefix that is not the spec's, leaves the column to the general way, and
    that names the row."""
    stream = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    bad = _rows(0, 4)
    xs = bad.column("x").to_pylist()
    xs[2] = xs[2][:-4]
    bad = bad.set_column(4, SCHEMA.field("x"), pa.array(xs, pa.binary()))
    monkeypatch.setattr("lakestream.schema.conform.check_tensor_column", lambda *a: None)
    stream.append(bad)
    steps = MixSteps.single(lakestream.open(stream.uri))
    with pytest.raises(CorruptLogError, match="column x holds a value of 76 bytes at row 2"):
        steps.read(0, 0, 1, alloc=_alloc({}))


def test_a_nullable_page_with_a_null_is_not_read_as_present() -> None:
    """Definition levels that say a row is null (one RLE run of another value, or bit-packed
    with a zero bit) are not the one run of 'present' the direct reader copies behind."""
    body = bytes(encode_fragment(_rows(0, 9, null_at=(4,)), 1, compression="none"))
    md = pq.ParquetFile(pa.BufferReader(body)).metadata
    score = SCHEMA.names.index("score")
    assert plain_values(body, md, score, Direct(4, False, "FLOAT", "<f4")) is None
    whole = bytes(encode_fragment(_rows(0, 9), 1, compression="none"))
    md = pq.ParquetFile(pa.BufferReader(whole)).metadata
    assert plain_values(whole, md, score, Direct(4, False, "FLOAT", "<f4")) is not None
    assert tensors._all_present(memoryview(b"\x02\x00\x00\x00\x12\x00"), 0, 9) == -1
