"""Fragment GETs received straight into the reader's buffer pool.

The S3 client returns each response in a buffer of its own: its runtime threads gather the
body's chunks into one allocation (a second copy of every byte, beside the kernel's), then
hand it to the reading thread, and the caller takes fresh pages each time. Measured on 2
cores with a SeaweedFS server on 127.0.0.1, 9.6 MB ranged GETs at 4 threads: 0.84-0.98
CPU-s per GB through the client (its fresh pages included), 0.22-0.26 received here,
0.15-0.26 for the same bytes read from tmpfs.

Here a GET of a presigned URL (signed by the client, so credentials, region and addressing
stay its own) is sent on a keep-alive connection of the reading thread, and its body is
received with ``recv_into`` into a block of the process's pool (``store/pool.py``): one copy,
by the kernel, with the GIL released. Only the answer that succeeds is handled here; any other
(a status that is not 200/206, a dropped connection, a timeout) returns None, and the caller
asks the client, which retries and names the failure as it always did. Three transport
failures in a row turn direct reads off for the store: a network this path cannot cross (a
proxy, a certificate only the client trusts) costs three fallbacks, not one per read.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from urllib.parse import SplitResult, urlsplit
from urllib.request import getproxies, proxy_bypass

import numpy as np

from lakestream.store.pool import buffer_pool

MAX_FAILURES = 3
"""Transport failures in a row after which a store stops reading directly."""
WAKE_BYTES = 1 << 20
"""Bytes a receiving thread waits for before it is woken (``SO_RCVLOWAT``, plain TCP only:
TLS records are read in pieces of their own). Woken per segment instead, the thread spent a
third more CPU per GB (0.30 against 0.22 CPU-s per GB, 9.6 MB GETs at 4 threads, SeaweedFS on
127.0.0.1): a wake-up, a GIL hand-off and a system call per 64 KiB. Per 4 MiB, one pass of
raw images from S3 at the defaults cost 0.51 against 0.545 CPU-s per GB and another 0.54
against 0.53, and one read thread fell from 0.76 to 0.64 GB/s: its copy no longer overlaps
the server's sending (2 cores, alternating processes)."""
_LOWAT: int = getattr(socket, "SO_RCVLOWAT", 0) if sys.platform == "linux" else 0
_BUFFERED_PIECE = 64 << 10
"""What is taken at a time from the reply's buffered reader (the body's first bytes, read with
the headers; 8 KiB at most in Python 3.11, more where the interpreter's buffers are larger)
before the rest is received from the socket itself."""
_ERROR_BODY_BYTES = 64 << 10
"""The most of an error answer's body read to keep its connection; a longer one closes it."""

Signer = Callable[[str], "str | None"]
"""A key's presigned GET URL, or None where the client cannot sign (no credentials)."""


