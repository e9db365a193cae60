"""Which steps a DataLoader worker reads, and which rank this process is: pure functions."""

from __future__ import annotations

import os


def worker_steps(start: int, stop: int | None, worker: int, num_workers: int) -> range:
    """Steps ``start + worker, start + worker + num_workers, ...`` below ``stop``.

    Dealt round-robin, so a DataLoader (which takes one item from each worker in turn)
    yields the steps in order, none twice, none skipped.
    """
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} is outside {num_workers} workers")
    end = stop if stop is not None else 2**62
    return range(start + worker, max(end, start + worker), num_workers)


def resolve_rank(rank: int | None, world_size: int | None,
                 env: dict[str, str] | None = None,
                 distributed: tuple[int, int] | None = None) -> tuple[int, int]:
    """The (rank, world size): given ones first, then torch.distributed, then the RANK and
    WORLD_SIZE environment variables, else (0, 1).

    Raises:
        ValueError: only one of the two was given, or the rank is outside the world.
    """
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither")
    if rank is None or world_size is None:
        if distributed is not None:
            rank, world_size = distributed
        else:
            e = os.environ if env is None else env
            rank, world_size = int(e.get("RANK", 0)), int(e.get("WORLD_SIZE", 1))
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    return rank, world_size
