"""A stream's schema as Delta Lake sees it: Arrow types as Delta types, the table features
they need, the schema string, and the exact Arrow schema kept beside it."""

from __future__ import annotations

import base64
import json
from typing import Any

import pyarrow as pa

_PRIMITIVES: dict[pa.DataType, str] = {
    pa.bool_(): "boolean",
    pa.int8(): "byte",
    pa.int16(): "short",
    pa.int32(): "integer",
    pa.int64(): "long",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.string(): "string",
    pa.large_string(): "string",
    pa.binary(): "binary",
    pa.large_binary(): "binary",
    pa.date32(): "date",
}

_MAX_DECIMAL_PRECISION = 38


def delta_type(t: pa.DataType) -> Any:
    """The Delta Lake type of an Arrow type.

    Raises:
        ValueError: Delta cannot represent the type (unsigned integers, half floats,
            decimals of more than 38 digits or a negative scale, empty structs, ...).
    """
    if t in _PRIMITIVES:
        return _PRIMITIVES[t]
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    if pa.types.is_decimal(t):
        # Delta decimals hold at most 38 digits (readers refuse to open the table otherwise),
        # and Parquet cannot store a negative scale (every append would fail).
        if not (t.precision <= _MAX_DECIMAL_PRECISION and 0 <= t.scale <= t.precision):
            raise ValueError(
                f"Arrow type {t} has no Delta Lake equivalent: Delta decimals need precision "
                f"1..{_MAX_DECIMAL_PRECISION} and scale 0..precision")
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return {"type": "array", "elementType": delta_type(t.value_type),
                "containsNull": t.value_field.nullable}
    if pa.types.is_struct(t):
        if t.num_fields == 0:  # Parquet cannot store it: every append would fail
            raise ValueError(f"Arrow type {t} has no Delta Lake equivalent: a struct needs a field")
        return {"type": "struct", "fields": [_delta_field(f) for f in t]}
    if pa.types.is_map(t):
        return {"type": "map", "keyType": delta_type(t.key_type),
                "valueType": delta_type(t.item_type), "valueContainsNull": t.item_field.nullable}
    raise ValueError(f"Arrow type {t} has no Delta Lake equivalent; use a signed or wider type")


DELTA_METADATA_KEYS = (b"lakestream.tensor",)
"""Field metadata that Delta readers see too (a tensor column's shape and dtype, so that a
query can decode its bytes); the rest stays in the exact Arrow schema only."""


def _delta_field(f: pa.Field) -> dict[str, Any]:
    meta = {k.decode(): v.decode() for k, v in (f.metadata or {}).items()
            if k in DELTA_METADATA_KEYS}
    return {"name": f.name, "type": delta_type(f.type), "nullable": f.nullable, "metadata": meta}


TIMESTAMP_NTZ_FEATURE = "timestampNtz"
"""The Delta table feature a ``timestamp_ntz`` column needs (in reader and writer features)."""


def delta_table_features(schema: pa.Schema) -> list[str]:
    """The Delta table features a stream with this Arrow schema must declare, sorted.

    Each is a reader-writer feature: it goes in both ``readerFeatures`` and
    ``writerFeatures`` of the protocol action. An empty list means the legacy protocol
    (reader 1, writer 2) is enough, which more Delta readers accept.
    """
    features: set[str] = set()
    for f in schema:
        features |= _type_features(f.type)
    return sorted(features)


def _type_features(t: pa.DataType) -> set[str]:
    # A naive timestamp anywhere, even inside a list, struct or map, makes the schema
    # string hold timestamp_ntz, and readers refuse that without the feature.
    if pa.types.is_timestamp(t):
        return set() if t.tz else {TIMESTAMP_NTZ_FEATURE}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _type_features(t.value_type)
    if pa.types.is_struct(t):
        return {feature for f in t for feature in _type_features(f.type)}
    if pa.types.is_map(t):
        return _type_features(t.key_type) | _type_features(t.item_type)
    return set()


def delta_schema_string(schema: pa.Schema) -> str:
    """The ``metaData.schemaString`` of a stream with this Arrow schema."""
    return json.dumps({"type": "struct", "fields": [_delta_field(f) for f in schema]})


def encode_schema(schema: pa.Schema) -> str:
    """The exact Arrow schema as text (Delta's schema string loses Arrow widths)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
