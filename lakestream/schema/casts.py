"""What pyarrow loses without a word when it builds a column from Python values or casts an
Arrow array to a stream's type: fractions, time zones, times of day, finite floats."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# pyarrow truncates a Python float (or Decimal) into an integer column (1.5 -> 1, -0.7 -> 0),
# keeps the UTC wall-clock time of an aware datetime in a naive column, takes a naive one
# as UTC in a zoned column, cuts a datetime to its date in a date column and microseconds
# to milliseconds in a timestamp[ms] column. Overflowing integers, integers a float cannot
# hold exactly (beyond 2**24 for float32, 2**53 for float64) and decimals that do not fit
# already fail its conversion; a float beyond float32's range becomes an infinity.


def conversion_loss(values: Any, built: pa.Array | pa.ChunkedArray, t: pa.DataType,
                    name: str) -> str | None:
    """What building ``values`` into ``built`` (column ``name`` of type ``t``) lost, in words,
    starting "column <name>"; None if nothing.

    The common case costs one type inference over the values, and only for a column with an
    integer, timestamp or date anywhere in its type; a column of floats narrower than 64 bits
    is built again only when it holds an infinity.
    """
    if pa.types.is_map(t) and not isinstance(values, (pa.Array, pa.ChunkedArray)):
        return _map_loss(values, _one_chunk(built), t, name)
    lost = _overflow(values, built, t)
    if lost or not _exact_leaves(t):
        return f"column {name} {lost}" if lost else None
    source = _source_type(values)
    if source is None or not _suspect(source, t):
        return None
    array = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, source)
    return _lost(_one_chunk(array), t, f"column {name}")


def _map_loss(values: Any, built: pa.MapArray, t: pa.MapType, name: str) -> str | None:
    """Python maps (dicts or lists of pairs) are checked as their keys and their items: type
    inference cannot tell a map from a list of lists."""
    pairs = [pair for m in values if m is not None
             for pair in (m.items() if isinstance(m, Mapping) else m)]
    return (conversion_loss([k for k, _ in pairs], built.keys, t.key_type, f"{name} (keys)")
            or conversion_loss([v for _, v in pairs], built.items, t.item_type,
                               f"{name} (values)"))


def _one_chunk(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_exact(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_timestamp(t) or pa.types.is_date(t)


def _exact_leaves(t: pa.DataType) -> bool:
    """Whether ``t`` holds an integer, timestamp or date, through lists and struct fields."""
    if _is_list(t):
        return _exact_leaves(t.value_type)
    if pa.types.is_struct(t):
        return any(_exact_leaves(f.type) for f in t)
    return _is_exact(t)


def _source_type(values: Any) -> pa.DataType | None:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values.type
    try:
        return pa.infer_type(values)
    except (pa.ArrowException, TypeError, ValueError):  # the typed build took them: trust it
        return None


def _suspect(s: pa.DataType, t: pa.DataType) -> bool:
    """Whether values of type ``s`` may lose something as type ``t``, judged on types alone."""
    if _is_list(t) and _is_list(s):
        return _suspect(s.value_type, t.value_type)
    if pa.types.is_struct(t) and pa.types.is_struct(s):
        names = {f.name for f in s}
        return any(_suspect(s.field(f.name).type, f.type) for f in t if f.name in names)
    if pa.types.is_integer(t):
        return pa.types.is_floating(s) or pa.types.is_decimal(s)
    if pa.types.is_timestamp(t) and pa.types.is_timestamp(s):
        return bool(s.tz) != bool(t.tz) or _ticks(s) > _ticks(t)
    return pa.types.is_date(t) and pa.types.is_timestamp(s)


def _ticks(t: pa.TimestampType) -> int:
    return {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[t.unit]


def _lost(a: pa.Array, t: pa.DataType, where: str) -> str | None:
    s = a.type
    if _is_list(t) and _is_list(s):
        return _lost(pc.list_flatten(a), t.value_type, where)
    if pa.types.is_struct(t) and pa.types.is_struct(s):
        names = {f.name for f in s}
        found = (_lost(a.field(f.name), f.type, f"{where}.{f.name}") for f in t if f.name in names)
        return next((lost for lost in found if lost), None)
    if not _suspect(s, t):
        return None
    if pa.types.is_timestamp(t) and bool(s.tz) != bool(t.tz):
        n = len(a) - a.null_count
        if s.tz:
            return (f"{where} holds {n} datetimes with a time zone ({s.tz}) in a column without "
                    f"one ({t}): the zone would be dropped; pass naive datetimes, or give the "
                    "column a time zone")
        return (f"{where} holds {n} naive datetimes in a column with time zone {t.tz}: they "
                "would be taken as UTC; pass datetimes with a tzinfo")
    if pa.types.is_integer(t):  # a float or Decimal: a whole number equals its floor
        kept = pc.floor(a)
    else:  # a timestamp: cut to the column's unit or to a date, then back
        kept = pc.cast(pc.cast(a, t, safe=False), s, safe=False)
    bad = pc.fill_null(pc.invert(pc.equal(kept, a)), False)
    if pa.types.is_floating(s):  # NaN and infinities have no integer
        bad = pc.or_(bad, pc.fill_null(pc.invert(pc.is_finite(a)), False))
    n = int(pc.sum(bad.cast(pa.int64())).as_py() or 0)
    if not n:
        return None
    first = a.filter(bad)[0].as_py()
    if pa.types.is_integer(t):
        what, fix = "values that are not whole numbers", "round them, or make it a float column"
    elif pa.types.is_date(t):
        what, fix = "datetimes with a time of day", "pass dates, or make it a timestamp column"
    else:
        what = f"timestamps finer than {t.unit}"
        fix = f"round them to {t.unit}, or use a finer unit"
    return f"{where} holds {n} {what} (first: {first!r}); {t} would not keep them: {fix}"


def _wide(t: pa.DataType) -> pa.DataType:
    """``t`` with every float narrower than 64 bits widened to float64, at any depth."""
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return pa.float64()
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_wide(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_wide(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_wide(t.value_type)), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_wide(t.field(i).type))
                          for i in range(t.num_fields)])
    return t


def _float_leaves(values: pa.Array) -> list[pa.Array]:
    """The floating-point values under ``values``: through lists and struct fields."""
    t = values.type
    if pa.types.is_floating(t):
        return [values]
    if _is_list(t):
        return _float_leaves(pc.list_flatten(values))
    if pa.types.is_struct(t):
        return [leaf for child in values.flatten() for leaf in _float_leaves(child)]
    return []


def _overflow(values: Any, built: pa.Array | pa.ChunkedArray, t: pa.DataType) -> str | None:
    """Floats beyond a narrower float type's range become infinities: where ``built`` holds
    an infinity, ``values`` are built again at float64, and a value finite there but not
    here is lost."""
    if _wide(t).equals(t):
        return None
    leaves = _float_leaves(_one_chunk(built))
    if not any(pc.any(pc.is_inf(leaf)).as_py() for leaf in leaves):
        return None
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        wide = _float_leaves(_one_chunk(values.cast(_wide(t))))
    else:
        wide = _float_leaves(pa.array(list(values), _wide(t)))
    lost = sum(pc.sum(pc.and_(pc.is_finite(w), pc.is_inf(n))).as_py() or 0
               for w, n in zip(wide, leaves, strict=True))
    if not lost:
        return None
    narrow = next(leaf.type for leaf in leaves if not pa.types.is_float64(leaf.type))
    return (f"holds {lost} finite values beyond the range of {narrow} "
            f"(±{np.finfo(narrow.to_pandas_dtype()).max:.4g}): they would be stored as "
            "infinity; scale or clip them, or make the column float64")
