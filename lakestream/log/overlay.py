"""A mapping that a replay state copies in time that does not grow with its size: a shared,
never-modified base and a small private overlay of changes, folded into a new base now and
then (a state forks on every commit and every refresh; a stream may know 100k producers)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")
_GONE: object = object()
_MISSING: object = object()


class OverlayDict(Mapping[K, V], Generic[K, V]):
    """A dict whose ``copy`` costs the changes since the last fold, at most about the square
    root of its size: folding costs the size and happens every that many changes. Values
    must not be modified in place (replace them), since copies share them."""

    __slots__ = ("_base", "_top", "_limit")

    def __init__(self, items: Mapping[K, V] | None = None) -> None:
        self._base: dict[K, V] = dict(items or {})
        self._top: dict[K, object] = {}
        self._limit = max(32, math.isqrt(len(self._base)))

    def copy(self) -> OverlayDict[K, V]:
        other: OverlayDict[K, V] = OverlayDict.__new__(OverlayDict)
        other._base, other._top, other._limit = self._base, dict(self._top), self._limit
        return other

    @overload
    def get(self, key: K, /) -> V | None: ...

    @overload
    def get(self, key: K, /, default: V | T) -> V | T: ...

    def get(self, key: K, /, default: object = None) -> object:
        top = self._top
        if top:
            value = top.get(key, _MISSING)
            if value is not _MISSING:
                return default if value is _GONE else value
        return self._base.get(key, default)

    def __getitem__(self, key: K) -> V:
        value = self._top.get(key, _GONE) if self._top else _GONE
        if value is _GONE:
            if key in self._top:
                raise KeyError(key)
            return self._base[key]
        return value  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        if key in self._top:
            return self._top[key] is not _GONE
        return key in self._base

    def __setitem__(self, key: K, value: V) -> None:
        self._top[key] = value
        self._fold_if_due()

    def pop(self, key: K, default: V | None = None) -> V | None:
        if key not in self:
            return default
        value = self[key]
        self._top[key] = _GONE
        self._fold_if_due()
        return value

    def _fold_if_due(self) -> None:
        if len(self._top) > self._limit:
            base = dict(self._base)  # a new one: copies share the old
            for key, value in self._top.items():
                if value is _GONE:
                    base.pop(key, None)
                else:
                    base[key] = value  # type: ignore[assignment]
            self._base, self._top = base, {}
            self._limit = max(32, math.isqrt(len(base)))

    def __iter__(self) -> Iterator[K]:
        if not self._top:
            return iter(self._base)
        return iter([k for k in self._base if k not in self._top]
                    + [k for k, v in self._top.items() if v is not _GONE])

    def __len__(self) -> int:
        if not self._top:
            return len(self._base)
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"OverlayDict({dict(self.items())!r})"
