"""Which rows of which fragments hold a run of offsets: a pure function of the fragments'
extents."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class _Extent(Protocol):
    @property
    def offset(self) -> int: ...

    @property
    def rows(self) -> int: ...


@dataclass(frozen=True)
class RowRange:
    """Rows ``[start, stop)`` of fragment ``index`` in the list planned over."""

    index: int
    start: int
    stop: int


def plan_rows(fragments: Sequence[_Extent], lo: int, hi: int) -> list[RowRange]:
    """The fragment row ranges that cover offsets ``[lo, hi)``, in order.

    ``fragments`` are contiguous and sorted by offset, and must cover ``[lo, hi)``.

    Raises:
        ValueError: they do not cover it.
    """
    out: list[RowRange] = []
    at = lo
    for i, f in enumerate(fragments):
        end = f.offset + f.rows
        if end <= at or f.offset >= hi:
            continue
        if f.offset > at:
            break
        stop = min(hi, end)
        out.append(RowRange(i, at - f.offset, stop - f.offset))
        at = stop
        if at >= hi:
            return out
    if at < hi:
        raise ValueError(f"offsets [{at}, {hi}) are not covered by the fragments given")
    return out
