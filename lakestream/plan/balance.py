"""Token-balanced rank slices: which of a step's groups each rank reads, so that every rank
gets the same number of groups and about the same number of tokens. Pure functions of the
groups' costs and the world size.

A step's groups have costs (tokens: the sum of their samples' lengths). The contiguous
split (``lakestream.plan.slices.equal_count``) gives rank r groups ``[r*n/W, (r+1)*n/W)``;
its slowest rank sets the step's time, and with responses whose lengths vary a few-fold it
carries well above the mean.
``balance_groups`` keeps the counts equal (every rank's batch stays B/W samples) and evens
the tokens with the balanced largest differencing method of Karmarkar and Karp:

- sort the costs in descending order and cut them into chunks of W, each a partial partition
  of W one-item subsets;
- merge, while two remain, the two partial partitions whose subsets' sums are furthest apart
  (max - min: their gap), pairing the largest subset of one with the smallest of the other.
  Subsets keep equal counts, and a merge's gap is at most the larger of the two gaps merged,
  so the final gap is at most that of the widest chunk (at most the largest cost);
- then swap a group of the heaviest rank for a lighter one of another rank while that lowers
  the larger of the two ranks' loads: never raises the maximum nor lowers the minimum.

Ties are broken by position in the sorted order (cost, then group index), never by object
identity, so every rank and every machine computes the same assignment from the same costs.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from lakestream.plan.slices import share

# A subset: its sum and the sorted positions of its groups (the first is its tie-break key).
_Subset = tuple[int, list[int]]


def _costs(costs: np.ndarray | Sequence[int]) -> np.ndarray:
    c = np.asarray(costs)
    if c.ndim != 1:
        raise ValueError(f"costs must be one-dimensional, got shape {c.shape}")
    if c.size == 0:
        return c.astype(np.int64)
    if c.dtype.kind not in "iu":
        raise TypeError(f"costs must be integers (tokens per group), got dtype {c.dtype}")
    c = c.astype(np.int64)
    negative = np.flatnonzero(c < 0)
    if negative.size:
        i = int(negative[0])
        raise ValueError(f"costs must be >= 0; group {i} costs {int(c[i])}")
    return c


def balance_groups(costs: np.ndarray | Sequence[int], world_size: int) -> list[np.ndarray]:
    """The groups each rank reads, with equal counts and the largest rank's tokens near the
    mean (see the module docstring).

    Args:
        costs: ``costs[i]`` is the token cost of the step's i-th group (non-negative ints).
        world_size: W, the number of data-parallel ranks.

    Returns:
        W arrays of ascending group indices, ordered by their smallest index: every group
        appears in exactly one, each holds ``len(costs) / W``. The largest rank's total is at
        most the mean plus the largest cost (more precisely: the largest and smallest ranks
        differ by at most the widest range of W consecutive costs in descending order). The
        same ``(costs, world_size)`` gives the same result on every machine.

    Raises:
        ValueError: ``world_size`` < 1 or does not divide the number of groups; a cost is
            negative; ``costs`` is not one-dimensional.
        TypeError: ``costs`` are not integers.
    """
    c = _costs(costs)
    per_rank = share(c.size, world_size, f"the step's {c.size} groups")
    w = int(world_size)
    if per_rank == 0:
        return [np.empty(0, np.int64) for _ in range(w)]
    if w == 1:
        return [np.arange(c.size)]
    order = np.argsort(-c, kind="stable")  # descending; equal costs by group index
    ranked = c[order]
    subsets = largest_differencing(ranked.tolist(), w)
    owner = np.empty(c.size, np.int64)
    for k, (_, positions) in enumerate(subsets):
        owner[positions] = k
    owner = _swap_down(ranked, owner, w)
    by_rank = order[np.lexsort((order, owner))]  # by subset, then ascending group index
    groups = np.split(by_rank, w)
    groups.sort(key=lambda g: int(g[0]))
    return groups


def largest_differencing(ranked: list[int], w: int) -> list[_Subset]:
    """Balanced largest differencing (Karmarkar-Karp) over costs in descending order: W
    subsets of equal count, as (sum, positions in ``ranked``), before the local search that
    ``balance_groups`` runs on them (``bench/balance.py`` measures what that search adds)."""
    heap: list[tuple[int, int, list[_Subset]]] = []
    for k, lo in enumerate(range(0, len(ranked), w)):
        part = [(ranked[p], [p]) for p in range(lo, lo + w)]  # already largest first
        heap.append((part[-1][0] - part[0][0], k, part))  # -gap: a min-heap pops the widest
    heapq.heapify(heap)
    made = len(heap)  # a unique second key: lists are never compared
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        part = [(sa + sb, pa + pb) for (sa, pa), (sb, pb) in zip(a, reversed(b), strict=True)]
        part.sort(key=lambda s: (-s[0], s[1][0]))
        heapq.heappush(heap, (part[-1][0] - part[0][0], made, part))
        made += 1
    return heap[0][2]


def _swap_down(ranked: np.ndarray, owner: np.ndarray, w: int) -> np.ndarray:
    """Local search: the best swap of a group of the heaviest rank (the first of equals) for a
    lighter group of another, while it lowers the larger of the two ranks' loads. Each swap
    lowers the loads in descending order lexicographically, so it ends; the cap keeps it
    cheap."""
    positions = np.arange(ranked.size)
    loads = np.zeros(w, np.int64)
    np.add.at(loads, owner, ranked)  # exact integer sums
    for _ in range(ranked.size):
        h = int(np.argmax(loads))
        mine, others = positions[owner == h], positions[owner != h]
        d = ranked[mine][:, None] - ranked[others][None, :]
        top = int(loads[h])
        after = np.maximum(top - d, loads[owner[others]][None, :] + d)
        after[d <= 0] = top
        best = int(np.argmin(after))  # the first of equals: a fixed order of positions
        if after.flat[best] >= top:
            break
        i, j = divmod(best, others.size)
        r, gain = int(owner[others[j]]), int(d.flat[best])
        owner[mine[i]], owner[others[j]] = r, h
        loads[h] -= gain
        loads[r] += gain
    return owner


def spread(costs: np.ndarray | Sequence[int], assignment: Sequence[np.ndarray]) -> float:
    """The largest rank's total cost over the mean rank's: 1.0 is perfect balance (and is
    what a step of no tokens gets).

    Raises:
        ValueError: ``assignment`` has no ranks.
    """
    if not assignment:
        raise ValueError("an assignment needs at least one rank")
    c = np.asarray(costs, dtype=np.float64)
    loads = np.array([c[np.asarray(g, dtype=np.int64)].sum() for g in assignment])
    mean = loads.sum() / len(assignment)
    return float(loads.max() / mean) if mean > 0 else 1.0
