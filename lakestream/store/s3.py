"""The S3 store (AWS, MinIO, SeaweedFS, any S3 with conditional writes), through obstore.

obstore is the Python binding of the Rust ``object_store`` crate that deltalake uses, so its
configuration keys are deltalake's ``storage_options`` and one dict opens both. This is the
only module that imports it: 412 becomes AlreadyExistsError, 404 NotFoundError, 401/403
PermissionDeniedError, and every other failure, after the client's retries, StoreError.
boto3, when installed, only resolves credentials and region from an AWS profile (SSO,
assume-role, credential_process) when the options or environment name one.
"""

from __future__ import annotations

import io
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, BinaryIO

import obstore
from obstore.exceptions import (
    AlreadyExistsError as _ObAlreadyExists,
)
from obstore.exceptions import (
    BaseError as _ObError,
)
from obstore.exceptions import (
    NotFoundError as _ObNotFound,
)
from obstore.exceptions import (
    PermissionDeniedError as _ObDenied,
)
from obstore.exceptions import (
    PreconditionError as _ObPrecondition,
)
from obstore.exceptions import (
    UnauthenticatedError as _ObUnauthenticated,
)
from obstore.exceptions import (
    UnknownConfigurationKeyError as _ObUnknownKey,
)
from obstore.store import S3Store as _ObS3Store

from lakestream.errors import (
    AlreadyExistsError,
    LakestreamError,
    NotFoundError,
    PermissionDeniedError,
    StoreError,
)
from lakestream.store.base import ObjectMeta, PutMode, check_key

# Lakestream's own keys in storage_options, beside the object_store ones.
_OWN_KEYS = {"lakestream_max_retries", "lakestream_read_buffer_bytes",
             "lakestream_request_timeout_s"}
_PROFILE_KEYS = ("aws_profile", "profile")

_OWNER_PID: int | None = None
"""The process that started obstore's runtime. Its threads do not exist in a forked child,
where any obstore call hangs or crashes, so a child refuses with a clear error instead."""


def _claim_runtime(uri: str) -> None:
    global _OWNER_PID
    pid = os.getpid()
    if _OWNER_PID is None:
        _OWNER_PID = pid
    elif _OWNER_PID != pid:
        raise LakestreamError(
            f"{uri}: this process was forked from one that already used S3, and the S3 "
            "client cannot run after fork; start workers with the 'spawn' or 'forkserver' "
            "method (DataLoader(..., multiprocessing_context='spawn'), or StreamLoader, "
            "which does)")


@dataclass(frozen=True)
class S3Options:
    """How to reach the bucket: ``config`` is handed to obstore (deltalake's keys; what it
    leaves unset comes from the ``AWS_*`` environment, then instance, container or web
    identity credentials), and retries are bounded here."""

    config: tuple[tuple[str, str], ...] = ()
    max_retries: int = 8
    """Retries per request for 5xx, 429, timeouts and dropped connections."""
    backoff_init_s: float = 0.02
    backoff_cap_s: float = 2.0
    retry_timeout_s: float = 60.0
    read_buffer_bytes: int = 1 << 20
    """Bytes a Parquet reader fetches per ranged GET."""
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    """A whole request, reply included: a connection that never answers is retried, never
    waited on for ever. Large uploads go in parts; raise it for slow links
    (``LAKESTREAM_REQUEST_TIMEOUT_S``)."""

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.read_buffer_bytes < 1:
            raise ValueError("max_retries must be >= 0 and read_buffer_bytes >= 1")

    @classmethod
    def from_options(cls, options: dict[str, str] | None) -> S3Options:
        """Splits deltalake-style ``storage_options`` into obstore's and Lakestream's own.

        An AWS profile (``AWS_PROFILE`` as an option or in the environment) is resolved
        through boto3, which knows SSO, assume-role and credential_process; its region is
        used unless one is given.

        Raises:
            ValueError: a value of Lakestream's own keys is not a number.
        """
        given = {str(k): str(v) for k, v in (options or {}).items()}
        own = {k.lower(): given.pop(k) for k in list(given) if k.lower() in _OWN_KEYS}
        try:
            retries = int(own.get("lakestream_max_retries", 8))
            buffer = int(own.get("lakestream_read_buffer_bytes", 1 << 20))
            timeout = float(own.get("lakestream_request_timeout_s", 30.0))
        except ValueError as e:
            raise ValueError(f"storage option: {e}") from None
        return cls(tuple(sorted(given.items())), max_retries=retries, read_buffer_bytes=buffer,
                   request_timeout_s=timeout)


