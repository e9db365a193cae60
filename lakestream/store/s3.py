"""The S3 store (AWS, MinIO, SeaweedFS, any S3 with conditional writes), through obstore.

obstore is the Python binding of the Rust ``object_store`` crate that deltalake uses, so its
configuration keys are deltalake's ``storage_options`` and one dict opens both. Only this
module and ``store/s3errors.py`` (its failures) import it: 412 becomes AlreadyExistsError,
404 NotFoundError (naming the bucket when it is the bucket that is missing), 401/403
PermissionDeniedError (telling credentials the store did not accept, or none found, from a
lack of permission), and every other failure, after the client's retries, StoreError; each
keeps the S3 error code. boto3, when installed, only resolves credentials and region from an
AWS profile (SSO, assume-role, credential_process), the one the options or environment
name, else the default one of a shared credentials file when nothing else names keys.
"""

from __future__ import annotations

import io
import os
import random
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, BinaryIO

import obstore
from obstore.exceptions import (
    BaseError as _ObError,
)
from obstore.exceptions import (
    NotFoundError as _ObNotFound,
)
from obstore.exceptions import (
    UnknownConfigurationKeyError as _ObUnknownKey,
)
from obstore.store import S3Store as _ObS3Store

from lakestream.errors import (
    LakestreamError,
)
from lakestream.store.base import (
    Buffer,
    ObjectMeta,
    PutMode,
    SeekableReader,
    check_key,
    too_large,
)
from lakestream.store.hooks import observed, request
from lakestream.store.s3_options import (
    S3Options,
    check_config,
    direct_reads_allowed,
    lookup,
    with_client_environment,
)
from lakestream.store.s3direct import DirectReads
from lakestream.store.s3errors import Reply, first_line, s3_error
from lakestream.store.slots import cpu_slots

__all__ = ["S3Options", "S3Store", "s3_filesystem"]

_PROFILE_KEYS = ("aws_profile", "profile")
_SIGNED_FOR = timedelta(minutes=15)
"""How long a direct read's URL is valid: it is used at once."""

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


def _profile_credentials(config: dict[str, str]) -> tuple[dict[str, str], Any]:
    """The region and a credential provider of the AWS profile named (``AWS_PROFILE``, an
    option or in the environment), or, when nothing names keys, of the default profile of
    the shared credentials file (``~/.aws/credentials``, or ``AWS_SHARED_CREDENTIALS_FILE``)
    where there is one; ``(config, None)`` otherwise, for the client's own chain."""
    lower = {k.lower(): k for k in config}
    profile = next((config.pop(lower[k]) for k in _PROFILE_KEYS if k in lower), None)
    profile = profile or os.environ.get("AWS_PROFILE")
    if profile and {"aws_access_key_id", "access_key_id"} & set(lower):
        return config, None
    if not profile and (lookup(config, "access_key_id") or not _shared_credentials()
                        or _role_in_environment()):
        return config, None
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as e:
        if not profile:
            return config, None  # the client's chain may still find credentials
        raise LakestreamError(f"AWS profile {profile!r} needs boto3: pip install boto3") from e
    try:
        session = boto3.Session(profile_name=profile)
    except Exception as e:  # noqa: BLE001 - botocore's ProfileNotFound, a malformed file
        raise ValueError(f"AWS profile {profile!r} cannot be used: {e} (profiles are read "
                         "from ~/.aws/config and ~/.aws/credentials)") from None
    if session.region_name and lookup(config, "region") is None \
            and lookup(config, "default_region") is None:
        config["aws_region"] = session.region_name
    return config, Boto3CredentialProvider(session)


def _shared_credentials() -> bool:
    path = os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials"
    return os.path.isfile(os.path.expanduser(path))


def _role_in_environment() -> bool:
    """A web identity or container role that the client's chain takes first."""
    return any(os.environ.get(k) for k in (
        "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI"))


def _client_settings(o: S3Options) -> dict[str, Any]:
    """obstore's keyword arguments for a store or filesystem with these options."""
    config, provider = _profile_credentials(with_client_environment(dict(o.config)))
    check_config(config)
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
    return ValueError(f"S3 options for {uri}: {first_line(e)}")


