"""``as_numpy``: Arrow number arrays as NumPy from their buffers, nulls filled where asked,
exactly as pyarrow's own conversion and ``fill_null`` give them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lakestream.schema.arrays import as_numpy

TYPES = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.uint64(), pa.float32(),
         pa.float64()]


@pytest.mark.parametrize("t", TYPES, ids=str)
@pytest.mark.parametrize("start", [0, 3, 9])
def test_numbers_with_nulls_sliced_and_chunked_come_back_as_filled_by_pyarrow(
        t: pa.DataType, start: int) -> None:
    values = [None if i % 5 == 2 else i for i in range(40)]
    whole = pa.array(values, t)
    for arr in (whole.slice(start, 25),
                pa.chunked_array([whole.slice(start, 10), whole.slice(start + 10, 15)])):
        got = as_numpy(arr, fill=7)
        want = arr.fill_null(pa.scalar(7, t)).to_numpy()
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_without_nulls_the_array_is_a_view_of_the_buffer() -> None:
    arr = pa.array(np.arange(10, dtype=np.int64)).slice(2, 5)
    got = as_numpy(arr, fill=0)
    assert not got.flags.owndata and got.tolist() == [2, 3, 4, 5, 6]


def test_nulls_without_a_fill_and_other_types_are_pyarrow_s_conversion() -> None:
    with_nulls = pa.array([1.0, None], pa.float64())
    assert np.isnan(as_numpy(with_nulls)[1])
    assert as_numpy(pa.array([True, False])).tolist() == [True, False]
