"""Consumer progress objects: ``_lakestream/progress/<group>.json``, overwritten, advisory.

Rank 0 of a consumer group publishes the step it has reached and the policy version it
trains; producers read it to stay within a staleness bound (docs/design.md). Nothing correct
depends on it: a missing or torn object reads as "no progress yet".
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

from lakestream.errors import NotFoundError, StoreError
from lakestream.store.base import ObjectStore

PROGRESS_DIR = "_lakestream/progress/"
_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_group(group: str) -> str:
    """Returns ``group`` if it can name a consumer group.

    Raises:
        ValueError: not 1-128 letters, digits, '.', '_' or '-'.
    """
    if not isinstance(group, str) or not _GROUP.fullmatch(group):
        raise ValueError(f"consumer group {group!r} is not valid: use 1-128 letters, digits, "
                         "'.', '_' or '-', starting with a letter or digit")
    return group


@dataclass(frozen=True)
class Progress:
    step: int
    policy_version: int | None = None
    updated: float = 0.0
    """Seconds since the epoch, by the publisher's clock (display only, never compared)."""


def progress_key(group: str) -> str:
    return f"{PROGRESS_DIR}{check_group(group)}.json"


def publish_progress(store: ObjectStore, group: str, step: int,
                     policy_version: int | None = None) -> None:
    body = {"step": int(step), "policy_version": policy_version, "updated": time.time()}
    store.put(progress_key(group), json.dumps(body).encode(), mode="overwrite")


def read_progress(store: ObjectStore, group: str) -> Progress | None:
    """The group's published progress, or None if there is none (or it is unreadable)."""
    try:
        d = json.loads(store.get(progress_key(group)))
        pv = d.get("policy_version")
        return Progress(int(d["step"]), None if pv is None else int(pv),
                        float(d.get("updated", 0.0)))
    except (NotFoundError, StoreError, ValueError, KeyError, TypeError):
        return None
