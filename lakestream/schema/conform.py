"""Checking data against a stream's schema: the schema itself, then every write's columns,
types, values and sizes, before anything is uploaded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakestream.errors import SchemaMismatchError
from lakestream.schema.casts import conversion_loss
from lakestream.schema.delta import delta_type
from lakestream.schema.tensors import check_tensor_column, tensor_column, tensor_spec


def validate_schema(schema: pa.Schema) -> pa.Schema:
    """Checks a schema can be a stream's schema.

    Raises:
        ValueError: no columns, duplicate names, a type Delta cannot represent, or malformed
            tensor metadata.
    """
    if not isinstance(schema, pa.Schema):
        raise TypeError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    if len(schema) == 0:
        raise ValueError("a stream schema needs at least one column")
    names = schema.names
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"schema has duplicate column names: {dupes}")
    for f in schema:
        delta_type(f.type)
        tensor_spec(f)
    return schema


def _as_table(data: Any, schema: pa.Schema, where: str) -> pa.Table:
    """``data`` as a table, its columns built in ``schema``'s types where it is Python."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        rows = list(data)
        if rows and not all(isinstance(r, Mapping) for r in rows):
            raise TypeError("a list of samples must hold dicts (one per row)")
        for r in rows:
            if set(r) != set(schema.names):
                _check_names(list(r), schema, where, ordered=False)
        return _build({n: [r[n] for r in rows] for n in schema.names}, schema, where)
    if isinstance(data, Mapping):
        _check_names(list(data), schema, where, ordered=False)
        return _build({n: data[n] for n in schema.names}, schema, where)
    raise TypeError(
        f"cannot write a {type(data).__name__}: pass a pyarrow Table or RecordBatch, "
        "a list of row dicts, or a dict of columns")


def conform(data: Any, schema: pa.Schema, *, where: str) -> pa.Table:
    """Turns ``data`` (a Table, RecordBatch, list of row dicts or dict of columns) into a
    Table with exactly ``schema``.

    Python values are converted only where nothing is lost: a float with a fraction (or NaN)
    in an integer column, a datetime whose time zone, time of day or sub-unit part the
    column would drop, a float beyond a narrower float's range are refused (pyarrow would
    truncate, shift or turn them into infinities without a word). A float rounded to a
    narrower float is not a loss: that is what a float column stores. A tensor column
    (``lakestream.schema.tensors``) takes a ``[n, *shape]`` numpy array, a list of arrays or
    of bytes, and every value must hold exactly one array's bytes.

    Raises:
        SchemaMismatchError: a column is missing, extra, out of order, of another type,
            holds values its type cannot hold exactly, or holds nulls where the schema
            forbids them; the message names the column.
        TypeError: ``data`` is none of the accepted kinds.
    """
    table = _as_table(data, schema, where)
    _check_names(table.schema.names, schema, where, ordered=True)
    wrong = [
        f"{f.name}: {table.schema.field(f.name).type} (stream has {f.type})"
        for f in schema
        if not table.schema.field(f.name).type.equals(f.type)
    ]
    if wrong:
        raise SchemaMismatchError(f"{where}: columns of the wrong type: {'; '.join(wrong)}")
    nulls = [f.name for f in schema if not f.nullable and table.column(f.name).null_count]
    if nulls:
        raise SchemaMismatchError(f"{where}: nulls in non-nullable columns {nulls}")
    if not table.schema.equals(schema):
        table = table.cast(schema)
    for f in schema:
        spec = tensor_spec(f)
        if spec is not None:
            check_tensor_column(table.column(f.name), spec, f.name, where)
        if _finite_only(f):
            bad = _non_finite(table.column(f.name))
            if bad:
                raise SchemaMismatchError(
                    f"{where}: column {f.name} holds {bad} NaN or infinite values; the stream "
                    f"requires finite values there ({FINITE_KEY.decode()}=true)")
    return table


FINITE_KEY = b"lakestream.finite"
"""Field metadata: ``{b"lakestream.finite": b"true"}`` on a float column (or list of floats)
makes writes holding NaN or infinity fail, before anything is uploaded."""


def finite(field: pa.Field) -> pa.Field:
    """``field`` with the finite-values constraint."""
    return field.with_metadata({**(field.metadata or {}), FINITE_KEY: b"true"})


def _finite_only(f: pa.Field) -> bool:
    return bool(f.metadata) and f.metadata.get(FINITE_KEY) == b"true"


def _non_finite(column: pa.ChunkedArray) -> int:
    values: Any = column
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
        values = pc.list_flatten(values)
    if not pa.types.is_floating(values.type):
        return 0
    return int(pc.sum(pc.invert(pc.is_finite(values)).cast(pa.int64())).as_py() or 0)


