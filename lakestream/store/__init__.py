"""Object stores: the protocol, and a factory that picks the backend from a stream URI."""

from __future__ import annotations

from typing import Any

from lakestream.store.base import ObjectMeta, ObjectStore, PutMode, check_key
from lakestream.store.local import LocalStore

__all__ = ["ObjectMeta", "ObjectStore", "PutMode", "check_key", "LocalStore", "open_filesystem",
           "open_store"]


def open_store(uri: str, storage_options: dict[str, str] | None = None) -> ObjectStore:
    """Returns the store rooted at ``uri``: a local path, ``file://`` or ``s3://``.

    A local store takes one option, ``fsync`` (``"true"``: every write is flushed to disk
    before it becomes visible, so a committed entry survives a power loss, at the cost of
    a sync per write; default ``"false"``, which survives process crashes only).

    Raises:
        ValueError: the URI's scheme is not supported, or an option is unknown or invalid.
    """
    if uri.startswith("s3://") or uri.startswith("s3a://"):
        from lakestream.store.s3 import S3Options, S3Store

        return S3Store("s3://" + uri.split("://", 1)[1], S3Options.from_options(storage_options))
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    elif "://" in uri:
        raise ValueError(f"unsupported stream URI {uri!r}: use a local path, file:// or s3://")
    return LocalStore(uri, fsync=_local_fsync(uri, storage_options or {}))


def open_filesystem(uri: str, storage_options: dict[str, str] | None = None) -> Any:
    """An fsspec filesystem for a remote ``uri``: for ``s3://`` one with the same options,
    retries and credentials as the S3 store (obstore's); for any other scheme fsspec's own,
    given ``storage_options`` as its arguments.

    Raises:
        ValueError: an option is unknown or invalid, or no fsspec filesystem serves the
            scheme (its package is not installed).
    """
    if uri.startswith("s3://") or uri.startswith("s3a://"):
        from lakestream.store.s3 import S3Options, s3_filesystem

        return s3_filesystem("s3://" + uri.split("://", 1)[1],
                             S3Options.from_options(storage_options))
    import fsspec

    try:
        return fsspec.core.url_to_fs(uri, **(storage_options or {}))[0]
    except ImportError as e:
        raise ValueError(f"no filesystem for {uri}: {e}") from None


def _local_fsync(uri: str, options: dict[str, str]) -> bool:
    given = {k.lower(): str(v).lower() for k, v in options.items()}
    unknown = sorted(k for k in options if k.lower() != "fsync")
    if unknown:
        raise ValueError(f"storage options {unknown} do not apply to the local stream {uri}; "
                         "a local stream takes only 'fsync'")
    value = given.get("fsync", "false")
    if value not in ("true", "false", "1", "0"):
        raise ValueError(f"storage option fsync={value!r} for {uri}: use 'true' or 'false'")
    return value in ("true", "1")