def s3_filesystem(uri: str, options: S3Options | None = None) -> Any:
    """An fsspec filesystem (obstore's) for ``s3://`` paths with the same options, retries
    and credentials as ``S3Store``: for libraries that write through fsspec, such as
    ``torch.distributed.checkpoint``.

    The settings (secrets among them) are held by the filesystem's own class, never in its
    ``storage_options``, which fsspec keeps in a process-wide cache of instances, shows in
    reprs and pickles with the filesystem: the filesystem is made outside that cache and
    goes, secrets and all, when its user drops it.

    Raises:
        ValueError: a storage option or ``AWS_*`` variable is unknown or unusable (named).
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
    return _Filesystem("s3", skip_instance_cache=True)  # type: ignore[call-overload]


@observed
class S3Store:
    """A bucket prefix as an object store. ``put(mode="create")`` sends ``If-None-Match: *``.

    Raises (construction):
        ValueError: the URI names no bucket, or a storage option or ``AWS_*`` variable is
            unknown or unusable (named; a secret's value is never shown), or the AWS profile
            named is not there.
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
            self._client = _ObS3Store(bucket, prefix=self.prefix or None, **settings)
        except (_ObUnknownKey, _ObError) as e:
            raise _bad_options(uri, settings["config"], e) from None
        self.direct: DirectReads | None = None
        """Fragment GETs received into the reader's buffers, where the options allow."""
        if self.options.direct_reads and direct_reads_allowed(settings["config"]):
            self.direct = DirectReads(self._sign,
                                      connect_timeout_s=self.options.connect_timeout_s,
                                      request_timeout_s=self.options.request_timeout_s)

    def _sign(self, key: str) -> str | None:
        """A presigned GET URL of ``key``; None where the client cannot sign (it found no
        credentials: its own request then says so)."""
        try:
            return obstore.sign(self._store, "GET", key, _SIGNED_FOR)
        except (_ObError, OSError, ValueError):
            return None

    @property
    def _store(self) -> Any:
        """The client, in the process that made it. A forked child (a DataLoader worker
        handed the parent's dataset) refuses with ``_claim_runtime``'s error: the client's
        runtime threads are not there, and its first request would wait for ever."""
        _claim_runtime(self.uri)
        return self._client

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r})"

    def _fail(self, what: str, key: str, e: Exception) -> LakestreamError:
        return s3_error(what, f"{self.uri}/{key}", self.bucket, e)

    @request("put")
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
                if not Reply.of(e).conflict or attempt == self.options.max_retries:
                    raise error from None
            cap = min(self.options.backoff_cap_s, self.options.backoff_init_s * 2 ** attempt)
            time.sleep(random.uniform(cap / 2, cap))

    @request("get")
    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        if max_bytes is not None:
            return too_large(key, self.get_range(key, 0, max_bytes + 1), max_bytes)
        try:
            with cpu_slots().waiting():
                return bytes(obstore.get(self._store, check_key(key)).bytes())
        except (_ObError, OSError) as e:
            raise self._fail("reading", key, e) from None

    @request("get_buffer")
    def get_buffer(self, key: str, size: int) -> Buffer:
        """See ``ObjectStore.get_buffer``: received into a block of the process's buffer
        pool (``store/s3direct.py``), else the client's own buffer, never a copy of it."""
        key = check_key(key)
        try:
            with cpu_slots().waiting():
                if self.direct is not None:
                    out = self.direct.get_buffer(key, size)
                    if out is not None:
                        return out
                return obstore.get_range(self._store, key, start=0, end=size + 1)
        except (_ObError, OSError) as e:
            if size == 0 and ("416" in str(e) or "InvalidRange" in str(e)):
                return b""
            raise self._fail("reading", key, e) from None

    @request("get_range")
    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        try:
            with cpu_slots().waiting():
                data = obstore.get_range(self._store, check_key(key), start=start, end=end)
            return bytes(data)
        except (_ObError, OSError) as e:
            if start == 0 and ("416" in str(e) or "InvalidRange" in str(e)):
                # No byte to serve, as for an empty object: read it whole to be sure (a
                # server may answer so while a create of the key is under way).
                return self.get(key)
            raise self._fail("reading", key, e) from None

    @request("head")
    def head(self, key: str) -> ObjectMeta:
        try:
            with cpu_slots().waiting():
                meta = obstore.head(self._store, check_key(key))
        except (_ObError, OSError) as e:
            raise self._fail("inspecting", key, e) from None
        return ObjectMeta(key, int(meta["size"]), meta["last_modified"].timestamp(),
                          meta.get("e_tag"))

    @request("list")
    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        try:
            found = [ObjectMeta(m["path"], int(m["size"]), m["last_modified"].timestamp(),
                                m.get("e_tag"))
                     for batch in obstore.list(self._store, prefix or None) for m in batch]
        except (_ObError, OSError) as e:
            raise self._fail("listing", prefix, e) from None
        found.sort(key=lambda m: m.key)
        yield from found

    def list_temp(self, prefix: str) -> Iterator[ObjectMeta]:
        """Nothing: an S3 put is atomic, a killed one leaves no object."""
        return iter(())

    @request("delete")
    def delete(self, key: str) -> None:
        try:
            obstore.delete(self._store, check_key(key))
        except (_ObNotFound, FileNotFoundError):
            return
        except (_ObError, OSError) as e:
            raise self._fail("deleting", key, e) from None

    @request("open_input")
    def open_input(self, key: str, size: int | None = None) -> BinaryIO:
        if size is None:
            size = self.head(key).size
        return io.BufferedReader(_RangeReader(self, key, size),
                                 buffer_size=self.options.read_buffer_bytes)


class _RangeReader(SeekableReader):
    """A seekable raw reader whose reads are ranged GETs, so Parquet reads only the footer and
    the row groups it needs, and store failures keep their types."""

    def __init__(self, store: S3Store, key: str, size: int) -> None:
        super().__init__(size)
        self._store, self._key = store, key

    def readinto(self, buffer: Any) -> int:
        end = min(self._size, self._pos + len(buffer))
        if end <= self._pos:
            return 0
        data = self._store.get_range(self._key, self._pos, end)
        n = len(data)
        buffer[:n] = data
        self._pos += n
        return n