def _profile_credentials(config: dict[str, str]) -> tuple[dict[str, str], Any]:
    """The profile's region and a credential provider, if a profile is named."""
    lower = {k.lower(): k for k in config}
    profile = next((config.pop(lower[k]) for k in _PROFILE_KEYS if k in lower), None)
    profile = profile or os.environ.get("AWS_PROFILE")
    if not profile or {"aws_access_key_id", "access_key_id"} & set(lower):
        return config, None
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as e:
        raise LakestreamError(f"AWS profile {profile!r} needs boto3: pip install boto3") from e
    session = boto3.Session(profile_name=profile)
    if session.region_name and not {"aws_region", "region"} & set(lower) \
            and not os.environ.get("AWS_REGION") and not os.environ.get("AWS_DEFAULT_REGION"):
        config["aws_region"] = session.region_name
    return config, Boto3CredentialProvider(session)


def _client_settings(o: S3Options) -> dict[str, Any]:
    """obstore's keyword arguments for a store or filesystem with these options."""
    config, provider = _profile_credentials(dict(o.config))
    retry: Any = {"max_retries": o.max_retries,
                  "retry_timeout": timedelta(seconds=o.retry_timeout_s),
                  "backoff": {"init_backoff": timedelta(seconds=o.backoff_init_s),
                              "max_backoff": timedelta(seconds=o.backoff_cap_s),
                              "base": 2}}
    client: Any = {"connect_timeout": timedelta(seconds=o.connect_timeout_s),
                   "timeout": timedelta(seconds=o.request_timeout_s)}
    return {"config": config, "client_options": client, "retry_config": retry,
            "credential_provider": provider}


def _bad_options(uri: str, config: dict[str, str], e: Exception) -> ValueError:
    if isinstance(e, _ObUnknownKey):
        named = str(e).split("'")[1] if "'" in str(e) else str(e)
        key = next((k for k in config if k.lower() == named.lower()), named)
        return ValueError(f"storage option {key!r} is not an S3 option (deltalake's keys: "
                          "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                          "AWS_SESSION_TOKEN, AWS_REGION, AWS_ALLOW_HTTP, ...)")
    return ValueError(f"S3 options for {uri}: {_first_line(e)}")


def s3_filesystem(uri: str, options: S3Options | None = None) -> Any:
    """An fsspec filesystem (obstore's) for ``s3://`` paths with the same options, retries
    and credentials as ``S3Store``: for libraries that write through fsspec, such as
    ``torch.distributed.checkpoint``.

    Raises:
        ValueError: a storage option is unknown (named) or invalid.
    """
    from obstore.fsspec import FsspecStore

    class _Filesystem(FsspecStore):
        # obstore builds a bucket's store from a URL, which takes only ``aws_``-prefixed
        # keys; built as S3Store builds it, every key S3Store accepts works here too.
        def _construct_store(self, bucket: str) -> Any:
            return _ObS3Store(bucket, **settings)

    _claim_runtime(uri)
    settings = _client_settings(options or S3Options())
    try:  # checks the options now, not at the first write
        _ObS3Store(uri[len("s3://"):].partition("/")[0], **settings)
    except (_ObUnknownKey, _ObError) as e:
        raise _bad_options(uri, settings["config"], e) from None
    return _Filesystem("s3", **settings)


