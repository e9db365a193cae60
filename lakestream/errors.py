"""The error hierarchy: one root, and a class for each failure a user may want to catch."""

from __future__ import annotations


class LakestreamError(Exception):
    """Root of every error Lakestream raises on purpose."""


class NotFoundError(LakestreamError, FileNotFoundError):
    """An object, a stream or a log version does not exist."""


class AlreadyExistsError(LakestreamError, FileExistsError):
    """A create-only write found the object already there (HTTP 412 on S3)."""


class StoreError(LakestreamError):
    """The object store failed after its retries; for a write the outcome is unknown."""


class TooLargeError(LakestreamError, ValueError):
    """A stored object is larger than an object of its kind may be (read no further), or a
    write is larger than the producer's options allow (``max_fragment_bytes``,
    ``max_sample_bytes``: nothing was written; split or drop it)."""


class PermissionDeniedError(LakestreamError):
    """The store refused a request for lack of permission (HTTP 401/403): definite, nothing
    was written. Not a StoreError, whose write outcome is unknown."""


class CommitConflictError(LakestreamError):
    """A commit lost every race it entered until its attempts or deadline ran out."""


class CommitStateUnknownError(LakestreamError):
    """A commit may or may not have landed; the files it references must not be deleted."""


class ProducerFencedError(LakestreamError):
    """A newer instance of the same producer id has opened; this one must stop writing."""


class SchemaMismatchError(LakestreamError, ValueError):
    """Data written does not match the stream's schema."""


class StreamSealedError(LakestreamError):
    """The stream is sealed (``Stream.seal``): it takes no more appends."""


class LogCompactedError(LakestreamError):
    """A log version a handle asked for was compacted by gc (it holds a tombstone): the
    handle's view is older than the log's retained start. Handles reopen from the newest
    snapshot on their own; this reaches a caller only where nothing newer can be opened."""

    def __init__(self, message: str, *, version: int, snapshot: int) -> None:
        super().__init__(message)
        self.version = version
        self.snapshot = snapshot
        """The snapshot gc knew to be newest when it compacted: reopen from there on."""


class StepNotAvailableError(LakestreamError):
    """A step is not visible yet (or no longer: it was reclaimed)."""


class CorruptLogError(LakestreamError):
    """A log entry, snapshot or fragment cannot be parsed or fails verification."""


class IncompleteCheckpointError(LakestreamError):
    """A training checkpoint is not whole: no readable ``.metadata``, or a file it names is
    missing or short. No marker names such a checkpoint; resume from an earlier one."""
