"""Object stores: the protocol, and a factory that picks the backend from a stream URI."""

from __future__ import annotations

from lakestream.store.base import ObjectMeta, ObjectStore, PutMode, check_key
from lakestream.store.local import LocalStore

__all__ = ["ObjectMeta", "ObjectStore", "PutMode", "check_key", "LocalStore", "open_store"]


def open_store(uri: str, storage_options: dict[str, str] | None = None) -> ObjectStore:
    """Returns the store rooted at ``uri``: a local path, ``file://`` or ``s3://``.

    Raises:
        ValueError: the URI's scheme is not supported.
    """
    if uri.startswith("s3://") or uri.startswith("s3a://"):
        from lakestream.store.s3 import S3Options, S3Store

        return S3Store("s3://" + uri.split("://", 1)[1], S3Options.from_options(storage_options))
    if uri.startswith("file://"):
        return LocalStore(uri[len("file://"):])
    if "://" in uri:
        raise ValueError(f"unsupported stream URI {uri!r}: use a local path, file:// or s3://")
    return LocalStore(uri)
