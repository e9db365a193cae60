"""The rank slice: which share of a step each rank of a world reads, and which worlds may split
a step. Pure functions of the step, the batch and the world."""

from __future__ import annotations


def check_world(global_batch_size: int, group_size: int, world_size: int) -> int:
    """Returns the per-rank batch size B/W.

    Raises:
        ValueError: W does not divide B, or B/W is not a multiple of the group size G.
    """
    b, g, w = global_batch_size, group_size, world_size
    if not isinstance(w, int) or w < 1:
        raise ValueError(f"world_size must be a positive int, got {w!r}")
    if b % w:
        raise ValueError(
            f"world_size {w} does not divide the global batch size {b}: use a world size "
            f"that divides {b}"
        )
    if (b // w) % g:
        raise ValueError(
            f"world_size {w} splits a group of {g} samples across ranks (B/W = {b // w}); "
            f"use a world size W with (B/W) % {g} == 0"
        )
    return b // w


def slice_offsets(step: int, global_batch_size: int, rank: int, world_size: int) -> range:
    """The global offsets rank ``rank`` of ``world_size`` reads for ``step``."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    per_rank = global_batch_size // world_size
    lo = step * global_batch_size + rank * per_rank
    return range(lo, lo + per_rank)
