"""Object stores: the protocol, a factory that picks the backend from a stream URI, and the
hooks that see every request a store makes (``add_request_hook``)."""

from __future__ import annotations

import re
from typing import Any

from lakestream.store.base import ObjectMeta, ObjectStore, PutMode, check_key
from lakestream.store.hooks import Request, add_request_hook
from lakestream.store.local import LocalStore

__all__ = ["LocalStore", "ObjectMeta", "ObjectStore", "PutMode", "Request", "add_request_hook",
           "check_key", "is_remote", "open_filesystem", "open_store", "split_uri"]


def open_store(uri: str, storage_options: dict[str, str] | None = None) -> ObjectStore:
    """Returns the store rooted at ``uri``: a local path, ``file://`` or ``s3://`` (the
    scheme in any case; ``s3a://`` is taken as ``s3://``).

    A local store takes one option, ``fsync`` (``"true"``: every write is flushed to disk
    before it becomes visible, so a committed entry survives a power loss, at the cost of
    a sync per write; default ``"false"``, which survives process crashes only).

    Raises:
        ValueError: the URI's scheme is not supported, a local path looks like a URI with
            a mistyped scheme (``s3:/bucket``), or an option is unknown or invalid.
    """
    scheme, rest = split_uri(uri)
    if scheme == "s3":
        from lakestream.store.s3 import S3Options, S3Store

        return S3Store("s3://" + rest, S3Options.from_options(storage_options))
    if scheme == "file":
        uri = rest
    elif scheme is not None:
        raise ValueError(f"unsupported stream URI {uri!r}: use a local path, file:// or s3://")
    return LocalStore(uri, fsync=_local_fsync(uri, storage_options or {}))


def is_remote(uri: str) -> bool:
    """Whether the store at ``uri`` answers over a network (``s3://``), where a read waits
    on the store rather than the CPU."""
    return split_uri(uri)[0] == "s3"


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(/*)(.*)", re.DOTALL)
_KNOWN = {"s3", "s3a", "s3n", "file", "gs", "gcs", "az", "abfs", "abfss", "adl", "hdfs", "http",
          "https", "r2", "oss", "cos", "memory"}


def split_uri(uri: str) -> tuple[str | None, str]:
    """``(scheme, rest)`` of a stream URI, the scheme lower case and ``s3a`` taken as ``s3``;
    ``(None, uri)`` for a local path.

    Raises:
        ValueError: ``uri`` looks like a URI with a mistyped scheme (``s3:/bucket/x``,
            ``s3:bucket/x``, ``gs:/x``): taken as a local path it would silently create a
            folder named ``s3:`` in the working directory.
    """
    m = _SCHEME.fullmatch(uri)
    if m is None or len(m.group(1)) < 2:  # a drive letter (C:) is a path
        return None, uri
    scheme, slashes, rest = m.group(1).lower(), m.group(2), m.group(3)
    if slashes.startswith("//"):
        return ("s3" if scheme == "s3a" else scheme), slashes[2:] + rest
    if scheme == "file" and slashes:  # file:/path, as RFC 8089 allows
        return scheme, "/" + rest
    if slashes or scheme in _KNOWN:
        raise ValueError(
            f"stream URI {uri!r} is not a URI ({scheme}: needs two slashes) and is refused as "
            f"a local path: did you mean {scheme}://{rest.lstrip('/')}? A local folder with a "
            f"colon in its name is written ./{uri}")
    return None, uri


def open_filesystem(uri: str, storage_options: dict[str, str] | None = None) -> Any:
    """An fsspec filesystem for a remote ``uri``: for ``s3://`` one with the same options,
    retries and credentials as the S3 store (obstore's); for any other scheme fsspec's own,
    given ``storage_options`` as its arguments.

    Raises:
        ValueError: an option is unknown or invalid, or no fsspec filesystem serves the
            scheme (its package is not installed).
    """
    if split_uri(uri)[0] == "s3":
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
