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
    """What one step takes."""

    step: int
    groups: np.ndarray
    """The first offset of each group taken, in log order."""
    end: int
    """The next step's cursor: the offset after the last group taken."""
    stale_dropped: int
    """Samples skipped because their group was stale."""
    filtered: int
    """Samples skipped because the filter rejected their group (and they were not stale)."""
    stale: np.ndarray
    """Per sample taken (in the order of ``groups``), whether it is stale (mask mode)."""
    costs: np.ndarray
    """Per group taken, its cost for balancing ranks (zeros when not balancing)."""

    @property
    def counts(self) -> dict[str, int]:
        """Samples dropped or masked at this step, for logging."""
        return {"stale_dropped": self.stale_dropped, "filtered": self.filtered,
                "stale_masked": int(self.stale.sum())}


def kept(step: int, group_size: int, versions: np.ndarray, accepted: np.ndarray,
         max_staleness: int | None, drop_stale: bool
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group, whether ``step`` may take it and whether it is stale, and per sample
    whether it is stale (what is not kept at ``step`` is not kept at any later step)."""
    n = len(accepted)
    stale = np.zeros(len(versions), bool) if max_staleness is None \
        else np.asarray(versions < step - max_staleness)
    group_stale = np.asarray(stale.reshape(n, group_size).any(axis=1)) if n \
        else np.zeros(0, bool)
    return (accepted & ~group_stale if drop_stale else accepted), group_stale, stale


def choose(step: int, cursor: int, group_size: int, groups: int, *, versions: np.ndarray,
           accepted: np.ndarray, costs: np.ndarray, max_staleness: int | None,
           drop_stale: bool) -> Choice | None:
    """The groups step ``step`` takes from ``cursor`` on, or None if the samples given do
    not hold ``groups`` kept groups yet.

    Args:
        versions: per sample from ``cursor`` on (a whole number of groups), its oldest
            policy version (``FRESH`` when it has none).
        accepted: per group, whether the filter keeps it.
        costs: per group, its balancing cost.
    """
    g = group_size
    n = len(accepted)
    if len(versions) != n * g or len(costs) != n:
        raise ValueError(f"{len(versions)} versions and {len(costs)} costs for {n} groups "
                         f"of {g}")
    keep, group_stale, stale = kept(step, g, versions, accepted, max_staleness, drop_stale)
    taken = np.flatnonzero(keep)[:groups]
    if len(taken) < groups:
        return None
    seen = int(taken[-1]) + 1 if groups else 0
    skipped = np.ones(seen, dtype=bool)
    skipped[taken] = False
    by_staleness = skipped & group_stale[:seen] if drop_stale else np.zeros(seen, dtype=bool)
    samples = (taken[:, None] * g + np.arange(g)[None, :]).ravel()
    return Choice(step=step, groups=cursor + taken * g, end=cursor + seen * g,
                  stale_dropped=int(by_staleness.sum()) * g,
                  filtered=int((skipped & ~by_staleness).sum()) * g,
                  stale=stale[samples], costs=costs[taken])

