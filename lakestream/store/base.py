"""The object-store protocol every backend implements, and the rules for object keys."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal, Protocol

from lakestream.errors import TooLargeError

Buffer = Any
"""Bytes of an object as a store hands them over: anything with the buffer protocol
(``bytes``, a numpy array, a client's own buffer)."""
PutMode = Literal["create", "overwrite"]
"""``create`` writes the whole object or fails with AlreadyExistsError; ``overwrite`` replaces."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")
_PLAIN_KEY = re.compile(r"(?:[A-Za-z0-9_-][A-Za-z0-9._-]*/)*[A-Za-z0-9_-][A-Za-z0-9._-]*")
"""Keys ``check_key`` accepts at a glance: ASCII segments that cannot be ``.``, ``..`` or
percent-encoded (none starts with a dot, none holds a ``%``)."""


@dataclass(frozen=True)
class ObjectMeta:
    """What a HEAD or LIST tells about one object."""

    key: str
    size: int
    last_modified: float
    """Seconds since the epoch, by the store's own clock."""
    etag: str | None = None
    """The store's tag of this write of the object, where it gives one (S3's ETag)."""


class ObjectStore(Protocol):
    """A flat key space rooted at one stream; keys are relative, ``/``-separated.

    Every backend maps its own failures onto ``NotFoundError``, ``AlreadyExistsError`` and
    ``StoreError``; nothing above the store sees a backend exception.
    """

    @property
    def uri(self) -> str: ...

    def put(self, key: str, data: bytes | memoryview, *, mode: PutMode = "overwrite") -> None:
        """Writes ``data`` atomically; with ``mode="create"`` only if ``key`` is absent.

        ``data`` may be a ``memoryview`` of bytes (format ``B``): fragments are written from
        Arrow's buffer without a copy."""
        ...

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        """The object's bytes. With ``max_bytes``, at most that many are read (a ranged
        GET on S3): a larger object raises ``TooLargeError``, so no reader of stored bytes
        spends more time or memory than its kind allows."""
        ...

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Returns bytes ``[start, end)``."""
        ...

    def get_buffer(self, key: str, size: int) -> Buffer:
        """The bytes of an object the caller knows to be ``size`` bytes (a fragment, whose
        size the log records), in memory the store chooses: a block of a pool, given back
        when the result is let go, or the client's own buffer, never a copy of it. An object
        of another size comes back as it is, for the caller's check to refuse; one larger
        than ``size`` is cut one byte past it.

        Raises:
            NotFoundError, StoreError: as ``get``.
        """
        ...

    def head(self, key: str) -> ObjectMeta: ...

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        """Yields the objects under ``prefix`` (a folder, ending in ``/``), in key order."""
        ...

    def delete(self, key: str) -> None:
        """Deletes ``key``; deleting an absent key is not an error."""
        ...

    def list_temp(self, prefix: str) -> Iterator[ObjectMeta]:
        """Yields what writers killed mid-put left under ``prefix`` (a local store's temp
        files), for gc; nothing on a store whose puts are atomic (S3)."""
        ...

    def open_input(self, key: str, size: int | None = None) -> BinaryIO:
        """A seekable binary reader for Parquet; S3 reads only the ranges asked for."""
        ...


class SeekableReader(io.RawIOBase):
    """A seekable raw reader of an object of ``size`` bytes, as Parquet reads one: a
    subclass says where the bytes come from in ``readinto``."""

    def __init__(self, size: int) -> None:
        self._size, self._pos = size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos


def too_large(key: str, data: bytes, max_bytes: int | None) -> bytes:
    """``data`` read for ``get(key, max_bytes=...)``, unless it holds more than that.

    Raises:
        TooLargeError: naming the key and the bound.
    """
    if max_bytes is not None and len(data) > max_bytes:
        raise TooLargeError(f"{key} is larger than {max_bytes:,} bytes, the most an object "
                            "of its kind may be: it is not one this lakestream wrote")
    return data


def check_key(key: str) -> str:
    """Returns ``key`` if it is a safe relative key inside the stream root.

    Raises:
        ValueError: the key is empty, absolute, has a ``.``/``..`` segment (also
            percent-encoded), a backslash or a control character.
    """
    if type(key) is str and _PLAIN_KEY.fullmatch(key):
        return key  # what the stream's own keys look like: the checks below all pass
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty string, got {key!r}")
    if key.startswith("/") or "://" in key:
        raise ValueError(f"object key {key!r} is absolute; keys are relative to the stream root")
    if _CONTROL.search(key):
        raise ValueError(f"object key {key!r} has a control character or backslash")
    for part in key.split("/"):
        decoded = part.lower().replace("%2e", ".")
        if part == "" or decoded in (".", ".."):
            raise ValueError(f"object key {key!r} has an empty, '.' or '..' segment")
    return key
