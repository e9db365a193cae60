"""StreamLoader: a DataLoader that notes, in the trainer process, each step it yields."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from lakestream.loaders.dataset import StreamDataset


class StreamLoader:
    """A DataLoader over a StreamDataset that notes each step it yields in the trainer
    process. What that adds over ``DataLoader`` or torchdata's ``StatefulDataLoader``, which
    never run the dataset's code in the trainer process when ``num_workers > 0``: rank 0
    publishes the group's progress as steps are consumed, with the trainer's
    ``policy_version`` (what producers' ``max_lag_steps`` reads), and the dataset's own
    ``state_dict()`` is the resume point. Workers start with ``spawn`` (the S3 client cannot
    run after fork). When iteration stops early (``break`` at a step budget on a live
    stream), workers waiting for steps not committed yet stop at once, where a DataLoader
    waits 5 s for each before killing it (not with ``persistent_workers=True``: those
    outlive the loop). Accepts DataLoader's arguments."""

    def __init__(self, dataset: StreamDataset, num_workers: int = 0, **kwargs: Any) -> None:
        self.dataset = dataset
        kwargs.setdefault("batch_size", None)
        if num_workers:
            kwargs.setdefault("multiprocessing_context", "spawn")
            kwargs.setdefault("persistent_workers", False)
        self.loader = torch.utils.data.DataLoader(dataset, num_workers=num_workers, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        context = self.loader.multiprocessing_context
        # Workers of one iteration share its event; persistent ones outlive it, so not theirs.
        stop = context.Event() if context is not None and not self.loader.persistent_workers \
            else None
        self.dataset.stop = stop
        try:
            batches = iter(self.loader)  # starts the workers, each with its copy of `stop`
        finally:
            self.dataset.stop = None
        try:
            for batch in batches:
                step = batch.get(self.dataset.options.step_key) if isinstance(batch, dict) else None
                if step is not None:
                    self.dataset.record_step(int(step))
                yield batch
        finally:
            if stop is not None:
                stop.set()
            del batches  # shuts the workers down, now that none waits for a step
            self.dataset.close()

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
