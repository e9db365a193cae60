"""Saving a training checkpoint and its marker in one call."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from lakestream.loaders.dataset import StreamDataset


def save_checkpoint(state: dict[str, Any], checkpoint_id: str, dataset: StreamDataset,
                    key: str = "data") -> int | None:
    """Saves ``state`` plus the dataset's state (under ``key``) with
    ``torch.distributed.checkpoint``, then commits the checkpoint marker.

    Collective: call it on every rank. The marker is committed only after every rank's save
    has completed, so a marker always points at a durable checkpoint.

    Returns:
        The marker's log version on rank 0, None elsewhere.
    """
    dcp.save({**state, key: dataset}, checkpoint_id=checkpoint_id)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return dataset.commit_checkpoint(checkpoint_id=checkpoint_id)


def load_checkpoint(state: dict[str, Any], checkpoint_id: str, dataset: StreamDataset,
                    key: str = "data") -> None:
    """Loads what ``save_checkpoint`` saved into ``state`` (in place) and the dataset."""
    dcp.load({**state, key: dataset}, checkpoint_id=checkpoint_id)
