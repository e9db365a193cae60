"""What opens a bucket: ``S3Options``, the storage-option keys and the environment variables
behind them, checked before the S3 client sees them, and secrets kept out of reprs."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from urllib.parse import urlsplit

# Lakestream's own keys in storage_options, beside the object_store ones.
_OWN_KEYS = {"lakestream_max_retries", "lakestream_read_buffer_bytes",
             "lakestream_request_timeout_s", "lakestream_direct_reads"}
# object_store's aliases of one setting, beyond the ``aws_`` prefix it drops.
_ALIASES = {"endpoint_url": "endpoint", "token": "session_token", "bucket_name": "bucket"}
_SECRETS = {"secret_access_key", "session_token"}
# The settings that go into request headers, the URL or the signature: a character there
# that HTTP cannot carry panics inside the client instead of failing.
_SENT = ("access_key_id", "secret_access_key", "session_token", "region", "default_region",
         "endpoint")
_TRUE = {"1", "true", "on", "yes", "y"}
_FALSE = {"0", "false", "off", "no", "n"}
# Settings that change how a GET is sent beyond its signed URL (a proxy, a trust store or a
# header of the client's): where one is set, every read goes through the client.
_CLIENT_ONLY = ("proxy_url", "proxy_ca_certificate", "allow_invalid_certificates",
                "request_payer", "sse_customer_key_base64", "skip_signature")
# The client's own settings that obstore drops from the environment once it is handed
# client options (the timeouts are Lakestream's), so they are copied into the config.
_CLIENT_SETTINGS = ("allow_http", "allow_invalid_certificates", "proxy_url",
                    "proxy_ca_certificate", "proxy_excludes", "user_agent",
                    "default_content_type", "http1_only", "http2_only")


def setting(key: str) -> str:
    """The setting a storage option or ``AWS_*`` variable names, as object_store reads it:
    lower case, ``aws_`` dropped, aliases merged (``AWS_ENDPOINT_URL`` -> ``endpoint``)."""
    name = key.strip().lower().removeprefix("aws_")
    return _ALIASES.get(name, name)


def is_secret(key: str) -> bool:
    """Whether the storage option ``key`` holds a secret (a secret key, a session token, a
    password): its value is never shown, and the command line refuses it."""
    name = setting(key)
    return name in _SECRETS or name.endswith(("secret", "password", "_token"))


def lookup(config: dict[str, str], name: str) -> tuple[str, str] | None:
    """``(where, value)`` of setting ``name``: the storage option that sets it, else the
    ``AWS_*`` environment variable the client falls back on; None if neither does."""
    for key, value in config.items():
        if setting(key) == name:
            return f"storage option {key}", value
    for key, value in sorted(os.environ.items()):
        if key.startswith("AWS_") and setting(key) == name:
            return f"environment variable {key}", value
    return None


def with_client_environment(config: dict[str, str]) -> dict[str, str]:
    """``config`` plus the client settings (``AWS_ALLOW_HTTP``, ``AWS_PROXY_URL``, ...)
    that only the environment sets: obstore reads them from there only when it is given no
    client options, and it is always given some (the timeouts)."""
    out = dict(config)
    for name in _CLIENT_SETTINGS:
        found = lookup(config, name)
        if found is not None and found[0].startswith("environment"):
            out[f"aws_{name}"] = found[1]
    return out


def check_config(config: dict[str, str]) -> None:
    """Refuses settings the client cannot use, naming them, before it sees them: in it, a
    malformed endpoint or a newline in a key is a panic, and a plain-HTTP endpoint without
    ``AWS_ALLOW_HTTP`` a "builder error" at the first request. A secret's value is never
    shown.

    Raises:
        ValueError: a setting (a storage option or an ``AWS_*`` variable) is unusable.
    """
    for name in _SENT:
        found = lookup(config, name)
        if found and not all(32 <= ord(c) < 127 for c in found[1]):
            where, value = found
            shown = "" if is_secret(name) else f" ({value!r})"
            raise ValueError(f"{where}{shown} holds a character HTTP cannot carry (a "
                             "control character, such as a newline pasted with it, or a "
                             "non-ASCII one): remove it")
    found = lookup(config, "endpoint")
    if found is None:
        return
    where, url = found
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) \
            and not any(c.isspace() for c in url)
    except ValueError:
        valid = False
    if not valid:
        raise ValueError(f"{where}={url!r} is not an endpoint URL: use http://host:port or "
                         "https://host[:port] (e.g. http://minio.internal:9000), or leave it "
                         "unset for AWS")
    allowed = lookup(config, "allow_http")
    if parts.scheme == "http" and (allowed is None or allowed[1].strip().lower() not in _TRUE):
        raise ValueError(
            f"{where}={url} is plain HTTP, which the S3 client refuses unless AWS_ALLOW_HTTP "
            "is true: set AWS_ALLOW_HTTP=true (a storage option, -o, or the environment) for "
            "a store on a network you trust, or use an https:// endpoint")


def direct_reads_allowed(config: dict[str, str]) -> bool:
    """Whether a presigned GET sent outside the client is sent as the client's would be: no
    setting of ``_CLIENT_ONLY`` (an option or ``AWS_*`` variable) is on. (A system proxy is
    checked by ``s3direct`` against the URL signed.)"""
    for name in _CLIENT_ONLY:
        found = lookup(config, name)
        if found is not None and found[1].strip().lower() not in _FALSE | {""}:
            return False
    return True


@dataclass(frozen=True)
class S3Options:
    """How to reach the bucket: ``config`` is handed to obstore (deltalake's keys; what it
    leaves unset comes from the ``AWS_*`` environment, then an AWS profile or
    ``~/.aws/credentials``, then instance, container or web identity credentials), and
    retries are bounded here. Its repr shows no secret."""

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
    direct_reads: bool = True
    """Fragments received straight into the reader's buffers (``store/s3direct.py``) where
    the settings allow it (no proxy, requester-pays or customer key); False leaves every
    read to the client (``lakestream_direct_reads=false``)."""

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.read_buffer_bytes < 1:
            raise ValueError("max_retries must be >= 0 and read_buffer_bytes >= 1")

    def __repr__(self) -> str:
        config = tuple((k, "***" if is_secret(k) else v) for k, v in self.config)
        rest = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                         if f.name != "config")
        return f"S3Options(config={config!r}, {rest})"

    @classmethod
    def from_options(cls, options: dict[str, str] | None) -> S3Options:
        """Splits deltalake-style ``storage_options`` into obstore's and Lakestream's own.

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
        direct = own.get("lakestream_direct_reads", "true").strip().lower()
        if direct not in _TRUE | _FALSE:
            raise ValueError(f"storage option lakestream_direct_reads={direct!r}: use true "
                             "or false")
        return cls(tuple(sorted(given.items())), max_retries=retries, read_buffer_bytes=buffer,
                   request_timeout_s=timeout, direct_reads=direct in _TRUE)
