"""Turning a rank's slice of a step (an Arrow table) into tensors.

Default (``collate="padded"``), for a slice of n samples:
- fixed-width columns (ints, floats, bools) -> a tensor of shape ``[n]``, a null as 0 (False):
  a field's type never depends on whether a step holds a null;
- list columns (tokens, log-probs) -> ``name``: ``[n, max_len]`` padded with 0, and
  ``name_lengths``: ``[n]`` (int64); a null list is empty, a null value in one is 0;
- tensor columns (``lakestream.schema.tensors.tensor_field``: images, audio frames,
  embeddings) -> one contiguous ``[n, *shape]`` tensor of their dtype, copied once out of the
  decoded column (a null row is zeros);
- binary columns (encoded images, audio) -> ``name``: the ``[total]`` uint8 bytes of all rows
  and ``name_offsets``: ``[n + 1]`` (int64), row i being ``bytes[offsets[i]:offsets[i+1]]``
  (a null row is empty): no Python object per row;
- strings -> a Python list of n values.

``collate="packed"`` keeps list columns jagged too: ``name``: the ``[total]`` flat values and
``name_offsets``: ``[n + 1]`` (int64), sample i being ``values[offsets[i]:offsets[i+1]]``.
A callable receives the ``pyarrow.Table`` and may return anything.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from lakestream.errors import CorruptLogError
from lakestream.reading import (
    Direct,
    TensorSpec,
    as_numpy,
    binary_chunks,
    buffer_pool,
    copy_values,
    tensor_spec,
)

Collate = Callable[[pa.Table], Any]


SMALL_CHUNK_ROWS = 16
"""Chunks shorter than this on average are combined first: each chunk costs a few numpy
calls, and a shuffled step of one-sample groups holds about a chunk per sample."""


def _chunks(column: pa.ChunkedArray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(values, offsets) of each chunk of a list column, offsets from 0 into those values,
    null lists as empty ones and null values in them as 0: the chunks are padded or packed
    where they are, not first combined into one array (a copy of the whole column)."""
    arrays = column.chunks
    if len(arrays) > 1 and len(column) < SMALL_CHUNK_ROWS * len(arrays):
        arrays = [column.combine_chunks()]
    out = []
    for arr in arrays:
        if arr.null_count:
            arr = pc.fill_null(arr, pa.scalar([], arr.type))
        offsets = as_numpy(arr.offsets).astype(np.int64)
        values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        if values.null_count:
            values = pc.fill_null(values, pa.scalar(0).cast(values.type))
        out.append((as_numpy(values), offsets - offsets[0]))
    return out


def _zeros(shape: tuple[int, ...], dtype: np.dtype[Any], shared: bool
           ) -> tuple[torch.Tensor, np.ndarray]:
    """A zeroed tensor and a numpy view of it. ``shared``: in shared memory from the start
    (zeroed by the kernel), so that a DataLoader worker hands it to the trainer process
    without copying it there (its pickler copies every tensor not shared yet)."""
    if not shared:
        out = np.zeros(shape, dtype)
        return torch.from_numpy(out), out
    kind = torch.from_numpy(np.empty(0, dtype)).dtype
    count = int(np.prod(shape))
    storage = torch.UntypedStorage._new_shared(max(1, count * dtype.itemsize))
    tensor = torch.empty(0, dtype=kind).set_(storage)[:count].view(shape)
    return tensor, tensor.numpy()


def _copy(values: np.ndarray, shared: bool) -> torch.Tensor:
    """A writable tensor holding ``values`` (shared: see ``_zeros``)."""
    if not shared:
        return torch.from_numpy(np.array(values, copy=True))
    tensor, view = _zeros(values.shape, values.dtype, True)
    view[...] = values
    return tensor


ROW_COPY_WIDTH = 256
"""From this padded width on, rows are copied one slice at a time; below it, through a
mask of the whole ``[n, width]`` block (cheaper when rows are short and many)."""


