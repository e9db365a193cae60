"""Tensor columns: fixed-shape arrays (pixels, spectrograms, embeddings) stored one per row as
the raw bytes of a ``binary`` column, their shape and dtype in the field's metadata.

A ``binary`` column is what every Delta reader reads (Delta has no unsigned or tensor type),
and its bytes are the array's bytes, C order: a producer hands a ``[n, *shape]`` numpy array
and the column wraps its buffer (no per-row object, no copy when it is contiguous); a reader
turns a step's rows into one ``[n, *shape]`` tensor with one copy (``loaders/collate.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from lakestream.errors import SchemaMismatchError
from lakestream.store.parse import loads

TENSOR_KEY = b"lakestream.tensor"
"""Field metadata: ``{"shape": [224, 224, 3], "dtype": "uint8"}`` (JSON) on a ``binary``
column makes it a tensor column: every value holds exactly that array's bytes."""

DTYPES = ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "bfloat16",
          "float32", "float64", "bool")
"""Element types a tensor column may hold (``bfloat16`` as its 2 raw bytes)."""


MAX_TENSOR_DIMS = 32
MAX_TENSOR_BYTES = (1 << 31) - 1
"""The largest value of a tensor column: a ``binary`` column's offsets are 32-bit."""


class TensorSpec:
    """A tensor column's shape and element type."""

    def __init__(self, shape: Sequence[int], dtype: str) -> None:
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ValueError(f"tensor dtype {str(dtype)[:40]!r} is not one of {list(DTYPES)}")
        if not shape or len(shape) > MAX_TENSOR_DIMS \
                or not all(isinstance(d, int) and not isinstance(d, bool)
                           and 0 < d <= MAX_TENSOR_BYTES for d in shape):
            raise ValueError(f"tensor shape must be a tuple of 1 to {MAX_TENSOR_DIMS} positive "
                             f"ints, got {str(tuple(shape))[:80]}")
        self.shape, self.dtype = tuple(shape), dtype
        self.itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
        self.nbytes = math.prod(self.shape) * self.itemsize
        """Bytes of one value."""
        if self.nbytes > MAX_TENSOR_BYTES:
            raise ValueError(f"a {self.shape} {dtype} tensor is {self.nbytes:,} bytes, over "
                             f"the {MAX_TENSOR_BYTES:,} a binary column's value may hold")

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The numpy type of the elements (``uint16`` for ``bfloat16``'s raw bytes)."""
        return np.dtype("uint16" if self.dtype == "bfloat16" else self.dtype)

    def encode(self) -> bytes:
        return json.dumps({"shape": list(self.shape), "dtype": self.dtype}).encode()

    def __repr__(self) -> str:
        return f"TensorSpec({self.shape}, {self.dtype!r})"


def tensor_field(name: str, shape: Sequence[int], dtype: str = "uint8", *,
                 nullable: bool = False) -> pa.Field:
    """A tensor column for a stream's schema: each row one ``shape`` array of ``dtype``.

    Example: ``tensor_field("image", (224, 224, 3))`` for raw RGB pixels.

    Raises:
        ValueError: a dtype not in ``DTYPES`` or a shape that is not positive ints.
    """
    spec = TensorSpec(tuple(shape), dtype)
    return pa.field(name, pa.binary(), nullable=nullable, metadata={TENSOR_KEY: spec.encode()})


def tensor_spec(field: pa.Field) -> TensorSpec | None:
    """The tensor spec of a field, None if it is not a tensor column.

    Raises:
        ValueError: the field's tensor metadata is malformed or on another type than binary.
    """
    raw = (field.metadata or {}).get(TENSOR_KEY)
    if raw is None:
        return None
    if not pa.types.is_binary(field.type):
        raise ValueError(f"column {field.name}: tensor metadata needs a binary column, "
                         f"got {field.type}; use tensor_field({field.name!r}, shape, dtype)")
    try:
        meta = loads(raw)
        return TensorSpec(tuple(meta["shape"]), meta["dtype"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"column {field.name}: malformed {TENSOR_KEY.decode()} metadata "
                         f"{raw[:200]!r}: {e}") from e


def tensor_column(values: Any, spec: TensorSpec, name: str, where: str) -> pa.Array | None:
    """``values`` as a tensor column's binary array without a per-row object: a ``[n, *shape]``
    numpy array or a list of ``shape`` arrays, copied once into the column's buffer (so
    that the caller may reuse its array as soon as ``write`` returns). None when ``values``
    is neither (bytes, Arrow): those go the general way and are checked by
    ``check_tensor_column``.

    Raises:
        SchemaMismatchError: an array of another shape or dtype.
    """
    if isinstance(values, np.ndarray):
        array = values
    elif isinstance(values, (list, tuple)) and values and \
            all(isinstance(v, np.ndarray) for v in values):
        shapes = {v.shape for v in values}
        if len(shapes) != 1 or next(iter(shapes)) != spec.shape:
            raise SchemaMismatchError(
                f"{where}: column {name} holds arrays of shapes {sorted(shapes)[:3]}; the "
                f"stream stores {spec.shape} ({spec.dtype})")
        array = np.stack(values)  # the one copy
    else:
        return None
    if array.shape[1:] != spec.shape or array.dtype != spec.numpy_dtype:
        raise SchemaMismatchError(
            f"{where}: column {name} got an array of shape {array.shape} and dtype "
            f"{array.dtype}; the stream stores [n, *{spec.shape}] of {spec.dtype} "
            f"(convert with .astype(np.{spec.numpy_dtype}) or reshape)")
    if isinstance(values, np.ndarray):
        array = np.array(array, order="C", copy=True)  # the one copy
    n = len(array)
    offsets = np.arange(0, (n + 1) * spec.nbytes, spec.nbytes, dtype=np.int64)
    if offsets[-1] > np.iinfo(np.int32).max:
        raise SchemaMismatchError(
            f"{where}: column {name}: {n} values of {spec.nbytes} bytes exceed a binary "
            "column's 2 GiB per write; write fewer rows at a time")
    data = pa.py_buffer(array.reshape(-1).view(np.uint8)) if n else pa.py_buffer(b"")
    return pa.Array.from_buffers(pa.binary(), n,
                                 [None, pa.py_buffer(offsets.astype(np.int32)), data])


def check_tensor_column(column: pa.ChunkedArray | pa.Array, spec: TensorSpec, name: str,
                        where: str) -> None:
    """Every non-null value of a tensor column holds exactly one array's bytes.

    Raises:
        SchemaMismatchError: a value of another length, naming the first.
    """
    import pyarrow.compute as pc

    lengths = pc.binary_length(column)
    wrong = pc.and_(pc.is_valid(lengths), pc.not_equal(lengths, spec.nbytes))
    if pc.any(wrong).as_py():
        i = pc.index(wrong, True).as_py()
        raise SchemaMismatchError(
            f"{where}: column {name} row {i} holds {lengths[i].as_py()} bytes; a "
            f"{spec.shape} {spec.dtype} tensor is {spec.nbytes} bytes")
