"""Fixtures shared by the suite: a real S3 endpoint (moto over HTTP) and the backend matrix."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server

BUCKET = "lakestream-test"


class AtomicMotoServer(ThreadedMotoServer):
    """moto's threaded server with writes serialised.

    moto checks ``If-None-Match`` and then stores the object as two steps, so under heavy
    thread switching two creates of one key can both win; real S3 and MinIO are atomic.
    Serialising the mutating requests makes the endpoint atomic too, so race tests test
    Lakestream, not moto. Reads stay concurrent.
    """

    def _server_entry(self) -> None:
        app = DomainDispatcherApplication(create_backend_app)
        lock = threading.Lock()

        def locked(environ: dict[str, Any], start_response: Any) -> Any:
            if environ.get("REQUEST_METHOD") in ("PUT", "POST", "DELETE"):
                with lock:
                    return list(app(environ, start_response))
            return app(environ, start_response)

        self._server = make_server(self._ip_address, self._port, locked, True,
                                   request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    server = AtomicMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    import boto3

    boto3.client("s3", endpoint_url=url, aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(
        Bucket=BUCKET)
    yield url
    server.stop()


@pytest.fixture(scope="session")
def s3_options(s3_endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


class Backend:
    """Where a test's streams live: ``uri(name)`` gives a fresh URI, ``options`` the
    storage_options that open it (None for local)."""

    def __init__(self, name: str, make_uri: Callable[[str], str],
                 options: dict[str, str] | None) -> None:
        self.name = name
        self._make_uri = make_uri
        self.options = options

    def uri(self, name: str = "stream") -> str:
        return self._make_uri(name)


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
    if request.param == "local":
        return Backend("local", lambda name: str(tmp_path / name), None)
    options = request.getfixturevalue("s3_options")
    run = uuid.uuid4().hex[:12]
    return Backend("s3", lambda name: f"s3://{BUCKET}/{run}/{name}", options)


logging.getLogger("werkzeug").setLevel(logging.WARNING)
