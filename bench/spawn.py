"""Runs benchmark workers as spawned processes and collects what each puts on its queue."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any


def run_workers(target: Callable[..., None], args: list[tuple[Any, ...]],
                timeout: float) -> list[Any]:
    """Starts ``target(*a, out)`` for each ``a`` in ``args`` (spawned, so no parent state
    leaks in), and returns what the workers put on ``out``, one item each, in arrival order.

    Raises:
        queue.Empty: a worker did not report within ``timeout`` seconds.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, out)) for a in args]
    for p in procs:
        p.start()
    results = [out.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join()
    return results
