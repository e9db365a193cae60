"""S3 faults injected in front of a real endpoint by a botocore ``before-send`` hook.

Each request draws a fault with probability ``rate``: a 503 SlowDown, a 500, a 409
ConditionalRequestConflict (writes only) or a connection reset, none of which reach the
endpoint; a reply lost after the request was forwarded (503 or a read timeout: the outcome
is unknown to the client); or a slow reply. ``counts`` says what was injected.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectionClosedError, ReadTimeoutError
from botocore.httpsession import URLLib3Session

KINDS = ("503", "500", "409", "reset", "lost-503", "lost-timeout", "slow")


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_kwargs: Any) -> Any:
        yield self._data


def _error(url: str, status: int, code: str) -> AWSResponse:
    body = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
    return AWSResponse(url, status, {}, _Body(body))


class FaultInjector:
    def __init__(self, rate: float, seed: int, kinds: tuple[str, ...] = KINDS) -> None:
        self.rate, self.kinds = rate, kinds
        self.enabled = True
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._session = URLLib3Session()

    @property
    def injected(self) -> int:
        return sum(self.counts.values())

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-send.s3", self._hook)

    def _draw(self, method: str) -> str | None:
        with self._lock:
            if not self.enabled or self._rng.random() >= self.rate:
                return None
            kinds = [k for k in self.kinds if k != "409" or method == "PUT"]
            kind = self._rng.choice(kinds)
            self.counts[kind] += 1
            return kind

    def _hook(self, request: Any, **_kwargs: Any) -> Any:
        kind = self._draw(request.method)
        if kind is None:
            return None
        url = request.url
        if kind == "503":
            return _error(url, 503, "SlowDown")
        if kind == "500":
            return _error(url, 500, "InternalError")
        if kind == "409":
            return _error(url, 409, "ConditionalRequestConflict")
        if kind == "reset":
            raise ConnectionClosedError(endpoint_url=url)
        if kind == "slow":
            time.sleep(0.05)
            return None
        self._session.send(request)  # it reaches the store; the reply does not come back
        if kind == "lost-503":
            return _error(url, 503, "SlowDown")
        raise ReadTimeoutError(endpoint_url=url)
