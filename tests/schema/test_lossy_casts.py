"""Values that a column's type cannot hold exactly are refused, naming the column, by `append`
and `Producer.write` alike, with nothing written; values it holds exactly are stored."""

from __future__ import annotations

import datetime as dt
import decimal
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import lakestream
from lakestream.errors import SchemaMismatchError
from lakestream.producers import Producer

P2 = dt.timezone(dt.timedelta(hours=2))
NOON = dt.datetime(2020, 1, 1, 12)

LOSSY: list[tuple[str, pa.DataType, Any, str]] = [
    ("fraction", pa.int64(), 1.5, "column c holds 2 values that are not whole numbers"),
    ("numpy-fraction", pa.int64(), np.float64(-0.5), "not whole numbers"),
    ("decimal-fraction", pa.int16(), decimal.Decimal("2.5"), "not whole numbers"),
    ("nan", pa.int64(), math.nan, "column c does not fit .* nan"),
    ("inf", pa.int32(), -math.inf, "column c does not fit .* -inf"),
    ("list", pa.list_(pa.int32()), [-0.7, 2.9], "column c holds 4 values that are not whole"),
    ("fixed-size-list", pa.list_(pa.int8(), 2), [1.0, 2.5], "column c holds 2 values"),
    ("struct", pa.struct([("s", pa.string()), ("a", pa.int32())]), {"s": "x", "a": 0.25},
     "column c.a holds 2 values that are not whole"),
    ("list-of-struct", pa.list_(pa.struct([("a", pa.int64())])), [{"a": 1.0}, {"a": 7.5}],
     "column c.a holds 2 values"),
    ("map-values", pa.map_(pa.string(), pa.int64()), {"k": 1.5}, r"column c \(values\) holds"),
    ("int32-overflow", pa.int32(), 2**31, "column c does not fit .*int32.* 2147483648"),
    ("int8-overflow", pa.int8(), -129, "column c does not fit .*int8"),
    ("nested-overflow", pa.list_(pa.int16()), [1, 40_000], "column c does not fit"),
    ("float32-inexact", pa.float32(), 2**24 + 1, "column c does not fit .* 16777217"),
    ("float64-inexact", pa.float64(), 2**53 + 1, "column c does not fit .* 9007199254740993"),
    ("float32-range", pa.float32(), 1e39, "column c holds 2 finite values beyond the range"),
    ("aware-to-naive", pa.timestamp("us"), dt.datetime(2020, 1, 1, tzinfo=P2),
     r"column c holds 2 datetimes with a time zone \(\+02:00\) in a column without one"),
    ("naive-to-aware", pa.timestamp("us", tz="UTC"), NOON,
     "column c holds 2 naive datetimes in a column with time zone UTC"),
    ("sub-unit", pa.timestamp("ms"), dt.datetime(2020, 1, 1, 0, 0, 0, 123_456),
     "column c holds 2 timestamps finer than ms"),
    ("time-of-day", pa.date32(), NOON, "column c holds 2 datetimes with a time of day"),
    ("nested-zone", pa.list_(pa.timestamp("us")), [dt.datetime(2020, 1, 1, tzinfo=dt.UTC)],
     "column c holds 2 datetimes with a time zone"),
    ("decimal-scale", pa.decimal128(5, 2), decimal.Decimal("1.234"), "column c does not fit"),
    ("decimal-precision", pa.decimal128(5, 2), decimal.Decimal("1234.5"),
     "column c does not fit"),
]


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("t, value, match", [c[1:] for c in LOSSY], ids=[c[0] for c in LOSSY])
def test_a_lossy_value_is_refused_naming_the_column_and_nothing_is_written(
        tmp_path: Path, t: pa.DataType, value: Any, match: str) -> None:
    schema = pa.schema([("id", pa.int64()), ("c", t)])
    s = lakestream.create(str(tmp_path / "s"), schema, global_batch_size=2)
    files = _files(tmp_path / "s")
    columns = {"id": [0, 1], "c": [value, value]}
    row_list = [{"id": 0, "c": value}, {"id": 1, "c": value}]
    for data in (columns, row_list):
        with pytest.raises(SchemaMismatchError, match=match):
            s.append(data)
    assert s.refresh() == 0 and _files(tmp_path / "s") == files
    with Producer(s.uri, "p") as p:
        version = p.stream.version
        with pytest.raises(SchemaMismatchError, match=match):
            p.write(columns)
    assert s.refresh() == version and not list(s.store.list("data/"))


def test_the_brief_example_of_floats_in_integer_columns(tmp_path: Path) -> None:
    schema = pa.schema([("prompt_id", pa.int64()), ("tokens", pa.list_(pa.int32())),
                        ("reward", pa.float32())])
    s = lakestream.create(str(tmp_path / "s"), schema, global_batch_size=4, group_size=4)
    with pytest.raises(SchemaMismatchError, match="column prompt_id holds 4 values"):
        s.append({"prompt_id": [1.5] * 4, "tokens": [[-0.7, 2.9]] * 4, "reward": [0.0] * 4})
    with pytest.raises(SchemaMismatchError, match="column tokens holds 8 values .*-0.7"):
        s.append({"prompt_id": [1] * 4, "tokens": [[-0.7, 2.9]] * 4, "reward": [0.0] * 4})
    assert s.refresh() == 0


EXACT: list[tuple[str, pa.DataType, Any, Any]] = [
    ("whole-float", pa.int64(), 2.0, 2),
    ("whole-decimal", pa.int32(), decimal.Decimal("3"), 3),
    ("whole-in-list", pa.list_(pa.int32()), [1.0, -4.0], [1, -4]),
    ("rounded-to-float32", pa.float32(), 0.1, float(np.float32(0.1))),
    ("other-zone", pa.timestamp("us", tz="UTC"), dt.datetime(2020, 1, 1, 2, tzinfo=P2),
     dt.datetime(2020, 1, 1, tzinfo=dt.UTC)),
    ("whole-ms", pa.timestamp("ms"), dt.datetime(2020, 1, 1, 0, 0, 0, 123_000),
     dt.datetime(2020, 1, 1, 0, 0, 0, 123_000)),
    ("midnight-to-date", pa.date32(), dt.datetime(2020, 1, 1), dt.date(2020, 1, 1)),
    ("str-to-binary", pa.binary(), "abc", b"abc"),
    ("null", pa.int64(), None, None),
]


@pytest.mark.parametrize("t, value, stored", [c[1:] for c in EXACT], ids=[c[0] for c in EXACT])
def test_a_value_the_type_holds_exactly_is_stored(tmp_path: Path, t: pa.DataType, value: Any,
                                                   stored: Any) -> None:
    s = lakestream.create(str(tmp_path / "s"), pa.schema([("c", t)]), global_batch_size=1)
    s.append({"c": [value]})
    got = s.read_step(0).column("c")[0].as_py()
    if isinstance(got, dt.datetime) and got.tzinfo:
        got = got.astimezone(dt.UTC)
    assert got == stored
