"""The S3 store (AWS, MinIO, any S3 with conditional writes), through boto3.

This is the only module that imports botocore: it turns HTTP 412 into AlreadyExistsError,
404 into NotFoundError and every other failure, after retries, into StoreError.
"""

from __future__ import annotations

import io
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from lakestream.errors import AlreadyExistsError, NotFoundError, StoreError
from lakestream.store.base import ObjectMeta, PutMode, check_key

# deltalake's storage_options keys (case-insensitive), with the aliases it also accepts.
_KEYS = {
    "endpoint_url": ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint"),
    "access_key_id": ("aws_access_key_id", "access_key_id"),
    "secret_access_key": ("aws_secret_access_key", "secret_access_key"),
    "session_token": ("aws_session_token", "session_token", "aws_token", "token"),
    "region": ("aws_region", "region", "aws_default_region"),
    "allow_http": ("aws_allow_http", "allow_http"),
}
_RETRYABLE = {"409", "500", "502", "503", "504", "SlowDown", "ConditionalRequestConflict",
              "InternalError", "ServiceUnavailable", "RequestTimeout"}


@dataclass(frozen=True)
class S3Options:
    """Where and how to reach S3. Unset fields fall back to boto3's environment chain
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``, profiles, instance roles)."""

    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    region: str | None = None
    allow_http: bool = False
    max_attempts: int = 8
    """Attempts per request for throttling, 5xx and 409 ConditionalRequestConflict."""
    backoff_cap_s: float = 2.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    max_pool_connections: int = 32
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.endpoint_url and self.endpoint_url.startswith("http://") and not self.allow_http:
            raise ValueError(
                f"endpoint {self.endpoint_url} is plain HTTP; set AWS_ALLOW_HTTP=true to allow it"
            )

    @classmethod
    def from_options(cls, options: dict[str, str] | None) -> S3Options:
        """Reads deltalake-style ``storage_options``, then the environment for what is unset."""
        given = {k.lower(): v for k, v in (options or {}).items()}
        values: dict[str, Any] = {}
        for name, aliases in _KEYS.items():
            for alias in aliases:
                if alias in given:
                    values[name] = given.pop(alias)
                    break
            else:
                env = os.environ.get(aliases[0].upper())
                if env is not None:
                    values[name] = env
        if "allow_http" in values:
            values["allow_http"] = str(values["allow_http"]).lower() in ("1", "true", "yes")
        return cls(**values, extra=given)


def _code(e: ClientError) -> str:
    err = e.response.get("Error", {})
    return str(err.get("Code") or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


def _status(e: ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


class S3Store:
    """A bucket prefix as an object store. ``put(mode="create")`` sends ``If-None-Match: *``."""

    def __init__(self, uri: str, options: S3Options | None = None) -> None:
        if not uri.startswith("s3://"):
            raise ValueError(f"not an S3 URI: {uri!r}")
        bucket, _, prefix = uri[len("s3://"):].partition("/")
        if not bucket:
            raise ValueError(f"S3 URI {uri!r} names no bucket")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.options = options or S3Options()
        self._client_pid = -1
        self._client_obj: Any = None

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def client(self) -> Any:
        """The boto3 client, made anew in a forked child (clients do not survive fork)."""
        if self._client_pid != os.getpid():
            o = self.options
            config = Config(
                retries={"max_attempts": 1, "mode": "standard"},
                connect_timeout=o.connect_timeout_s,
                read_timeout=o.read_timeout_s,
                max_pool_connections=o.max_pool_connections,
                s3={"addressing_style": "path"} if o.endpoint_url else None,
            )
            self._client_obj = boto3.session.Session().client(
                "s3",
                endpoint_url=o.endpoint_url,
                aws_access_key_id=o.access_key_id,
                aws_secret_access_key=o.secret_access_key,
                aws_session_token=o.session_token,
                region_name=o.region or "us-east-1",
                config=config,
            )
            self._client_pid = os.getpid()
        return self._client_obj

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _call(self, what: str, key: str, fn: Any, **kwargs: Any) -> Any:
        """Runs one request, retrying throttling, 5xx and 409 with capped, jittered backoff."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn(Bucket=self.bucket, **kwargs)
            except ClientError as e:
                code, status = _code(e), _status(e)
                if status == 412 or code == "PreconditionFailed":
                    raise AlreadyExistsError(f"{self.uri}/{key} already exists") from None
                if status == 404 or code in ("NoSuchKey", "404", "NotFound"):
                    raise NotFoundError(f"{self.uri}/{key} does not exist") from None
                if code == "NoSuchBucket":
                    raise NotFoundError(f"bucket {self.bucket} does not exist") from None
                if (code in _RETRYABLE or status >= 500) and attempt < self.options.max_attempts:
                    self._sleep(attempt)
                    continue
                raise StoreError(f"{what} {self.uri}/{key} failed: {code} {e}") from e
            except BotoCoreError as e:
                if attempt < self.options.max_attempts:
                    self._sleep(attempt)
                    continue
                raise StoreError(f"{what} {self.uri}/{key} failed: {e}") from e

    def _sleep(self, attempt: int) -> None:
        cap = min(self.options.backoff_cap_s, 0.02 * 2**attempt)
        time.sleep(random.uniform(cap / 2, cap))

    def put(self, key: str, data: bytes, *, mode: PutMode = "overwrite") -> None:
        extra = {"IfNoneMatch": "*"} if mode == "create" else {}
        self._call("writing", key, self.client.put_object, Key=self._key(key), Body=data, **extra)

    def get(self, key: str) -> bytes:
        r = self._call("reading", key, self.client.get_object, Key=self._key(key))
        return bytes(r["Body"].read())

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        r = self._call("reading", key, self.client.get_object, Key=self._key(key),
                       Range=f"bytes={start}-{end - 1}")
        return bytes(r["Body"].read())

    def head(self, key: str) -> ObjectMeta:
        r = self._call("inspecting", key, self.client.head_object, Key=self._key(key))
        return ObjectMeta(key, int(r["ContentLength"]), r["LastModified"].timestamp())

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": self.prefix + prefix}
            if token:
                kwargs["ContinuationToken"] = token
            r = self._call("listing", prefix, self.client.list_objects_v2, **kwargs)
            for o in r.get("Contents", []):
                yield ObjectMeta(o["Key"][len(self.prefix):], int(o["Size"]),
                                 o["LastModified"].timestamp())
            if not r.get("IsTruncated"):
                return
            token = r["NextContinuationToken"]

    def delete(self, key: str) -> None:
        self._call("deleting", key, self.client.delete_object, Key=self._key(key))

    def open_input(self, key: str, size: int | None = None) -> BinaryIO:
        if size is None:
            size = self.head(key).size
        return io.BufferedReader(_RangeReader(self, key, size), buffer_size=64 * 1024)

    def create_bucket(self) -> None:
        """Creates the bucket if it is missing (for tests and first-time set-up)."""
        try:
            self.client.create_bucket(Bucket=self.bucket)
        except ClientError as e:
            if _code(e) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise StoreError(f"creating bucket {self.bucket} failed: {e}") from e


class _RangeReader(io.RawIOBase):
    """A seekable raw reader whose reads are ranged GETs."""

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
