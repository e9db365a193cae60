"""Lakestream: a brokerless, object-store-native training data plane with a Delta Lake log."""

from __future__ import annotations

import pyarrow as pa

from lakestream.errors import (
    AlreadyExistsError,
    CommitConflictError,
    CommitStateUnknownError,
    CorruptLogError,
    IncompleteCheckpointError,
    LakestreamError,
    LogCompactedError,
    NotFoundError,
    PermissionDeniedError,
    ProducerFencedError,
    SchemaMismatchError,
    StepNotAvailableError,
    StoreError,
    StreamSealedError,
    TooLargeError,
)
from lakestream.log.replay import Marker
from lakestream.schema.tensors import tensor_field
from lakestream.stream import Stream

__version__ = "0.1.0"


def create(uri: str, schema: pa.Schema, global_batch_size: int, group_size: int = 1, *,
           storage_options: dict[str, str] | None = None,
           snapshot_interval: int = 100) -> Stream:
    """Creates a stream; see ``Stream.create``."""
    return Stream.create(uri, schema, global_batch_size=global_batch_size,
                         group_size=group_size, snapshot_interval=snapshot_interval,
                         storage_options=storage_options)


def open(uri: str, *, storage_options: dict[str, str] | None = None) -> Stream:  # noqa: A001
    """Opens a stream; see ``Stream.open``."""
    return Stream.open(uri, storage_options=storage_options)


__all__ = [
    "AlreadyExistsError",
    "CommitConflictError",
    "CommitStateUnknownError",
    "CorruptLogError",
    "IncompleteCheckpointError",
    "LakestreamError",
    "LogCompactedError",
    "Marker",
    "NotFoundError",
    "PermissionDeniedError",
    "ProducerFencedError",
    "SchemaMismatchError",
    "StepNotAvailableError",
    "StoreError",
    "Stream",
    "StreamSealedError",
    "TooLargeError",
    "create",
    "open",
    "tensor_field",
]
