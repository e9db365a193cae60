"""Consumer progress objects: ``_lakestream/progress/<group>.json``, overwritten, advisory.

Rank 0 of a consumer group publishes the step it has reached and the policy version it
trains; producers read it to stay within a staleness bound, ``status`` to show each group's
lag (docs/design.md). Nothing correct depends on it, and it holds no data: a missing or
torn object reads as "no progress yet". Each publish names its job, so that a second job
publishing into the same group is seen (``loaders/publisher.py``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from lakestream.errors import NotFoundError, StoreError
from lakestream.log.keys import check_group
from lakestream.store.base import ObjectStore
from lakestream.store.parse import MAX_INT, count, loads

PROGRESS_DIR = "_lakestream/progress/"
MAX_PROGRESS_BYTES = 64 << 10
"""A progress object is a few dozen bytes; a larger one is read as no progress."""
@dataclass(frozen=True)
class Progress:
    step: int
    policy_version: int | None = None
    updated: float = 0.0
    """Seconds since the epoch, by the publisher's clock (shown, and compared only to tell
    a live job from a finished one, at a scale of a minute)."""
    job: str | None = None
    """The publishing job's id (one per reading dataset), or None from older publishers."""


def progress_key(group: str) -> str:
    return f"{PROGRESS_DIR}{check_group(group)}.json"


def publish_progress(store: ObjectStore, group: str, step: int,
                     policy_version: int | None = None, job: str | None = None) -> None:
    body = {"step": int(step), "policy_version": policy_version, "updated": time.time(),
            "job": job}
    store.put(progress_key(group), json.dumps(body).encode(), mode="overwrite")


def progress_exists(store: ObjectStore, group: str) -> bool:
    """Whether the group has a progress object, readable or not."""
    try:
        store.head(progress_key(group))
    except NotFoundError:
        return False
    return True


def delete_progress(store: ObjectStore, group: str) -> None:
    """Removes the group's progress object (absent is fine)."""
    store.delete(progress_key(group))


def read_progress(store: ObjectStore, group: str) -> Progress | None:
    """The group's published progress, or None if there is none (or it is unreadable)."""
    try:
        d = loads(store.get(progress_key(group), max_bytes=MAX_PROGRESS_BYTES))
        pv, job = d.get("policy_version"), d.get("job")
        return Progress(count(d["step"], "step"),
                        None if pv is None else count(pv, "policy version", low=-MAX_INT),
                        _seconds(d.get("updated", 0.0)),
                        None if job is None else _job(job))
    except (NotFoundError, StoreError, ValueError, KeyError, TypeError, AttributeError):
        # TooLargeError is a ValueError: a progress object that large is not progress.
        return None


MAX_JOB_CHARS = 256


def _seconds(value: object) -> float:
    """A time in seconds since the epoch: a finite int or float within ten thousand years
    (an int of 400 digits, say, is no time: ``float`` of it raised OverflowError)."""
    if type(value) not in (int, float) or not 0 <= value < 1e12:  # type: ignore[operator]
        raise ValueError(f"updated {str(value)[:40]!r} is not a time")
    return float(value)  # type: ignore[arg-type]


def _job(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_JOB_CHARS:
        raise ValueError(f"job {str(value)[:40]!r} is not a short string")
    return value


def list_progress(store: ObjectStore) -> dict[str, Progress]:
    """Every group's published progress (a handful of small objects)."""
    out = {}
    for m in store.list(PROGRESS_DIR):
        group = m.key[len(PROGRESS_DIR):].removesuffix(".json")
        if m.key.endswith(".json") and _is_group(group):
            progress = read_progress(store, group)
            if progress is not None:
                out[group] = progress
    return out


def _is_group(name: str) -> bool:
    try:
        check_group(name)
    except ValueError:
        return False
    return True
