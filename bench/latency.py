"""A store as far away as one likes, in the process that uses it: a request hook that sleeps
after each request (``lakestream.store.add_request_hook``), out of the thread's CPU slot, as
a remote store's answer is waited for. No proxy process copies the bytes on the same cores."""

from __future__ import annotations

import time
from collections.abc import Callable

from lakestream.store import Request, add_request_hook


def delay_requests(seconds: float, gets_only: bool = False) -> Callable[[], None]:
    """Makes each request of this process's stores (with ``gets_only``, each read: a GET of a
    whole object, a range or a buffer) take ``seconds`` longer; returns what undoes it.
    ``open_input``'s reads, made later through the file, are not delayed."""
    def hook(r: Request) -> None:
        if not gets_only or r.op.startswith("get"):
            time.sleep(seconds)

    return add_request_hook(hook)
