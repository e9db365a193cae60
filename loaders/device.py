"""Handing batches to a GPU from the reader's threads: pinned host memory, and copies to the
device on a side stream, ahead of use, so that the training loop's thread does neither.

``Delivery(pin_memory, device)`` is built once per iteration. Its ``prepare`` runs in a read
thread: it pins each tensor of a batch and, with a CUDA device, copies it there on a CUDA
stream of its own, recording an event. ``hand_over`` runs in the consumer's thread: it makes
the consumer's current stream wait for that event (no host wait) and marks the tensors as
used there, so that the allocator does not reuse their memory while the training step reads
them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

EVENT_KEY = "_lakestream_ready"


def check_delivery(pin_memory: bool, device: str | torch.device | None) -> torch.device | None:
    """``device`` as a ``torch.device``, once it is known that this process can deliver there.

    Raises:
        ValueError: ``pin_memory`` or a CUDA ``device`` where CUDA is not available, or a
            device that is neither CPU nor CUDA.
    """
    dev = None if device is None else torch.device(device)
    if dev is not None and dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be a CPU or CUDA device, got {device!r}")
    if (pin_memory or (dev is not None and dev.type == "cuda")) \
            and not torch.cuda.is_available():
        raise ValueError("pin_memory=True and device='cuda' need CUDA, which this "
                         "process does not have: leave them unset on a CPU-only host")
    return dev


class Delivery:
    """Pins batches and, with a CUDA ``device``, moves them there ahead of use.

    Raises:
        ValueError: as ``check_delivery``.
    """

    def __init__(self, pin_memory: bool, device: str | torch.device | None) -> None:
        self.device = check_delivery(pin_memory, device)
        self.cuda = self.device is not None and self.device.type == "cuda"
        self.pin = pin_memory or self.cuda
        self._local = threading.local()

    def _stream(self) -> torch.cuda.Stream:
        """This read thread's CUDA stream (one per thread: copies of different steps overlap)."""
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(device=self.device)
        return stream

    def prepare(self, item: Any) -> Any:
        """``item`` with its tensors pinned, and on the device (with the event its copies
        complete at under ``EVENT_KEY``); runs in a read thread."""
        if not self.pin:
            return item
        if not self.cuda:
            return _map(item, lambda t: t.pin_memory())
        stream = self._stream()
        with torch.cuda.stream(stream):
            moved = _map(item, lambda t: t.pin_memory().to(self.device, non_blocking=True))
            event = torch.cuda.Event()
            event.record(stream)
        if isinstance(moved, dict):
            moved[EVENT_KEY] = event
            return moved
        return _Ready(moved, event)

    def hand_over(self, item: Any) -> Any:
        """``item`` ready for the consumer's current CUDA stream; runs in the consumer."""
        if not self.cuda:
            return item
        if isinstance(item, dict):
            event = item.pop(EVENT_KEY)
        else:
            item, event = item.item, item.event
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        for tensor in _tensors(item):
            tensor.record_stream(current)
        return item


class _Ready:
    """A batch that is not a dict, with the event its copies complete at."""

    def __init__(self, item: Any, event: torch.cuda.Event) -> None:
        self.item, self.event = item, event


def _tensors(item: Any) -> list[torch.Tensor]:
    """The tensors in a batch (dicts, lists and tuples of them)."""
    if isinstance(item, torch.Tensor):
        return [item]
    values = item.values() if isinstance(item, dict) else \
        item if isinstance(item, (list, tuple)) else ()
    return [t for v in values for t in _tensors(v)]


def _map(item: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn`` applied to every tensor in a batch (dicts, lists and tuples of them)."""
    if isinstance(item, torch.Tensor):
        return fn(item)
    if isinstance(item, dict):
        return {k: _map(v, fn) for k, v in item.items()}
    if isinstance(item, list):
        return [_map(v, fn) for v in item]
    if isinstance(item, tuple):
        return tuple(_map(v, fn) for v in item)
    return item
