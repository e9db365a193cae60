"""Turning a rank's slice of a step (an Arrow table) into tensors.

Default (``collate="padded"``), for a slice of n samples:
- fixed-width columns (ints, floats, bools) -> a tensor of shape ``[n]``;
- list columns (tokens, log-probs) -> ``name``: ``[n, max_len]`` padded with 0, and
  ``name_lengths``: ``[n]`` (int64);
- strings and binaries -> a Python list of n values.

``collate="packed"`` keeps list columns jagged: ``name``: the ``[total]`` flat values and
``name_offsets``: ``[n + 1]`` (int64), sample i being ``values[offsets[i]:offsets[i+1]]``.
A callable receives the ``pyarrow.Table`` and may return anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

Collate = Callable[[pa.Table], Any]


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a list column, nulls as empty lists."""
    arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar([], arr.type))
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = np.asarray(arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])))
    return values, offsets - offsets[0]


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


def _pad(values: np.ndarray, offsets: np.ndarray, shared: bool
         ) -> tuple[torch.Tensor, np.ndarray]:
    lengths = np.diff(offsets)
    width = int(lengths.max()) if len(lengths) else 0
    tensor, out = _zeros((len(lengths), width), values.dtype, shared)
    if width:
        mask = np.arange(width)[None, :] < lengths[:, None]
        out[mask] = values
    return tensor, lengths


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
            values, offsets = _flat(col)
            if mode == "packed":
                out[field.name] = _copy(values, shared)
                out[f"{field.name}_offsets"] = _copy(offsets, shared)
            else:
                out[field.name], lengths = _pad(values, offsets, shared)
                out[f"{field.name}_lengths"] = _copy(lengths, shared)
        elif (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)) \
                and not col.null_count:
            out[field.name] = _copy(col.to_numpy(), shared)
        else:
            out[field.name] = col.to_pylist()
    return out
