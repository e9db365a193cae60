"""A commit PUT that lands but whose reply is lost: the producer recognises its own commit."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ReadTimeoutError
from botocore.httpsession import URLLib3Session

import lakestream
from lakestream.log import Append
from lakestream.producers import Producer
from lakestream.tail import read_entry
from tests.conftest import BUCKET
from tests.helpers import SCHEMA, ids, rows


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_kwargs: Any) -> Any:
        yield self._data


def _lose_replies(producer: Producer, how: str, every: int = 2) -> list[str]:
    """Forwards every ``every``-th log-entry PUT to the endpoint, then fakes a failure."""
    session = URLLib3Session()
    lost: list[str] = []
    seen = Counter[str]()

    def hook(request: Any, **_kwargs: Any) -> Any:
        if request.method != "PUT" or "/_delta_log/" not in request.url:
            return None
        seen["puts"] += 1
        if seen["puts"] % every:
            return None
        real = session.send(request)
        lost.append(f"{request.url} -> {real.status_code}")
        if how == "503":
            body = b"<Error><Code>SlowDown</Code><Message>lost reply</Message></Error>"
            return AWSResponse(request.url, 503, {}, _Body(body))
        raise ReadTimeoutError(endpoint_url=request.url)

    client = producer.stream.store.client  # type: ignore[attr-defined]
    client.meta.events.register("before-send.s3.PutObject", hook)
    return lost


@pytest.mark.parametrize("how", ["503", "timeout"])
def test_lost_commit_replies_are_recognised(s3_options: dict[str, str], how: str) -> None:
    uri = f"s3://{BUCKET}/lost-ack-{how}"
    s = lakestream.create(uri, SCHEMA, global_batch_size=4, storage_options=s3_options)
    p = Producer(uri, "w", storage_options=s3_options)
    lost = _lose_replies(p, how)
    for i in range(12):
        p.write(rows(4 * i, 4), state={"next": i + 1})
        p.flush()  # one commit per write, so half of the commits lose their reply
    p.close()
    assert len(lost) >= 5 and all(x.endswith("200") for x in lost)  # they did land
    s.refresh()
    paths = Counter[str]()
    for v in range(1, s.version + 1):
        entry = read_entry(s.store, v)
        if isinstance(entry, Append):
            paths.update(f.path for f in entry.fragments)
    assert len(paths) == 12 and set(paths.values()) == {1}  # no fragment committed twice
    assert sorted(i for k in range(s.num_steps) for i in ids(s.read_step(k))) == list(range(48))
    assert s.producers["w"][2] == {"next": 12}