class DirectReads:
    """Ranged GETs of presigned URLs received into pool blocks, one keep-alive connection
    per reading thread and endpoint. Thread-safe; ``enabled`` goes False for good after
    ``MAX_FAILURES`` transport failures in a row."""

    def __init__(self, sign: Signer, *, connect_timeout_s: float,
                 request_timeout_s: float) -> None:
        self._sign = sign
        self._connect_timeout = connect_timeout_s
        self._request_timeout = request_timeout_s
        self._local = threading.local()
        self._failures = 0
        self._origins: set[str] = set()
        self.enabled = True
        self.reads = 0
        """GETs answered here (for tests and benchmarks)."""

    def get_buffer(self, key: str, size: int) -> np.ndarray | None:
        """The object's first ``size + 1`` bytes at most (a pool array, the whole object if
        it is shorter), or None: not answered here, the caller asks its client."""
        if not self.enabled:
            return None
        signed = self._sign(key)
        if signed is None:
            return None
        url = urlsplit(signed)
        if _origin(url) not in self._origins:
            if _proxied(url):  # the client goes through the proxy; so must every read
                self.enabled = False
                return None
            self._origins.add(_origin(url))
        for reused in self._attempts(url):
            try:
                out = self._get(url, size)
            except (OSError, http.client.HTTPException, ValueError):
                self._drop(url)
                if reused:
                    continue  # a kept-alive connection the server had closed: once more
                self._failed()
                return None
            if out is not None:
                self._failures = 0
                self.reads += 1
            return out
        return None

    def _attempts(self, url: SplitResult) -> tuple[bool, ...]:
        """Whether each attempt runs on a kept-alive connection: a second attempt only
        follows a first one on such a connection."""
        return (True, False) if self._connections().get(_origin(url)) is not None else (False,)

    def _get(self, url: SplitResult, size: int) -> np.ndarray | None:
        conn = self._connection(url)
        conn.request("GET", f"{url.path}?{url.query}",
                     headers={"Host": url.netloc, "Range": f"bytes=0-{size}"})
        reply = conn.getresponse()
        if reply.status not in (200, 206) or reply.length is None:
            self._discard(reply, url)
            return None
        length = reply.length
        n = min(length, size + 1)
        out = buffer_pool().array(size + 1)
        view = memoryview(out)  # type: ignore[arg-type]
        at = 0
        while at < n:  # what the reply's reader holds, taken before the socket is read
            chunk = reply.fp.read1(min(n - at, _BUFFERED_PIECE))
            view[at:at + len(chunk)] = chunk
            at += len(chunk)
            if len(chunk) < _BUFFERED_PIECE:
                break  # a short piece: the reader holds nothing more (or the body ended)
        sock = conn.sock  # None where the server closes after this reply: read through it
        lowat = sock is not None and _LOWAT != 0 and not isinstance(sock, ssl.SSLSocket)
        receive = reply.readinto if sock is None else sock.recv_into
        waits_for = 1
        try:
            while at < n:
                if lowat and sock is not None and min(n - at, WAKE_BYTES) != waits_for:
                    waits_for = min(n - at, WAKE_BYTES)  # never more than is left to come
                    sock.setsockopt(socket.SOL_SOCKET, _LOWAT, waits_for)
                got = receive(view[at:n])
                if got == 0:
                    raise http.client.IncompleteRead(bytes(0), n - at)
                at += got
        finally:
            if waits_for != 1 and sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, _LOWAT, 1)
        reply.length = length - n  # read past the reply's own accounting: settle it
        if reply.length:  # a whole object longer than asked for (a 200): its rest stays unread
            self._drop(url)
        else:
            reply.close()  # the connection is free for the next request
        return out if n == len(out) else out[:n]

    def _connections(self) -> dict[str, http.client.HTTPConnection]:
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        return conns

    def _connection(self, url: SplitResult) -> http.client.HTTPConnection:
        conns = self._connections()
        conn = conns.get(_origin(url))
        if conn is None:
            conn = _connect(url, self._connect_timeout)
            if conn.sock is not None:
                conn.sock.settimeout(self._request_timeout)
            conn.timeout = self._request_timeout  # for a connection it opens again itself
            conns[_origin(url)] = conn
        return conn

    def _drop(self, url: SplitResult) -> None:
        conn = self._connections().pop(_origin(url), None)
        if conn is not None:
            conn.close()

    def _discard(self, reply: http.client.HTTPResponse, url: SplitResult) -> None:
        """Reads a short answer not used (an error's) to keep its connection; closes the
        connection of a long one."""
        if reply.length is not None and reply.length <= _ERROR_BODY_BYTES:
            reply.read()
        else:
            self._drop(url)

    def _failed(self) -> None:
        self._failures += 1
        if self._failures >= MAX_FAILURES:
            self.enabled = False


def _origin(url: SplitResult) -> str:
    return f"{url.scheme}://{url.netloc}"


def _proxied(url: SplitResult) -> bool:
    """Whether the environment names a proxy for ``url`` (``HTTPS_PROXY``, ``ALL_PROXY``,
    less ``NO_PROXY``)."""
    proxies = getproxies()
    if url.scheme not in proxies and "all" not in proxies:
        return False
    return not (url.hostname and proxy_bypass(url.hostname))


_TLS: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    """The system's trust store, loaded once per process."""
    global _TLS
    if _TLS is None:
        _TLS = ssl.create_default_context()
    return _TLS


def _connect(url: SplitResult, timeout: float) -> http.client.HTTPConnection:
    host, port = url.hostname or "", url.port
    conn: http.client.HTTPConnection
    if url.scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=_tls())
    elif url.scheme == "http":
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    else:
        raise ValueError(f"a signed URL of scheme {url.scheme!r}")
    conn.connect()
    return conn

