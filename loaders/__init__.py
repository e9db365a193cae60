"""PyTorch loaders: every rank's slice of the same global batches, resumable from a
distributed checkpoint (needs the ``torch`` extra)."""

from __future__ import annotations

from lakestream.loaders.checkpoint import load_checkpoint, save_checkpoint
from lakestream.loaders.collate import collate_table
from lakestream.loaders.dataset import StreamDataset
from lakestream.loaders.loader import StreamLoader
from lakestream.loaders.planning import resolve_rank, worker_steps
from lakestream.loaders.reader import StepReader
from lakestream.steps import Source

__all__ = ["Source", "StepReader", "StreamDataset", "StreamLoader", "collate_table",
           "load_checkpoint", "resolve_rank", "save_checkpoint", "worker_steps"]
