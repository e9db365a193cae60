"""Request hooks: functions this process calls after each request one of its stores makes,
told what it was and how it ended, as a Kafka client's interceptors are: for metrics and
tracing, and for the latency or failures that tests and benchmarks add. With no hook set a
store's methods are its own and a request pays nothing: the first hook puts the observed
methods in their place (``observed``), the removal of the last takes them out.

A hook runs in the thread that made the request, after it: it sees each request once (the
outermost call, not the calls a store makes of itself), may sleep (added latency: it runs out
of the thread's CPU slot, ``lakestream.store.slots``, as a remote store's answer is waited
for), and may raise, which fails the request with that error (an injected fault: for a put
that landed, a lost reply). A hook set in one process is not set in its spawned workers:
each sets its own.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from lakestream.store.slots import cpu_slots

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Request:
    """One request a store made."""

    op: str
    """``get``, ``get_range``, ``get_buffer``, ``head``, ``open_input``, ``put``, ``list``
    or ``delete``."""
    key: str
    """The object's key in its store (a prefix for ``list``)."""
    nbytes: int | None
    """Bytes returned (gets) or sent (puts); None for the others, or if it failed."""
    seconds: float
    """From the call to its return."""
    error: BaseException | None
    """What it raised (``NotFoundError`` for an absent key), or None."""


Hook = Callable[[Request], None]

_hooks: tuple[Hook, ...] = ()
_lock = threading.Lock()
_inside = threading.local()
_classes: list[type] = []
"""The store classes whose requests the hooks see (``observed``)."""
_OP = "_lakestream_request"
_SIZED = ("get", "get_range", "get_buffer", "put")
"""The requests whose bytes are counted: the rest move none, or (``open_input``) later."""


def add_request_hook(hook: Hook) -> Callable[[], None]:
    """Calls ``hook(request)`` after each request a store of this process makes from now
    on; returns the function that removes it.

    Raises:
        TypeError: ``hook`` is not callable.
    """
    if not callable(hook):
        raise TypeError(f"a request hook must be a function of a Request, got {hook!r}")
    global _hooks
    with _lock:
        _hooks = (*_hooks, hook)
        if len(_hooks) == 1:
            _swap(observe=True)

    def remove() -> None:
        global _hooks
        with _lock:
            if hook not in _hooks:
                return
            _hooks = tuple(h for h in _hooks if h is not hook)
            if not _hooks:
                _swap(observe=False)
    return remove


def request(op: str) -> Callable[[F], F]:
    """Marks a store method as the request ``op`` (of a class made ``observed``)."""
    def mark(method: F) -> F:
        setattr(method, _OP, op)
        return method
    return mark


def observed(cls: type) -> type:
    """Makes the requests ``cls``'s marked methods make seen by the hooks."""
    with _lock:
        _classes.append(cls)
        if _hooks:
            _swap(observe=True, only=cls)
    return cls


def _swap(*, observe: bool, only: type | None = None) -> None:
    """Puts each marked method's observed form in its place, or its own back."""
    for cls in [only] if only is not None else _classes:
        for name, method in list(vars(cls).items()):
            own = getattr(method, "__wrapped__", method)
            op = getattr(own, _OP, None)
            if op is not None:
                setattr(cls, name, _observing(op, own) if observe else own)


def _observing(op: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "on", False):  # a request the store makes of itself
            return method(self, *args, **kwargs)
        _inside.on = True
        t0 = time.perf_counter()
        out, error = None, None
        try:
            out = method(self, *args, **kwargs)
            if op == "list":  # a lazy listing: its requests are made here, not later
                out = iter(list(out))
        except BaseException as e:
            error = e
        finally:
            _inside.on = False
        key = args[0] if args else kwargs.get("key", kwargs.get("prefix", ""))
        if op == "put":
            out_or_data = args[1] if len(args) > 1 else kwargs.get("data")
        else:
            out_or_data = out
        sized = error is None and op in _SIZED
        seen = Request(op, key, _size(out_or_data) if sized else None,
                       time.perf_counter() - t0, error)
        with cpu_slots().waiting():  # a hook is no per-byte work: one sleeping is a wait
            for hook in _hooks:
                hook(seen)
        if error is not None:
            raise error
        return out
    return call


def _size(out: Any) -> int | None:
    if isinstance(out, (bytes, bytearray)):
        return len(out)
    size = getattr(out, "size", None)  # a pyarrow Buffer
    if isinstance(size, int):
        return size
    try:
        return memoryview(out).nbytes  # a memoryview, obstore's Bytes, a buffer block
    except TypeError:
        return None
