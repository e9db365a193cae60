"""The ``lakestream`` command's arguments: column types and schemas, durations, storage
options (never a secret) and group names, each refused with a message that shows no value."""

from __future__ import annotations

import argparse
import re

import pyarrow as pa

from lakestream.log.entries import check_group
from lakestream.ops.text import printable
from lakestream.store.s3_options import is_secret, setting

_SCALARS = {
    "bool": pa.bool_(), "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(),
    "int64": pa.int64(), "float32": pa.float32(), "float": pa.float32(),
    "float64": pa.float64(), "double": pa.float64(), "string": pa.string(),
    "binary": pa.binary(),
}
SCALAR_NAMES = tuple(_SCALARS)
"""The scalar column types a schema given as text may name (and ``list<T>`` of them)."""


def parse_type(text: str) -> pa.DataType:
    """``int64``, ``float32``, ``string``, ``list<int32>``, ... as an Arrow type.

    Raises:
        ValueError: the type is not one of those.
    """
    text = text.strip()
    m = re.fullmatch(r"list<(.+)>", text)
    if m:
        return pa.list_(parse_type(m.group(1)))
    if text in _SCALARS:
        return _SCALARS[text]
    raise ValueError(f"unknown column type {text!r}; use one of {sorted(_SCALARS)} or list<T>")


def parse_schema(text: str) -> pa.Schema:
    """``name:type,name:type!`` (``!`` = not nullable) as an Arrow schema.

    Raises:
        ValueError: a column is not ``name:type``.
    """
    fields = []
    for part in re.split(r",(?![^<]*>)", text):
        name, sep, typ = part.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"column {part!r} is not name:type")
        nullable = not typ.strip().endswith("!")
        fields.append(pa.field(name.strip(), parse_type(typ.strip().rstrip("!")), nullable))
    return pa.schema(fields)


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


def parse_group(text: str) -> str:
    """A consumer group's name (``lakestream.log.entries.check_group``).

    Raises:
        argparse.ArgumentTypeError: not a valid group name.
    """
    try:
        return check_group(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(printable(e)) from None
