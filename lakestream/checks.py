"""The one check of an integer argument, so that every option agrees on what it takes: an
``int`` (a numpy integer too), never a ``bool`` (``True`` is an int to Python, not a count
to a user), at least a bound, and ``None`` where the option may be left unset; and the one
check of a list of column names, which a single name is not."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
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


def check_names(name: str, value: Iterable[str] | None) -> list[str] | None:
    """``value`` as a list of column names (None stays None).

    Raises:
        TypeError: naming ``name``: ``value`` is one string (a name is not a list of
            names: ``["a"]``, not ``"a"``), not iterable, or holds something not a string.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        try:
            names = list(value)
        except TypeError:
            names = None
        if names is not None and all(isinstance(c, str) for c in names):
            return names
    raise TypeError(f"{name} must be a list of column names, got {value!r}")
