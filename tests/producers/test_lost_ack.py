"""A commit PUT that lands but whose reply is lost: the producer recognises its own commit."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

import lakestream
from lakestream.log.entries import Append
from lakestream.log.tail import read_entry
from lakestream.producers import Producer
from tests.conftest import BUCKET
from tests.faultproxy import FaultProxy, Request
from tests.helpers import SCHEMA, ids, rows


def _every_other_log_put(kind: str) -> object:
    """Withholds the reply of every second PUT of a log entry, after the server applied it."""
    seen = Counter[str]()
    lock = threading.Lock()

    def policy(request: Request) -> str | None:
        if request.method != "PUT" or "/_delta_log/" not in request.path:
            return None
        with lock:
            seen["puts"] += 1
            return kind if seen["puts"] % 2 == 0 else None

    return policy


@pytest.mark.parametrize("kind", ["lost-503", "lost"])
def test_lost_commit_replies_are_recognised(s3_endpoint: str, s3_options: dict[str, str],
                                            kind: str) -> None:
    uri = f"s3://{BUCKET}/lost-ack-{kind}"
    s = lakestream.create(uri, SCHEMA, global_batch_size=4, storage_options=s3_options)
    with FaultProxy(s3_endpoint) as proxy:
        p = Producer(uri, "w", storage_options=proxy.options(s3_options))
        proxy.policy = _every_other_log_put(kind)  # type: ignore[assignment]
        for i in range(12):
            p.write(rows(4 * i, 4), state={"next": i + 1})
            p.flush()  # one commit per write, so half of the commits lose their reply
        p.close()
    assert len(proxy.lost) >= 5 and all(status == 200 for _k, _p, status in proxy.lost)
    s.refresh()
    paths = Counter[str]()
    for v in range(1, s.version + 1):
        entry = read_entry(s.store, v)
        if isinstance(entry, Append):
            paths.update(f.path for f in entry.fragments)
    assert len(paths) == 12 and set(paths.values()) == {1}  # no fragment committed twice
    assert sorted(i for k in range(s.num_steps) for i in ids(s.read_step(k))) == list(range(48))
    assert s.producers["w"][2] == {"next": 12}


def test_a_lost_reply_to_creating_the_stream_is_recognised(s3_endpoint: str,
                                                           s3_options: dict[str, str]) -> None:
    # The reply to creating version 0 is lost after the server applied it: reading it back
    # finds our own entry, so this is our stream, not a failure or "a stream already exists".
    # Regression (of the test): it appended through the proxy after the proxy had stopped,
    # which worked only while the client's pool still held a keep-alive connection; without
    # one the put was refused and retried until the suite's timeout (CI hung once).
    uri = f"s3://{BUCKET}/lost-create"
    with FaultProxy(s3_endpoint) as proxy:
        proxy.policy = lambda r: ("lost" if r.method == "PUT" and r.path.endswith(
            "_delta_log/00000000000000000000.json") and not proxy.lost else None)
        s = lakestream.create(uri, SCHEMA, global_batch_size=4,
                              storage_options=proxy.options(s3_options))
        assert [k for k, _p, _s in proxy.lost] == ["lost"]
        s.append(rows(0, 4))  # through the proxy, while it still runs
    assert lakestream.open(uri, storage_options=s3_options).num_samples == 4


def test_a_409_on_a_fragment_upload_is_retried_not_taken_for_our_object(
        s3_endpoint: str, s3_options: dict[str, str]) -> None:
    # Regression: obstore reports S3's 409 ConditionalRequestConflict as AlreadyExists,
    # which the upload took for "a retry of ours already landed": the fragment's PUT never
    # reached the server, yet it was committed, and every reader then failed on a missing
    # file (found by the fault test on the wire).
    uri = f"s3://{BUCKET}/conflict-409"
    lakestream.create(uri, SCHEMA, global_batch_size=4, storage_options=s3_options)
    seen = Counter[str]()

    def first_put_of_each_fragment(r: Request) -> str | None:
        if r.method == "PUT" and "/data/" in r.path:
            seen[r.path] += 1
            return "409" if seen[r.path] == 1 else None
        return None

    with FaultProxy(s3_endpoint, first_put_of_each_fragment) as proxy:
        with Producer(uri, "w", storage_options=proxy.options(s3_options)) as p:
            for i in range(4):
                p.write(rows(4 * i, 4))
    assert proxy.counts["409"] == 4
    s = lakestream.open(uri, storage_options=s3_options)
    assert [i for k in range(s.num_steps) for i in ids(s.read_step(k))] == list(range(16))