def _pad(chunks: list[tuple[np.ndarray, np.ndarray]], dtype: np.dtype[Any], shared: bool
         ) -> tuple[torch.Tensor, np.ndarray]:
    lengths = np.concatenate([np.diff(o) for _, o in chunks]) if chunks \
        else np.zeros(0, np.int64)
    width = int(lengths.max()) if len(lengths) else 0
    tensor, out = _zeros((len(lengths), width), dtype, shared)
    row = 0
    for values, offsets in chunks:
        n = len(offsets) - 1
        if width >= ROW_COPY_WIDTH:
            bounds = offsets.tolist()
            for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                out[row + k, :b - a] = values[a:b]
        elif width:
            block = lengths[row:row + n]
            out[row:row + n][np.arange(width)[None, :] < block[:, None]] = values
        row += n
    return tensor, lengths


def _pack(chunks: list[tuple[np.ndarray, np.ndarray]], dtype: np.dtype[Any], shared: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    total = sum(len(v) for v, _ in chunks)
    tensor, out = _zeros((total,), dtype, shared)
    starts, at = [np.zeros(1, np.int64)], 0
    for values, offsets in chunks:
        out[at:at + len(values)] = values
        starts.append(offsets[1:] + at)
        at += len(values)
    return tensor, _copy(np.concatenate(starts), shared)


def _bytes(chunks: list[tuple[pa.Buffer | None, np.ndarray, np.ndarray | None]], shared: bool
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """A binary column as its concatenated bytes and ``[n + 1]`` offsets into them."""
    total = sum(int(o[-1] - o[0]) for _, o, _ in chunks)
    tensor, out = _zeros((total,), np.dtype(np.uint8), shared)
    starts, at = [np.zeros(1, np.int64)], 0
    for data, offsets, _ in chunks:
        a, b = int(offsets[0]), int(offsets[-1])
        if b > a:
            assert data is not None
            out[at:at + b - a] = np.frombuffer(data, np.uint8, b - a, a)
        starts.append(offsets[1:] - a + at)
        at += b - a
    return tensor, _copy(np.concatenate(starts), shared)


def _tensor(name: str, column: pa.ChunkedArray, spec: TensorSpec, shared: bool
            ) -> torch.Tensor:
    """A tensor column decoded into an Arrow column, as one ``[n, *shape]`` tensor (null
    rows as zeros): ``lakestream.read.tensors.copy_values``, one copy.

    Raises:
        CorruptLogError: a row that is neither a whole array nor null (a writer that went
            around the producer's checks).
    """
    n = len(column)
    tensor, out = _zeros((n, spec.nbytes), np.dtype(np.uint8), shared) if shared else \
        _empty((n, spec.nbytes))
    copy_values(column, Direct(spec.nbytes, True, "BYTE_ARRAY", "uint8"), out, name)
    return typed(tensor, spec)


def _empty(shape: tuple[int, ...]) -> tuple[torch.Tensor, np.ndarray]:
    tensor = torch.empty(shape, dtype=torch.uint8)
    return tensor, tensor.numpy()


def typed(tensor: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """``[n, nbytes]`` uint8 ``tensor`` as the ``[n, *shape]`` tensor of the spec's dtype
    (a view: no copy)."""
    n = tensor.shape[0]
    if spec.dtype == "bfloat16":
        return tensor.view(torch.int16).view(torch.bfloat16).view(n, *spec.shape)
    return tensor.view(_TORCH_DTYPES[spec.dtype]).view(n, *spec.shape)


_TORCH_DTYPES = {name: torch.from_numpy(np.empty(0, name)).dtype
                 for name in ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16",
                              "float32", "float64", "bool")}


class ColumnArrays:
    """The arrays a step's read puts the columns it reads directly in (``Steps.read``'s
    ``alloc``: tensor columns, and columns of one number a row), each made as the batch is
    delivered from: in shared memory in a DataLoader worker, pinned for a GPU, plain
    otherwise. The batch's tensors are these arrays, typed: the read's copy from the
    fragment's bytes is the only one.

    ``columns`` maps each such column to how it is read and, for a tensor column, its spec
    (None: one number a row)."""

    def __init__(self, columns: dict[str, tuple[Direct, TensorSpec | None]], *, shared: bool,
                 pinned: bool) -> None:
        self.columns, self.shared, self.pinned = columns, shared, pinned
        self.tensors: dict[str, torch.Tensor] = {}

    def __call__(self, name: str, rows: int) -> np.ndarray:
        direct, spec = self.columns[name]
        shape = (rows, direct.nbytes)
        if self.shared:
            tensor, view = _zeros(shape, np.dtype(np.uint8), True)
        elif self.pinned:  # torch's pinned allocator keeps and reuses its blocks
            tensor = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
            view = tensor.numpy()
        else:  # a block the reader fills again once the batch is let go: no fresh pages
            view = buffer_pool().array(shape[0] * shape[1]).reshape(shape)
            tensor = torch.from_numpy(view)
        self.tensors[name] = typed(tensor, spec) if spec is not None else \
            tensor.view(_TORCH_DTYPES[np.dtype(direct.dtype).name]).view(rows)
        return view


def collate_table(table: pa.Table, mode: str = "padded", *,
                  shared: bool = False) -> dict[str, Any]:
    """The default collate (see the module docstring for shapes). ``shared`` puts the
    tensors in shared memory as they are made: what a DataLoader worker sends the trainer
    process then crosses without another copy."""
    if mode not in ("padded", "packed"):
        raise ValueError(f"collate must be 'padded', 'packed' or a callable, got {mode!r}")
    out: dict[str, Any] = {}
    for field in table.schema:
        col = table.column(field.name)
        t = field.type
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            if not (pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)
                    or pa.types.is_boolean(t.value_type)):
                out[field.name] = col.to_pylist()
                continue
            chunks = _chunks(col)
            dtype = np.dtype(t.value_type.to_pandas_dtype())
            if mode == "packed":
                out[field.name], out[f"{field.name}_offsets"] = _pack(chunks, dtype, shared)
            else:
                out[field.name], lengths = _pad(chunks, dtype, shared)
                out[f"{field.name}_lengths"] = _copy(lengths, shared)
        elif pa.types.is_binary(t):
            try:
                spec = tensor_spec(field)
            except ValueError as e:  # the schema came from the store: damage, not a bug
                raise CorruptLogError(f"the stream's schema: {e}") from None
            if spec is not None:
                out[field.name] = _tensor(field.name, col, spec, shared)
            else:
                out[field.name], out[f"{field.name}_offsets"] = _bytes(binary_chunks(col),
                                                                        shared)
        elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            # Nulls as 0 (False): the rule of every step, not only those holding a null.
            if col.null_count and pa.types.is_boolean(t):
                col = col.fill_null(pa.scalar(False, t))
            out[field.name] = _copy(as_numpy(col, fill=0), shared)
        else:
            out[field.name] = col.to_pylist()
    return out


class Batch(dict[str, Any]):
    """A batch as a ``StreamDataset`` yields it: a dict, which a ``DataLoader``'s own
    batching refuses. The dataset yields whole batches (this rank's slice of a step), so a
    loader's ``batch_size=1`` (its default) would stack each into a new leading dimension,
    and ``batch_size=32`` 32 steps into one: ``default_collate`` copies a dict batch before
    filling it, and that copy raises, naming the fix. Every other copy (``default_convert``
    with ``batch_size=None``, pinning, a user's ``copy.copy``) is a plain copy."""

    def __copy__(self) -> Batch:
        copier = sys._getframe(1)  # copy.copy, or whoever called __copy__ itself
        caller = copier.f_back
        if caller is not None and caller.f_code.co_name == "collate" and \
                caller.f_globals.get("__name__") == "torch.utils.data._utils.collate":
            raise ValueError(
                "a StreamDataset yields whole batches (this rank's slice of each step): a "
                "DataLoader's own batching would stack them into a new leading dimension. "
                "Pass DataLoader(ds, batch_size=None), or StreamLoader(ds); to choose the "
                "batch size, pass StreamDataset(..., batch_size=n)")
        return Batch(self)

