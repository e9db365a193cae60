"""Lakestream: a brokerless, object-store-native training data plane with a Delta Lake log."""

from __future__ import annotations

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
from lakestream.stream import Stream, create, open

__version__ = "0.1.0"

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
