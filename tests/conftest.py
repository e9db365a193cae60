"""Fixtures shared by the suite: a real S3 server (SeaweedFS on 127.0.0.1), the backend
matrix, and the seeds and tally of the reliability tests.

``make test`` runs a fast, seeded subset; ``make soak`` sets ``LAKESTREAM_SOAK=1`` for more
seeds and trials, and ``LAKESTREAM_RELIABILITY_REPORT`` to a JSON path where the tally of
faults injected, crashes, corruptions tried and detected, and samples lost and duplicated
is written at the end of the session.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.s3server import BUCKET, ROLES, SeaweedS3, start_s3


@pytest.fixture(scope="session", autouse=True)
def _host_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The host folder of shared log heads (``lakestream.log.hosthead``) in the session's
    temp folder, for this process and the processes it starts, not the machine's."""
    before = os.environ.get("LAKESTREAM_HOST_DIR")
    os.environ["LAKESTREAM_HOST_DIR"] = str(tmp_path_factory.mktemp("host"))
    yield
    if before is None:
        del os.environ["LAKESTREAM_HOST_DIR"]
    else:
        os.environ["LAKESTREAM_HOST_DIR"] = before


@pytest.fixture(scope="session")
def s3_server() -> Iterator[SeaweedS3]:
    server = start_s3(identities=ROLES)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_endpoint(s3_server: SeaweedS3) -> str:
    return s3_server.url


@pytest.fixture(scope="session")
def s3_options(s3_server: SeaweedS3) -> dict[str, str]:
    return s3_server.options()


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


SOAK = os.environ.get("LAKESTREAM_SOAK") == "1"


def seeds(fast: int, soak: int) -> list[int]:
    return list(range(soak if SOAK else fast))


_TALLY: Counter[str] = Counter()


@pytest.fixture(scope="session")
def tally() -> Iterator[Counter[str]]:
    yield _TALLY
    path = os.environ.get("LAKESTREAM_RELIABILITY_REPORT")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"soak": SOAK, **dict(sorted(_TALLY.items()))},
                                         indent=1))
