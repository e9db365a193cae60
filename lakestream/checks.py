"""The one check of an integer argument, so that every option agrees on what it takes: an
``int`` (a numpy integer too), never a ``bool`` (``True`` is an int to Python, not a count
to a user), at least a bound, and ``None`` where the option may be left unset."""

from __future__ import annotations

import numbers
from typing import Any, overload


@overload
def check_int(name: str, value: Any, *, least: int = 0, optional: bool) -> int | None: ...
@overload
def check_int(name: str, value: Any, *, least: int = 0) -> int: ...
def check_int(name: str, value: Any, *, least: int = 0, optional: bool = False) -> int | None:
    """``value`` as an ``int``, if it is an integer of at least ``least`` (or None, where
    ``optional``).

    Raises:
        ValueError: naming ``name``, what it takes and what it got.
    """
    if value is None and optional:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) \
            and int(value) >= least:
        return int(value)
    what = {0: "a non-negative int", 1: "a positive int"}.get(least, f"an int >= {least}")
    raise ValueError(f"{name} must be {what}{' or None' if optional else ''}, got {value!r}")
