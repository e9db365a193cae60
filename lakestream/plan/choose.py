"""Which groups a step takes under a read-time policy: a pure function of the planning
columns of the samples from the step's cursor on, the step and the policy.

A step of B samples takes, from its cursor on, the first B / G groups that are kept; the
cursor of the next step is the end of the last group taken. A group is dropped when a
filter rejects it, or, with ``drop_stale``, when its oldest policy version is below
``step - max_staleness``. Dropping for staleness at step s also holds at every later step
(the bound only rises), so a group skipped once is never wanted again, and every rank and
every restart that starts from the same (step, cursor) makes the same choices. Without
``drop_stale`` (mask), stale samples stay and are marked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FRESH = np.iinfo(np.int64).max
"""The version of a sample that has none (a null policy version): never stale."""


@dataclass(frozen=True, eq=False)
class Choice:
    """What one step takes (what it passed over is counted by the reader that plans steps
    one after another: ``lakestream.read.selected``)."""

    step: int
    groups: np.ndarray
    """The first offset of each group taken, in log order."""
    end: int
    """The next step's cursor: the offset after the last group taken."""
    stale: np.ndarray
    """Per sample taken (in the order of ``groups``), whether it is stale (mask mode)."""
    costs: np.ndarray
    """Per group taken, its cost for balancing ranks (zeros when not balancing)."""


def kept(step: int, group_size: int, versions: np.ndarray, accepted: np.ndarray,
         max_staleness: int | None, drop_stale: bool
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group, whether ``step`` may take it and whether its staleness drops it, and per
    sample whether it is stale (what is not kept at ``step`` is not kept at any later
    step)."""
    n = len(accepted)
    stale = np.zeros(len(versions), bool) if max_staleness is None \
        else np.asarray(versions < step - max_staleness)
    group_stale = np.asarray(stale.reshape(n, group_size).any(axis=1)) if n \
        else np.zeros(0, bool)
    if not drop_stale:
        return accepted, np.zeros(n, bool), stale
    return accepted & ~group_stale, group_stale, stale


def choose(step: int, cursor: int, group_size: int, groups: int, *, keep: np.ndarray,
           stale: np.ndarray, costs: np.ndarray) -> Choice | None:
    """The groups step ``step`` takes from ``cursor`` on, the first ``groups`` kept ones, or
    None if the samples given do not hold that many yet.

    Args:
        keep: per group from ``cursor`` on (a whole number of groups), whether ``step`` may
            take it (``kept``).
        stale: per sample from ``cursor`` on, whether it is stale.
        costs: per group, its balancing cost.
    """
    g = group_size
    n = len(keep)
    if len(stale) != n * g or len(costs) != n:
        raise ValueError(f"{len(stale)} samples and {len(costs)} costs for {n} groups of {g}")
    taken = np.flatnonzero(keep)[:groups]
    if len(taken) < groups:
        return None
    seen = int(taken[-1]) + 1 if groups else 0
    samples = (taken[:, None] * g + np.arange(g)[None, :]).ravel()
    return Choice(step=step, groups=cursor + taken * g, end=cursor + seen * g,
                  stale=stale[samples], costs=costs[taken])
