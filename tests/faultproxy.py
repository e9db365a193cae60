"""A fault-injecting HTTP proxy on 127.0.0.1 between an S3 client and a real S3 server.

Independent of the client library: it sees HTTP requests and answers them, forwarding to the
server what it does not fault. Per request a policy picks nothing or one fault:

- ``503`` / ``500``: a SlowDown / InternalError reply; the request never reaches the server.
- ``409``: ConditionalRequestConflict (writes only), as S3 answers racing conditional PUTs.
- ``reset``: the connection is reset before the request reaches the server.
- ``lost``: the request is forwarded and applied, then the connection is reset: the client
  cannot know the outcome (a lost reply).
- ``lost-503``: forwarded and applied, then a 503 comes back.
- ``slow``: forwarded after a delay.

The Host header is forwarded as received, so SigV4 signatures made for the proxy's address
stay valid at the server.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

KINDS = ("503", "500", "409", "reset", "lost", "lost-503", "slow")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te"}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    """The path and query, as sent (``/bucket/prefix/_delta_log/...json``)."""


Policy = Callable[[Request], "str | None"]


class RandomFaults:
    """Each request draws a fault with probability ``rate`` from ``kinds`` (``409`` only for
    writes), seeded; ``match`` limits which requests may be faulted."""

    def __init__(self, rate: float, seed: int = 0, kinds: tuple[str, ...] = KINDS,
                 match: Callable[[Request], bool] | None = None) -> None:
        self.rate, self.kinds, self.match = rate, kinds, match
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def __call__(self, request: Request) -> str | None:
        if self.match is not None and not self.match(request):
            return None
        with self._lock:
            if self._rng.random() >= self.rate:
                return None
            kinds = [k for k in self.kinds if k != "409" or request.method == "PUT"]
            return self._rng.choice(kinds) if kinds else None


def _error_body(code: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>injected by the test proxy</Message></Error>").encode()


class FaultProxy:
    """Listens on 127.0.0.1 and forwards to ``upstream`` (``http://host:port``).

    ``policy`` may be replaced at any time; ``enabled`` turns every fault off; ``counts``
    says what was injected, ``requests`` how many requests came through. Stop it with
    ``stop`` (or use it as a context manager).
    """

    def __init__(self, upstream: str, policy: Policy | None = None,
                 slow_s: float = 0.05) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.policy: Policy | None = policy
        self.enabled = True
        self.slow_s = slow_s
        self.counts: Counter[str] = Counter()
        self.requests = 0
        self.lost: list[tuple[str, str, int]] = []
        """``(kind, path, status the server gave)`` of every reply the proxy withheld."""
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _serve(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="fault-proxy")
        self._thread.start()

    @property
    def injected(self) -> int:
        return sum(self.counts.values())

    def options(self, storage_options: dict[str, str]) -> dict[str, str]:
        """``storage_options`` pointed at the proxy instead of the server."""
        return {**storage_options, "AWS_ENDPOINT_URL": self.url}

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- machinery -------------------------------------------------------------------------

    def _draw(self, request: Request) -> str | None:
        policy = self.policy
        kind = policy(request) if (self.enabled and policy is not None) else None
        with self._lock:
            self.requests += 1
            if kind is not None:
                self.counts[kind] += 1
        return kind

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        body = _read_body(h)
        kind = self._draw(Request(h.command, h.path))
        if kind in ("503", "500", "409"):
            code = {"503": "SlowDown", "500": "InternalError",
                    "409": "ConditionalRequestConflict"}[kind]
            _reply(h, int(kind), {"Content-Type": "application/xml"}, _error_body(code))
            return
        if kind == "reset":
            _reset(h)
            return
        if kind == "slow":
            time.sleep(self.slow_s)
        try:
            status, headers, payload = self._forward(h, body)
        except OSError:
            _reset(h)
            return
        if kind in ("lost", "lost-503"):
            with self._lock:
                self.lost.append((kind, h.path, status))
        if kind == "lost":
            _reset(h)
            return
        if kind == "lost-503":
            _reply(h, 503, {"Content-Type": "application/xml"}, _error_body("SlowDown"))
            return
        _reply(h, status, headers, payload, head=h.command == "HEAD")

    def _forward(self, h: BaseHTTPRequestHandler,
                 body: bytes) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.putrequest(h.command, h.path, skip_host=True, skip_accept_encoding=True)
            for name, value in h.headers.items():
                if name.lower() not in _HOP and name.lower() != "content-length":
                    conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            payload = resp.read()
            headers = {k: v for k, v in resp.getheaders() if k.lower() not in _HOP}
            return resp.status, headers, payload
        finally:
            conn.close()


def _read_body(h: BaseHTTPRequestHandler) -> bytes:
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            out += h.rfile.read(size)
            h.rfile.readline()
    length = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(length) if length else b""


def _reply(h: BaseHTTPRequestHandler, status: int, headers: dict[str, str], payload: bytes,
           head: bool = False) -> None:
    h.send_response_only(status)
    for name, value in headers.items():
        if name.lower() != "content-length":
            h.send_header(name, value)
    h.send_header("Content-Length", headers.get("Content-Length", str(len(payload)))
                  if head else str(len(payload)))
    h.end_headers()
    if not head and payload:
        h.wfile.write(payload)
    h.wfile.flush()


def _reset(h: BaseHTTPRequestHandler) -> None:
    """Closes the client's connection with a TCP reset and no reply."""
    h.close_connection = True
    try:
        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        h.connection.close()
    except OSError:
        pass
