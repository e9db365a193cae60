"""The rank slice: which share of a step each rank of a world reads, and which worlds may split
a step. Pure functions of the step, the batch and the world.

The rule, written once: of ``n`` items (a step's samples, a source's take, a step's groups),
rank ``r`` of ``W`` reads the r-th of W equal shares, ``[r * n/W, (r+1) * n/W)``; W must be a
positive int that divides n, and r lie in ``[0, W)``. A step's share must also hold whole
groups (W divides B, and B/W is a multiple of G), so the G responses to one prompt stay on
one rank. Token balancing (``lakestream.plan.balance``) deals groups otherwise, over the same
world.
"""

from __future__ import annotations

import numpy as np

from lakestream.checks import check_int


def check_world_size(world_size: object) -> int:
    """Returns W if it can be a world size: a positive int (a numpy one too; not a bool).

    Raises:
        ValueError: it cannot.
    """
    return check_int("world_size", world_size, least=1)


def share(n: int, world_size: int, what: str) -> int:
    """``n / W``: how many of ``n`` items each rank reads.

    Raises:
        ValueError: W is not a positive int, or does not divide n (``what`` names the n
            items, as "the global batch size 12").
    """
    w = check_world_size(world_size)
    if n % w:
        raise ValueError(f"world_size {w} does not divide {what}: every rank reads as many; "
                         f"use a world size that divides {n}")
    return n // w


def check_rank(rank: int, world_size: int) -> int:
    """Returns ``rank`` if it is a rank of the world.

    Raises:
        ValueError: it is outside ``[0, world_size)``.
    """
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer) \
            or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank!r} is outside world size {world_size}")
    return int(rank)


def rank_slice(n: int, rank: int, world_size: int, what: str) -> range:
    """The items of ``n`` that rank ``rank`` of ``world_size`` reads: the rank-th share.

    Raises:
        ValueError: the world does not divide ``n`` (``what`` names them), or the rank is
            outside it.
    """
    per_rank = share(n, world_size, what)
    r = check_rank(rank, world_size)
    return range(r * per_rank, (r + 1) * per_rank)


def check_world(global_batch_size: int, group_size: int, world_size: int, *,
                where: str | None = None) -> int:
    """Returns the per-rank batch size B/W.

    Raises:
        ValueError: W is not a positive int, W does not divide B, or B/W is not a multiple
            of the group size G; the message starts with ``where`` if given.
    """
    b, g = global_batch_size, group_size
    try:
        per_rank = share(b, world_size, f"the global batch size {b}")
        if per_rank % g:
            raise ValueError(
                f"world_size {world_size} splits a group of {g} samples across ranks (B/W = "
                f"{per_rank}); use a world size W with (B/W) % {g} == 0")
    except ValueError as e:
        if where is None:
            raise
        raise ValueError(f"{where}: {e}") from None
    return per_rank


def slice_offsets(step: int, global_batch_size: int, rank: int, world_size: int) -> range:
    """The global offsets rank ``rank`` of ``world_size`` reads for ``step`` (check the
    groups with ``check_world``).

    Raises:
        ValueError: a negative step, a world that does not divide B, a rank outside it.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    b = global_batch_size
    mine = rank_slice(b, rank, world_size, f"the global batch size {b}")
    return range(step * b + mine.start, step * b + mine.stop)


def equal_count(n_groups: int, world_size: int) -> list[np.ndarray]:
    """Every rank's groups of a step in the contiguous split: rank r reads groups
    ``[r*n/W, (r+1)*n/W)``.

    Raises:
        ValueError: ``world_size`` is not a positive int or does not divide ``n_groups``.
    """
    return [np.arange(s.start, s.stop) for s in
            (rank_slice(n_groups, r, world_size, f"the step's {n_groups} groups")
             for r in range(check_world_size(world_size)))]
