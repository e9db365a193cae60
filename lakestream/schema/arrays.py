"""Arrow arrays as NumPy arrays without pyarrow's conversion, which imports pandas where it is
installed: 0.2-0.4 s and 53 MB, which a tailing reader's first step waited for, in a process
that needs nothing else of pandas."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def as_numpy(arr: pa.Array | pa.ChunkedArray, fill: float | None = None) -> np.ndarray:
    """``arr`` as numpy: an integer or floating array viewed from its buffer (a chunked one
    combined first), its nulls, if it has any, replaced by ``fill`` (in a copy) where one is
    given; anything else converted by pyarrow (nulls and all)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    t = arr.type
    nulls = arr.null_count
    if nulls and fill is None or not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return arr.to_numpy(zero_copy_only=False)
    kind = "f" if pa.types.is_floating(t) else "i" if pa.types.is_signed_integer(t) else "u"
    dtype = np.dtype(f"<{kind}{t.bit_width // 8}")
    values = np.frombuffer(arr.buffers()[1], dtype, len(arr), arr.offset * dtype.itemsize)
    if not nulls:
        return values
    # Filled here, not by pyarrow's fill_null: its scalar, made from a Python value, is a
    # conversion too.
    bits = np.unpackbits(np.frombuffer(arr.buffers()[0], np.uint8), bitorder="little")
    valid = bits[arr.offset:arr.offset + len(arr)].astype(bool)
    return np.where(valid, values, np.asarray(fill, dtype))