class S3Store:
    """A bucket prefix as an object store. ``put(mode="create")`` sends ``If-None-Match: *``.

    Raises (construction):
        ValueError: the URI names no bucket, or a storage option is unknown (named).
    """

    def __init__(self, uri: str, options: S3Options | None = None) -> None:
        if not uri.startswith("s3://"):
            raise ValueError(f"not an S3 URI: {uri!r}")
        bucket, _, prefix = uri[len("s3://"):].partition("/")
        if not bucket:
            raise ValueError(f"S3 URI {uri!r} names no bucket")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.options = options or S3Options()
        _claim_runtime(self.uri)
        settings = _client_settings(self.options)
        try:
            self._store = _ObS3Store(bucket, prefix=self.prefix or None, **settings)
        except (_ObUnknownKey, _ObError) as e:
            raise _bad_options(uri, settings["config"], e) from None

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def _fail(self, what: str, key: str, e: Exception) -> LakestreamError:
        where = f"{self.uri}/{key}"
        if _conflict(e):
            # obstore reports S3's 409 ConditionalRequestConflict ("a conflicting
            # conditional write is in flight: try again") as AlreadyExists. Nothing says the
            # object exists: taken as a 412, a fragment whose PUT never reached the server
            # was committed. It is a transient failure.
            return StoreError(f"{what} {where} met a conflicting write in flight (409)")
        if isinstance(e, (_ObAlreadyExists, _ObPrecondition)):
            return AlreadyExistsError(f"{where} already exists")
        if isinstance(e, (_ObNotFound, FileNotFoundError)):
            return NotFoundError(f"{where} does not exist")
        if isinstance(e, (_ObDenied, _ObUnauthenticated)) or _denied(e):
            return PermissionDeniedError(
                f"{what} {where} was refused: the credentials may not do this "
                f"({_first_line(e)}); see docs/deployment.md for the policies")
        return StoreError(f"{what} {where} failed: {_first_line(e)}")

    def put(self, key: str, data: bytes | memoryview, *, mode: PutMode = "overwrite") -> None:
        """Writes ``data``; a 409 (a conflicting write in flight) is retried here, with
        capped jittered backoff, since the client does not retry it. After a retry a 412
        may be our own earlier attempt: callers of ``mode="create"`` tell (a commit reads
        its entry back; a fragment's key is its writer's alone)."""
        for attempt in range(self.options.max_retries + 1):
            try:
                obstore.put(self._store, check_key(key), data, mode=mode)
                return
            except (_ObError, OSError) as e:
                error = self._fail("writing", key, e)
                if not _conflict(e) or attempt == self.options.max_retries:
                    raise error from None
            cap = min(self.options.backoff_cap_s, self.options.backoff_init_s * 2 ** attempt)
            time.sleep(random.uniform(cap / 2, cap))

    def get(self, key: str) -> bytes:
        try:
            return bytes(obstore.get(self._store, check_key(key)).bytes())
        except (_ObError, OSError) as e:
            raise self._fail("reading", key, e) from None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        try:
            return bytes(obstore.get_range(self._store, check_key(key), start=start, end=end))
        except (_ObError, OSError) as e:
            raise self._fail("reading", key, e) from None

    def head(self, key: str) -> ObjectMeta:
        try:
            meta = obstore.head(self._store, check_key(key))
        except (_ObError, OSError) as e:
            raise self._fail("inspecting", key, e) from None
        return ObjectMeta(key, int(meta["size"]), meta["last_modified"].timestamp())

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        try:
            found = [ObjectMeta(m["path"], int(m["size"]), m["last_modified"].timestamp())
                     for batch in obstore.list(self._store, prefix or None) for m in batch]
        except (_ObError, OSError) as e:
            raise self._fail("listing", prefix, e) from None
        found.sort(key=lambda m: m.key)
        yield from found

    def delete(self, key: str) -> None:
        try:
            obstore.delete(self._store, check_key(key))
        except (_ObNotFound, FileNotFoundError):
            return
        except (_ObError, OSError) as e:
            raise self._fail("deleting", key, e) from None

    def open_input(self, key: str, size: int | None = None) -> BinaryIO:
        if size is None:
            size = self.head(key).size
        return io.BufferedReader(_RangeReader(self, key, size),
                                 buffer_size=self.options.read_buffer_bytes)


class _RangeReader(io.RawIOBase):
    """A seekable raw reader whose reads are ranged GETs, so Parquet reads only the footer and
    the row groups it needs, and store failures keep their types."""

    def __init__(self, store: S3Store, key: str, size: int) -> None:
        self._store, self._key, self._size, self._pos = store, key, size, 0

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

    def readinto(self, buffer: Any) -> int:
        end = min(self._size, self._pos + len(buffer))
        if end <= self._pos:
            return 0
        data = self._store.get_range(self._key, self._pos, end)
        n = len(data)
        buffer[:n] = data
        self._pos += n
        return n


def _conflict(e: BaseException) -> bool:
    return "409 Conflict" in str(e) or "<Code>ConditionalRequestConflict</Code>" in str(e)


def _denied(e: BaseException) -> bool:
    """A 403 that obstore did not type (it types only some requests' refusals)."""
    text = str(e)
    return "403 Forbidden" in text or "AccessDenied" in text


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.split("\n", 1)[0][:300]
