"""A real S3 endpoint on 127.0.0.1 for tests and benchmarks: moto over HTTP, made atomic."""

from __future__ import annotations

import io
import threading
from typing import Any

import boto3
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server

BUCKET = "lakestream-test"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


class AtomicMotoServer(ThreadedMotoServer):
    """moto's threaded server with writes to one key serialised.

    moto checks ``If-None-Match`` and then stores the object as two steps, so under heavy
    thread switching two creates of one key can both win; real S3 and MinIO are atomic.
    A lock per key makes the endpoint atomic too, so race tests test Lakestream, not moto;
    writes to different keys and all reads stay concurrent, as on S3.
    """

    def _server_entry(self) -> None:
        app = DomainDispatcherApplication(create_backend_app)
        guard = threading.Lock()
        locks: dict[str, threading.Lock] = {}

        def locked(environ: dict[str, Any], start_response: Any) -> Any:
            if environ.get("REQUEST_METHOD") not in ("PUT", "POST", "DELETE"):
                return app(environ, start_response)
            key = environ.get("PATH_INFO", "")
            # Read the body before taking the lock: a client stopped mid-upload (SIGSTOP in
            # the zombie test) must not block other writers of the key, as it would not on S3.
            length = int(environ.get("CONTENT_LENGTH") or 0)
            if length:
                environ["wsgi.input"] = io.BytesIO(environ["wsgi.input"].read(length))
            with guard:
                lock = locks.setdefault(key, threading.Lock())
            with lock:
                return list(app(environ, start_response))

        self._server = make_server(self._ip_address, self._port, locked, True,
                                   request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()


def start_s3(bucket: str = BUCKET) -> tuple[AtomicMotoServer, str]:
    """Starts the endpoint on a free port with ``bucket`` created; returns it and its URL."""
    server = AtomicMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=url, aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(
        Bucket=bucket)
    return server, url


def s3_options(url: str) -> dict[str, str]:
    """The storage_options that reach the endpoint at ``url``."""
    return {"AWS_ENDPOINT_URL": url, **CREDENTIALS}
