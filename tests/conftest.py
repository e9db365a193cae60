"""Fixtures shared by the suite: a real S3 endpoint (moto over HTTP), the backend matrix,
and the seeds and tally of the reliability tests.

``make test`` runs a fast, seeded subset; ``make soak`` sets ``LAKESTREAM_SOAK=1`` for more
seeds and trials, and ``LAKESTREAM_RELIABILITY_REPORT`` to a JSON path where the tally of
faults injected, crashes, corruptions tried and detected, and samples lost and duplicated
is written at the end of the session.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.s3server import BUCKET, start_s3
from tests.s3server import s3_options as s3_config


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    server, url = start_s3()
    yield url
    server.stop()


@pytest.fixture(scope="session")
def s3_options(s3_endpoint: str) -> dict[str, str]:
    return s3_config(s3_endpoint)


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
