"""A StreamDataset's read pipeline in one process: how many read threads, what each makes of
a step's slice (read straight into the batch's arrays where it can, collated, stamped with
its step, transformed, delivered pinned or on a device), and the ``StepReader`` that runs
them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from lakestream.loaders.collate import ColumnArrays, collate_table
from lakestream.loaders.device import Delivery
from lakestream.loaders.host import (
    WAITING_READ_THREADS,
    default_prefetch,
    default_read_threads,
    read_slots,
)
from lakestream.loaders.options import ReadOptions
from lakestream.loaders.reader import StepReader, Stop
from lakestream.reading import (
    COUNTS_KEY,
    Steps,
    cpu_slots,
    direct_columns,
    is_remote,
    tensor_spec,
)
from lakestream.stream import Stream


def open_reader(steps: Steps, streams: Sequence[Stream], options: ReadOptions, rank: int,
                world_size: int, *, workers: int | None, stop: Stop | None
                ) -> tuple[StepReader, Delivery]:
    """The reader of this rank's slices of ``steps`` over ``streams``, and how its batches
    are handed over. ``workers``: the DataLoader's workers where this runs in one of them,
    None in the trainer process (where batches are pinned or moved to a device, and each
    worker's share of the cores is the rank's)."""
    in_process = workers is None
    # Until reads are measured: a remote store, or a disk cache, waits.
    waiting = options.disk_cache is not None or any(is_remote(s.uri) for s in streams)
    threads = options.read_threads or default_read_threads(workers or 0)
    cpu_slots().resize(read_slots(workers or 0))
    delivery = Delivery(options.pin_memory and in_process,
                        options.device if in_process else None)
    prefetch = default_prefetch(threads) if options.prefetch is None else options.prefetch
    reader = StepReader(steps, rank, world_size, columns=options.columns, prefetch=prefetch,
                        threads=threads, waiting=waiting,
                        # a count the options fix is the count read with
                        waiting_threads=0 if options.read_threads else WAITING_READ_THREADS,
                        timeout=options.timeout, stop=stop,
                        finish=_finisher(steps, options, not in_process, delivery),
                        arrays=_arrays(streams[0], options, not in_process, delivery))
    return reader, delivery


def _finisher(steps: Steps, options: ReadOptions, shared: bool, delivery: Delivery
              ) -> Callable[[int, Any, dict[str, Any]], Any]:
    """What a read thread makes of a step's slice: the batch, collated (in shared memory
    in a worker), with its step and counts, transformed, delivered."""
    collate, transform, step_key = options.collate, options.transform, options.step_key

    def finish(step: int, table: Any, tensors: dict[str, Any]) -> Any:
        item = collate(table) if callable(collate) else collate_table(table, collate,
                                                                      shared=shared)
        if tensors:
            item.update(tensors)
        if isinstance(item, dict):
            item[step_key] = step
            counts = steps.counts(step)
            if counts is not None:
                item[COUNTS_KEY] = counts
        if transform is not None:
            item = transform(item)
        return delivery.prepare(item)

    return finish


def _arrays(stream: Stream, options: ReadOptions, shared: bool, delivery: Delivery
            ) -> Callable[[], ColumnArrays] | None:
    """What makes a step's arrays for the columns it reads directly (tensor columns, and
    columns of one number a row where every column read is one of these), read straight
    into them (in shared memory in a worker, pinned where the batch is delivered pinned or
    to a GPU); None where the dataset's own collation does not make the batch (a callable
    ``collate`` takes the table whole) or there is no such column."""
    if callable(options.collate):
        return None
    schema = stream.schema
    direct = direct_columns(schema, options.columns)
    if not direct:
        return None
    spec = {n: (d, tensor_spec(schema.field(n)) if d.prefixed else None)
            for n, d in direct.items()}
    return partial(ColumnArrays, spec, shared=shared, pinned=delivery.pin)
