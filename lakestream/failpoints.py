"""Named crash points: ``LAKESTREAM_FAILPOINT=name`` (or ``name@n`` for the n-th hit) makes
the process SIGKILL itself there, so crash tests kill real processes at exact places."""

from __future__ import annotations

import os
import signal
import threading

NAMES = ("before_upload", "after_upload", "before_commit", "after_put", "after_commit",
         "during_snapshot", "during_gc", "before_checkpoint_metadata", "during_cache_fill",
         "after_handover", "after_offer")
"""``after_put``: the entry's put returned, before the commit is taken as landed;
``after_commit``: landed and folded in, before post-commit work;
``before_checkpoint_metadata``: every shard of a training checkpoint written, its
``.metadata`` not yet; ``during_cache_fill``: a fragment's bytes written to a host disk
cache's temp file, not yet in place; ``after_handover``: a run of uploaded fragments left
for the host's committer (commits shared by a host), not yet committed; ``after_offer``: a
host's waiting runs left in the store for the other hosts' committers (runs pooled through
the store), not yet committed."""
PRODUCER_NAMES = NAMES[:6]
"""The points a producer passes (gc's and the trainer's checkpoint are elsewhere)."""
HOST_NAMES = (*PRODUCER_NAMES, "after_handover")
"""The points a producer passes when its host shares commits."""
POOL_NAMES = (*HOST_NAMES, "after_offer")
"""The points a producer passes when hosts pool their runs through the store."""
_hits: dict[str, int] = {}
_lock = threading.Lock()


def failpoint(name: str) -> None:
    """Kills this process with SIGKILL if the environment arms ``name`` (at this hit).

    Raises:
        ValueError: the environment arms a point that does not exist, or a hit that is not a
            positive count (a misspelt point never fired, and its crash test passed untested).
    """
    armed = os.environ.get("LAKESTREAM_FAILPOINT")
    if not armed:
        return
    target, _, nth = armed.partition("@")
    if target not in NAMES or nth and not (nth.isdigit() and int(nth) > 0):
        raise ValueError(f"LAKESTREAM_FAILPOINT={armed!r} arms no crash point: use one of "
                         f"{', '.join(NAMES)}, optionally @n for the n-th hit (n >= 1)")
    if target != name:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        count = _hits[name]
    if count >= (int(nth) if nth else 1):
        os.kill(os.getpid(), signal.SIGKILL)
