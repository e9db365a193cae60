"""Tensor and binary columns: a schema declares them, a producer writes numpy arrays into them
with one copy and refuses arrays of another shape or dtype, fragments store them uncompressed,
and Delta readers read the table with the shape and dtype in the field's metadata."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lakestream
from lakestream import SchemaMismatchError, tensor_field
from lakestream.log.fragments import encode_fragment
from lakestream.schema.conform import conform, validate_schema
from lakestream.schema.delta import delta_schema_string
from lakestream.schema.tensors import TENSOR_KEY, tensor_spec
from tests.log.test_delta import delta_read

SHAPE = (4, 5, 3)
SCHEMA = pa.schema([tensor_field("image", SHAPE), pa.field("label", pa.int64())])


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, *SHAPE), dtype=np.uint8)


def _values(table: pa.Table) -> np.ndarray:
    """The image column's rows as one array, read back through its bytes."""
    col = table.column("image").combine_chunks()
    return np.stack([np.frombuffer(v.as_py(), np.uint8).reshape(SHAPE) for v in col])


def test_a_tensor_field_is_binary_with_its_shape_and_dtype() -> None:
    f = tensor_field("x", (2, 3), "float32")
    assert f.type == pa.binary() and not f.nullable
    assert json.loads(f.metadata[TENSOR_KEY]) == {"shape": [2, 3], "dtype": "float32"}
    spec = tensor_spec(f)
    assert spec is not None and spec.nbytes == 24 and spec.numpy_dtype == np.float32
    assert tensor_spec(pa.field("y", pa.binary())) is None


@pytest.mark.parametrize("shape, dtype, match", [
    ((), "uint8", "tuple of 1 to 32 positive ints"),
    ((0, 3), "uint8", "positive ints"),
    ((2, True), "uint8", "positive ints"),
    ((2,), "complex64", "not one of"),
])
def test_a_bad_tensor_field_is_refused(shape: tuple[int, ...], dtype: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tensor_field("x", shape, dtype)


@pytest.mark.parametrize("field, match", [
    (pa.field("x", pa.string(), metadata={TENSOR_KEY: b'{"shape":[2],"dtype":"uint8"}'}),
     "needs a binary column"),
    (pa.field("x", pa.binary(), metadata={TENSOR_KEY: b"{not json"}), "malformed"),
    (pa.field("x", pa.binary(), metadata={TENSOR_KEY: b'{"shape":[2]}'}), "malformed"),
])
def test_a_schema_with_malformed_tensor_metadata_is_refused(field: pa.Field, match: str
                                                            ) -> None:
    with pytest.raises(ValueError, match=match):
        validate_schema(pa.schema([field]))


def test_a_numpy_batch_is_copied_once_and_the_caller_may_reuse_it() -> None:
    images = _images(6)
    expected = images.copy()
    table = conform({"image": images, "label": np.arange(6)}, SCHEMA, where="write")
    images[:] = 0  # reused by the caller for its next batch
    assert np.array_equal(_values(table), expected)
    assert table.column("image").chunk(0).buffers()[2].size == expected.nbytes


def test_a_list_of_arrays_rows_or_bytes_write_the_same_column() -> None:
    images = _images(3)
    want = conform({"image": images, "label": [0, 1, 2]}, SCHEMA, where="w")
    as_list = conform({"image": list(images), "label": [0, 1, 2]}, SCHEMA, where="w")
    rows = conform([{"image": img, "label": i} for i, img in enumerate(images)], SCHEMA,
                   where="w")
    as_bytes = conform({"image": [img.tobytes() for img in images], "label": [0, 1, 2]},
                       SCHEMA, where="w")
    strided = conform({"image": np.asfortranarray(images), "label": [0, 1, 2]}, SCHEMA,
                      where="w")
    for got in (as_list, rows, as_bytes, strided):
        assert got.equals(want)


@pytest.mark.parametrize("images, match", [
    (np.zeros((2, 4, 5), np.uint8), r"shape \(2, 4, 5\)"),
    (np.zeros((2, *SHAPE), np.float32), "dtype float32"),
    ([np.zeros(SHAPE, np.uint8), np.zeros((4, 5, 4), np.uint8)], "arrays of shapes"),
    ([b"\x00" * 60, b"\x00" * 59], "row 1 holds 59 bytes"),
])
def test_arrays_of_another_shape_or_dtype_are_refused_with_the_column_named(
        tmp_path: Path, images: object, match: str) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=2, group_size=1)
    with pytest.raises(SchemaMismatchError, match=f"column image.*{match}|{match}"):
        s.append({"image": images, "label": [0, 1]})
    assert s.refresh() == 0 and s.num_samples == 0  # the stream is unchanged


def test_an_arrow_table_with_wrong_lengths_is_refused() -> None:
    bad = pa.table({"image": pa.array([b"\x00" * 60, b"\x00" * 61]), "label": [0, 1]},
                   schema=SCHEMA)
    with pytest.raises(SchemaMismatchError, match="row 1 holds 61 bytes"):
        conform(bad, SCHEMA, where="write")


def test_a_nullable_tensor_column_keeps_nulls() -> None:
    schema = pa.schema([tensor_field("image", SHAPE, nullable=True)])
    table = conform({"image": [_images(1)[0].tobytes(), None]}, schema, where="w")
    assert table.column("image").null_count == 1


def test_binary_and_fixed_width_columns_are_stored_uncompressed_and_the_others_compressed(
        ) -> None:
    """Regression: beside a binary column, a list column's codec was keyed by its name, not
    its leaf's path, matched nothing, and its tokens were stored uncompressed."""
    schema = pa.schema([*SCHEMA, pa.field("tokens", pa.list_(pa.int32()))])
    table = conform({"image": _images(8), "label": np.arange(8),
                     "tokens": [[k] * 100 for k in range(8)]}, schema, where="w")
    md = pq.ParquetFile(io.BytesIO(bytes(encode_fragment(table, 1)))).metadata
    codecs = {md.row_group(0).column(i).path_in_schema: md.row_group(0).column(i).compression
              for i in range(md.num_columns)}
    assert codecs == {"image": "UNCOMPRESSED", "label": "UNCOMPRESSED",
                      "tokens.list.element": "ZSTD"}
    only_binary = pa.table({"b": pa.array([b"x", b"y"])})
    pq.ParquetFile(io.BytesIO(bytes(encode_fragment(only_binary, 1))))  # writes at all


def test_delta_readers_read_the_bytes_and_see_the_shape(tmp_path: Path) -> None:
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=2, group_size=1)
    images = _images(4)
    s.append({"image": images, "label": np.arange(4)})
    field = json.loads(delta_schema_string(SCHEMA))["fields"][0]
    assert json.loads(field["metadata"]["lakestream.tensor"]) == {"shape": list(SHAPE),
                                                                   "dtype": "uint8"}
    table = delta_read(uri)["table"].sort_by("label")
    assert np.array_equal(_values(table), images)
