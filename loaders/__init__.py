"""PyTorch loaders: every rank's slice of the same global batches, resumable from a
distributed checkpoint (needs the ``torch`` extra)."""

from __future__ import annotations

from typing import Any

from lakestream.loaders.collate import collate_table
from lakestream.loaders.dataset import StreamDataset
from lakestream.loaders.loader import StreamLoader
from lakestream.loaders.locations import CheckpointLocationError
from lakestream.loaders.options import ReadOptions
from lakestream.loaders.planning import resolve_rank, worker_steps
from lakestream.loaders.reader import StepReader
from lakestream.loaders.resume import StreamMismatchError
from lakestream.reading import DiskCache, Source


def __getattr__(name: str) -> Any:
    """``save_checkpoint`` and ``load_checkpoint`` on first use: they import
    ``torch.distributed.checkpoint`` (a second, paid again by every spawned DataLoader worker,
    which imports this package to unpickle its dataset and never checkpoints)."""
    if name in ("save_checkpoint", "load_checkpoint"):
        from lakestream.loaders import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CheckpointLocationError", "DiskCache", "ReadOptions", "Source", "StepReader",
           "StreamDataset", "StreamLoader", "StreamMismatchError", "collate_table",
           "load_checkpoint", "resolve_rank", "save_checkpoint", "worker_steps"]
