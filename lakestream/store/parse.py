"""Parsing stored bytes in bounded time and memory: anyone who may write the stream's folder
may write anything there, so every object is read up to a size cap (``ObjectStore.get``'s
``max_bytes``), and every JSON parse and integer is bounded before anything trusts it."""

from __future__ import annotations

import json
from typing import Any

MAX_INT = (1 << 63) - 1
"""Every count, offset, version and step read from the store fits a signed 64-bit integer
(Arrow's, numpy's and Parquet's): a larger one is damage, not data."""


def loads(data: bytes | str) -> Any:
    """``json.loads``, with nesting too deep for the parser a ValueError, not a
    RecursionError."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("its JSON is nested too deeply") from None


def count(value: Any, what: str, *, low: int = 0) -> int:
    """``value`` as an integer in ``[low, MAX_INT]``: an int (not a bool), or a string of
    decimal digits (Delta tags are strings).

    Raises:
        ValueError: naming ``what``.
    """
    if isinstance(value, str) and value.isascii() and value.lstrip("-").isdigit() \
            and len(value) <= 20:
        value = int(value)
    if type(value) is not int or not low <= value <= MAX_INT:
        raise ValueError(f"{what} {str(value)[:40]!r} is not an integer in "
                         f"[{low}, 2**63 - 1]")
    return value
