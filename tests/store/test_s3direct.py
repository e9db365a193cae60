"""Fragment GETs received straight into the reader's buffer pool (``store/s3direct.py``):
against the real S3 server, and against a small HTTP server on 127.0.0.1 that answers as a
store may on a bad day (a connection closed between requests, a body cut short, a stall, a
chunked or whole-object answer), where every answer not taken falls back to the client."""

from __future__ import annotations

import mmap
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from lakestream.errors import NotFoundError
from lakestream.store.s3 import S3Options, S3Store
from lakestream.store.s3direct import MAX_FAILURES, WAKE_BYTES, DirectReads
from tests.conftest import BUCKET

BODY = bytes(range(256)) * (3 * WAKE_BYTES // 256 + 7)  # past the wake-up size, not a multiple


def _block(a: Any) -> Any:
    """The memory an array's data lives in, through its bases."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def _store(options: dict[str, str], **kw: Any) -> S3Store:
    return S3Store(f"s3://{BUCKET}/direct-{uuid.uuid4().hex[:8]}",
                   S3Options(config=tuple(options.items()), **kw))


def test_a_fragment_is_received_into_a_pool_block(s3_options: dict[str, str]) -> None:
    store = _store(s3_options)
    store.put("data/f.parquet", BODY)
    assert store.direct is not None
    out = store.get_buffer("data/f.parquet", len(BODY))
    assert store.direct.reads == 1
    assert isinstance(out, np.ndarray) and isinstance(_block(out), mmap.mmap)
    assert bytes(out) == BODY
    # the same memory again once let go: the pool's block, not a fresh one
    block = _block(out)
    del out
    again = store.get_buffer("data/f.parquet", len(BODY))
    assert _block(again) is block and bytes(again) == BODY and store.direct.reads == 2


def test_sizes_other_than_the_log_s_come_back_as_they_are(s3_options: dict[str, str]) -> None:
    store = _store(s3_options)
    store.put("a", BODY)
    store.put("empty", b"")
    assert bytes(store.get_buffer("a", 10)) == BODY[:11]  # cut one byte past the size asked
    assert bytes(store.get_buffer("a", len(BODY) + 99)) == BODY  # short: whole
    assert bytes(store.get_buffer("empty", 0)) == b""


def test_a_missing_key_is_named_by_the_client_and_the_connection_kept(
        s3_options: dict[str, str]) -> None:
    store = _store(s3_options)
    store.put("a", BODY)
    assert store.direct is not None
    with pytest.raises(NotFoundError, match="nope"):
        store.get_buffer("nope", 10)
    assert store.direct.enabled
    conn = store.direct._connections()[next(iter(store.direct._connections()))]
    assert bytes(store.get_buffer("a", len(BODY))) == BODY
    assert store.direct._connections()[next(iter(store.direct._connections()))] is conn


def test_options_that_change_how_a_get_is_sent_leave_reads_to_the_client(
        s3_options: dict[str, str]) -> None:
    assert _store(s3_options, direct_reads=False).direct is None
    assert _store(s3_options | {"aws_request_payer": "true"}).direct is None
    assert _store(s3_options | {"AWS_PROXY_URL": "http://127.0.0.1:9"}).direct is None
    assert S3Options.from_options({"lakestream_direct_reads": "off"}).direct_reads is False
    with pytest.raises(ValueError, match="lakestream_direct_reads"):
        S3Options.from_options({"lakestream_direct_reads": "sometimes"})


def test_a_store_whose_direct_reads_fail_falls_back_then_stops_trying(
        s3_options: dict[str, str]) -> None:
    store = _store(s3_options)
    store.put("a", BODY)
    assert store.direct is not None
    store.direct._sign = lambda key: f"http://127.0.0.1:{_closed_port()}/{key}?x=1"
    for _ in range(MAX_FAILURES):
        assert store.direct.enabled
        assert bytes(store.get_buffer("a", len(BODY))) == BODY  # through the client
    assert not store.direct.enabled and store.direct.reads == 0


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# A small server answering by the path's first segment.

class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        mode = self.path.strip("/").split("/")[0].split("?")[0]
        _Handler.served.append(mode)
        last = int(self.headers.get("Range", f"bytes=0-{len(BODY)}").split("-")[1])
        body = BODY[:last + 1]
        if mode == "whole":  # no ranges here: the whole object, 200
            body = BODY
        status = 200 if mode == "whole" else 206
        if mode == "chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            return
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode == "cut":
            self.wfile.write(body[:len(body) // 2])
            self.close_connection = True
        elif mode == "stall":
            time.sleep(1.5)
        elif mode == "trickle":  # pieces smaller than the wake-up size, slowly
            for i in range(0, len(body), 100_000):
                self.wfile.write(body[i:i + 100_000])
                self.wfile.flush()
                time.sleep(0.002)
        else:
            self.wfile.write(body)
        if mode == "once":  # closes a kept-alive connection without saying so
            self.close_connection = True


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    _Handler.served = []
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _reads(url: str, timeout: float = 5.0) -> DirectReads:
    return DirectReads(lambda key: f"{url}/{key}?X-Amz-Signature=s", connect_timeout_s=timeout,
                       request_timeout_s=timeout)


def test_a_connection_the_server_closed_between_requests_is_opened_again(server: str) -> None:
    reads = _reads(server)
    for _ in range(3):
        out = reads.get_buffer("once/k", len(BODY))
        assert out is not None and bytes(out) == BODY
    assert reads.reads == 3 and reads.enabled and reads._failures == 0


def test_a_body_cut_short_is_not_served(server: str) -> None:
    reads = _reads(server)
    assert reads.get_buffer("cut/k", len(BODY)) is None
    assert reads._failures == 1
    out = reads.get_buffer("plain/k", len(BODY))  # the next one, on a fresh connection
    assert out is not None and bytes(out) == BODY and reads._failures == 0


def test_a_stalled_answer_gives_up_at_the_request_timeout(server: str) -> None:
    reads = _reads(server, timeout=0.3)
    t0 = time.monotonic()
    assert reads.get_buffer("stall/k", len(BODY)) is None
    assert time.monotonic() - t0 < 1.4


def test_a_body_in_small_pieces_is_received_whole_without_waiting_past_its_end(
        server: str) -> None:
    reads = _reads(server, timeout=3.0)
    for size in (len(BODY), WAKE_BYTES // 3, WAKE_BYTES + 5):
        t0 = time.monotonic()
        out = reads.get_buffer("trickle/k", size)
        assert out is not None and bytes(out) == BODY[:size + 1]
        assert time.monotonic() - t0 < 2.5  # a wait past the body would last the timeout


def test_body_bytes_the_reply_s_reader_took_with_the_headers_are_kept(
        server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The headers are read through a buffered reader, which may take much of the body with
    them where the interpreter's buffers are large: those bytes come first, then the socket's.
    Taken 64 KiB of them only, the rest was skipped (wrong bytes, or a wait for bytes that had
    already come)."""
    import io
    import socket

    from lakestream.store import s3direct

    monkeypatch.setattr(io, "DEFAULT_BUFFER_SIZE", 1 << 20)  # the reply's reader: 1 MiB
    real = s3direct._connect

    def connect(url: Any, timeout: float) -> Any:
        conn = real(url, timeout)  # the headers' read waits for 512 KiB: taken with them
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 512 << 10)
        return conn

    monkeypatch.setattr(s3direct, "_connect", connect)
    reads = _reads(server)
    out = reads.get_buffer("plain/k", len(BODY))
    assert out is not None and bytes(out) == BODY
    out = reads.get_buffer("plain/k", len(BODY))  # the connection kept, its reader empty
    assert out is not None and bytes(out) == BODY and reads.reads == 2


def test_answers_not_taken_are_left_to_the_client(server: str) -> None:
    reads = _reads(server)
    assert reads.get_buffer("chunked/k", 100) is None  # no length: the client reads it
    out = reads.get_buffer("whole/k", 100)  # a 200 of the whole object: cut past the size
    assert out is not None and bytes(out) == BODY[:101]
    out = reads.get_buffer("plain/k", 100)  # after the cut, on a connection of its own
    assert out is not None and bytes(out) == BODY[:101]
    assert reads.enabled


def test_a_proxy_in_the_environment_leaves_reads_to_the_client(
        server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    reads = _reads(server)
    assert reads.get_buffer("plain/k", 100) is None
    assert not reads.enabled and _Handler.served == []
