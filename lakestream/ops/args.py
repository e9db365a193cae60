"""The ``lakestream`` command's arguments: column types and schemas, durations, storage
options (never a secret) and group names, each refused with a message that shows no value."""

from __future__ import annotations

import argparse
import re
import zoneinfo

import pyarrow as pa

from lakestream.log.keys import check_group
from lakestream.ops.text import printable
from lakestream.schema.tensors import tensor_field
from lakestream.store.s3_options import is_secret, setting

_SCALARS = {
    "bool": pa.bool_(), "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(),
    "int64": pa.int64(), "float32": pa.float32(), "float": pa.float32(),
    "float64": pa.float64(), "double": pa.float64(), "string": pa.string(),
    "binary": pa.binary(), "date": pa.date32(),
}
SCALAR_NAMES = tuple(_SCALARS)
"""The scalar column types a schema given as text may name (and the nested types built on
them: ``TYPE_FORMS``)."""
TYPE_FORMS = ("list<T>", "struct<name:T,...>", "timestamp<us> (s, ms, us, ns)",
              "timestamp<us,UTC> (with a time zone)", "decimal<precision,scale>",
              "tensor<dtype,d0,d1,...> (a top-level column: each row one array of that shape)")
"""The parametrised column types a schema given as text may name."""
_UNITS = ("s", "ms", "us", "ns")


def parse_type(text: str) -> pa.DataType:
    """``int64``, ``list<int32>``, ``struct<a:int64,b:string>``, ``timestamp<us,UTC>``,
    ``decimal<10,2>``, ... as an Arrow type (a tensor column is a field: ``parse_field``).

    Raises:
        ValueError: the type is not one of those.
    """
    text = text.strip()
    kind, args = _parametrised(text)
    if kind == "list" and args:
        return pa.list_(parse_type(",".join(args)))
    if kind == "struct" and args:
        return pa.struct([parse_field(part, top=False) for part in args])
    if kind == "timestamp" and args and args[0] in _UNITS and (
            len(args) == 1 or len(args) == 2 and _zone(args[1])):
        return pa.timestamp(args[0], tz=args[1] if len(args) == 2 else None)
    if kind == "decimal" and len(args) == 2 and all(a.isdigit() for a in args):
        return pa.decimal128(int(args[0]), int(args[1]))
    if kind == "tensor":
        raise ValueError(f"{text!r}: a tensor is a top-level column (name:tensor<...>), not "
                         "inside a list or struct")
    if kind is None and text in _SCALARS:
        return _SCALARS[text]
    raise ValueError(f"unknown column type {text!r}; use one of {sorted(_SCALARS)} or "
                     + ", ".join(TYPE_FORMS))


def parse_field(text: str, top: bool = True) -> pa.Field:
    """``name:type`` (a trailing ``!``: not nullable) as an Arrow field; ``tensor<dtype,
    d0,d1,...>`` makes a tensor column (``lakestream.tensor_field``), a ``top`` one only.

    Raises:
        ValueError: not ``name:type``, or an unknown type.
    """
    name, sep, typ = text.partition(":")
    if not sep or not name.strip():
        raise ValueError(f"column {text!r} is not name:type")
    typ = typ.strip()
    nullable = not typ.endswith("!")
    typ = typ.rstrip("!").strip()
    kind, args = _parametrised(typ)
    if kind == "tensor" and top:
        shape = args[1:]
        if not args or not shape or not all(d.isdigit() for d in shape):
            raise ValueError(f"column {name.strip()!r}: {typ!r} is not tensor<dtype,d0,d1,...> "
                             "(e.g. tensor<uint8,224,224,3>)")
        return tensor_field(name.strip(), tuple(int(d) for d in shape), args[0],
                            nullable=nullable)
    return pa.field(name.strip(), parse_type(typ), nullable)


def _zone(name: str) -> bool:
    """Whether ``name`` is a time zone: an IANA name (``UTC``, ``Europe/Paris``) or an
    offset (``+01:00``)."""
    if re.fullmatch(r"[+-]\d\d:\d\d", name):
        return True
    try:
        zoneinfo.ZoneInfo(name)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        return False
    return True


def parse_schema(text: str) -> pa.Schema:
    """``name:type,name:type!`` (``!`` = not nullable) as an Arrow schema.

    Raises:
        ValueError: a column is not ``name:type``, or a type is unknown.
    """
    return pa.schema([parse_field(part) for part in _split(text)])


def _parametrised(text: str) -> tuple[str | None, list[str]]:
    """``kind<a,b,...>`` as ``(kind, [a, b, ...])`` split at its own commas (not nested
    ones); anything else as ``(None, [])``."""
    m = re.fullmatch(r"([a-z]+)\s*<(.*)>", text, re.DOTALL)
    if m is None:
        return None, []
    return m.group(1), [a.strip() for a in _split(m.group(2))]


def _split(text: str) -> list[str]:
    """``text`` split at the commas outside every ``<...>``.

    Raises:
        ValueError: its angle brackets do not pair up.
    """
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += {"<": 1, ">": -1}.get(c, 0)
        if depth < 0:
            break
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '<' and '>' in {text!r}")
    return [*parts, text[start:]]


def parse_duration(text: str) -> float:
    """``90`` (seconds), ``30s``, ``10m``, ``1h``, ``2d`` as seconds.

    Raises:
        argparse.ArgumentTypeError: not a duration.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (seconds, or e.g. 30s, 10m, 1h, 2d)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def parse_interval(text: str) -> float:
    """A positive duration (``parse_duration``) as seconds.

    Raises:
        argparse.ArgumentTypeError: not a positive duration.
    """
    try:
        value = parse_duration(text)
    except argparse.ArgumentTypeError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(
            f"not a positive number of seconds: {text!r} (seconds, or e.g. 0.5, 2s, 1m)")
    return value


def parse_option(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (a storage option) as a pair. A secret (``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``) is refused: on a command line every user of the machine sees it
    in the process list, and the shell keeps it in its history. No message shows a value.

    Raises:
        argparse.ArgumentTypeError: there is no ``=`` or no key, or the key is a secret's.
    """
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        shown = re.sub(r"[^A-Za-z0-9_.-].*", "...", text, flags=re.DOTALL)  # never a value
        raise argparse.ArgumentTypeError(
            f"storage option {shown!r} is not KEY=VALUE (e.g. -o AWS_ENDPOINT_URL=http://...)")
    if is_secret(key):
        variable = "AWS_" + setting(key).upper()
        raise argparse.ArgumentTypeError(
            f"{printable(key)} is not taken on the command line, where every user of the "
            f"machine sees it in the process list and the shell keeps it in its history: "
            f"export {variable} in the environment instead, or name a profile of "
            "~/.aws/credentials with AWS_PROFILE (docs/deployment.md, Credentials)")
    return key, value


def parse_mapping(text: str) -> tuple[str, str]:
    """``COLUMN=FIELD`` as a pair.

    Raises:
        argparse.ArgumentTypeError: not two non-empty names around an ``=``.
    """
    column, sep, field = text.partition("=")
    if not sep or not column.strip() or not field.strip():
        raise argparse.ArgumentTypeError(
            f"{printable(text)!r} is not COLUMN=FIELD (e.g. --map image=jpg)")
    return column.strip(), field.strip()


def parse_group(text: str) -> str:
    """A consumer group's name (``lakestream.log.keys.check_group``).

    Raises:
        argparse.ArgumentTypeError: not a valid group name.
    """
    try:
        return check_group(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(printable(e)) from None