def sample_bytes(table: pa.Table) -> pa.Array:
    """The approximate size of each row: fixed-width values, and the values of lists and
    strings it holds."""
    total = pa.array(np.zeros(table.num_rows, np.int64))
    for column in _columns(table):
        total = pc.add(total, _row_sizes(column))
    return total


def oversized_sample(table: pa.Table, limit: int) -> tuple[int, int] | None:
    """The first row whose ``sample_bytes`` exceeds ``limit``, with that size; None if none.

    No row is larger than the rows' sum, which costs one pass over each column's lengths
    (no per-row array is built): only a table whose sum exceeds ``limit`` is sized row by
    row.
    """
    if sum(_column_bytes(c) for c in _columns(table)) <= limit:
        return None
    sizes = sample_bytes(table)
    largest = pc.max(sizes).as_py() or 0
    if largest <= limit:
        return None
    return pc.index(sizes, largest).as_py(), largest


def _columns(table: pa.Table) -> list[pa.Array]:
    return [c.combine_chunks() if c.num_chunks != 1 else c.chunk(0) for c in table.columns]


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _is_bytes(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) \
        or pa.types.is_large_string(t)


def _value_width(values: pa.Array) -> int:
    """Bytes counted per value of a list column (its values' average, at least one)."""
    inner = values.values
    return max(1, round(inner.nbytes / max(1, len(inner))))


def _fixed_width(t: pa.DataType) -> int:
    try:
        return max(1, t.byte_width)
    except ValueError:  # not fixed-width (a struct, say): count a word per row
        return 8


def _row_sizes(values: pa.Array) -> pa.Array:
    t = values.type
    if _is_list(t):
        lengths = pc.fill_null(pc.list_value_length(values), 0).cast(pa.int64())
        return pc.multiply(lengths, _value_width(values))
    if _is_bytes(t):
        return pc.fill_null(pc.binary_length(values), 0).cast(pa.int64())
    return pa.array(np.full(len(values), _fixed_width(t), np.int64))


def _column_bytes(values: pa.Array) -> int:
    """At least the sum of ``_row_sizes(values)``: for a list column, the span of its offsets
    (a null row may span values, never fewer than its size of 0), read off its ends."""
    t = values.type
    if _is_list(t):
        offsets = values.offsets
        return (offsets[-1].as_py() - offsets[0].as_py()) * _value_width(values)
    if _is_bytes(t):
        return int(pc.sum(pc.binary_length(values)).as_py() or 0)
    return len(values) * _fixed_width(t)


def _check_names(names: list[str], schema: pa.Schema, where: str, *, ordered: bool) -> None:
    missing = [n for n in schema.names if n not in names]
    extra = [n for n in names if n not in schema.names]
    if missing or extra:
        raise SchemaMismatchError(
            f"{where}: missing columns {missing}, unexpected columns {extra}; "
            f"the stream's columns are {schema.names}"
        )
    if ordered and list(names) != schema.names:
        raise SchemaMismatchError(
            f"{where}: columns {list(names)} are out of order; the stream's order is "
            f"{schema.names} (select them in that order)"
        )


def _build(columns: Mapping[str, Any], schema: pa.Schema, where: str) -> pa.Table:
    arrays = []
    for f in schema:
        values = columns[f.name]
        spec = tensor_spec(f)
        tensor = None if spec is None else tensor_column(values, spec, f.name, where)
        if tensor is not None:
            arrays.append(tensor)
            continue
        try:
            built = _column(values, f.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
            raise SchemaMismatchError(
                f"{where}: column {f.name} does not fit the stream's type {f.type}: {e}") from e
        lost = conversion_loss(values, built, f.type, f.name)
        if lost:
            raise SchemaMismatchError(f"{where}: {lost}")
        arrays.append(built)
    try:
        return pa.Table.from_arrays(arrays, schema=schema)
    except (pa.ArrowInvalid, ValueError) as e:  # columns of different lengths
        raise SchemaMismatchError(f"{where}: data does not fit the stream schema: {e}") from e


def warm_conversion() -> None:
    """Converts a Python list once: pyarrow's first conversion of Python objects imports
    pandas where it is installed (0.2-0.4 s and 53 MB on 2 cores), which a producer's first
    write of lists, whose samples wait for it, would otherwise pay; a producer does it as it
    opens, in an upload thread."""
    pa.array([[0]], pa.list_(pa.int64()))


def _column(values: Any, t: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """``values`` as an Arrow column of type ``t``; Arrow columns are cast (safely: refused
    where a value would overflow or lose its fraction), anything else is converted."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values if values.type.equals(t) else values.cast(t, safe=True)
    return pa.array(values, t)
