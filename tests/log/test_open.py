"""Opening a stream costs a number of store requests that does not grow with the log's
length (docs/design.md §4), and fetches no index segment."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import pytest

import lakestream
from lakestream.log.entries import Fence
from lakestream.log.keys import log_key
from lakestream.log.manifest import HINT_KEY, snapshot_key
from lakestream.log.opening import load_state
from lakestream.log.tail import TAIL_WIDTH
from lakestream.store import ObjectMeta, ObjectStore, open_store
from tests.helpers import SCHEMA, ids, rows


class CountingStore:
    """Wraps a store and counts requests by kind."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.calls: collections.Counter[str] = collections.Counter()

    @property
    def uri(self) -> str:
        return self.inner.uri

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            result = method(*args, **kwargs)
            return list(result) if name == "list" else result

        return counted

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        self.calls["list"] += 1
        return iter(list(self.inner.list(prefix)))


def _grow(uri: str, versions: int, interval: int = 100) -> None:
    s = lakestream.create(uri, SCHEMA, global_batch_size=2, snapshot_interval=interval)
    s.append(rows(0, 2))
    for epoch in range(1, versions - 1):
        s.commit(lambda _state, cid, e=epoch: Fence("p", e, cid))
    assert s.version == versions - 1


def _open_cost(uri: str) -> tuple[int, collections.Counter[str]]:
    store = CountingStore(open_store(uri))
    state = load_state(store, uri)
    return state.version, store.calls


@pytest.fixture(scope="module")
def long_and_short(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("open")
    short, long = str(root / "short"), str(root / "long")
    _grow(short, 201)
    _grow(long, 10_001)
    return short, long


def test_open_costs_the_same_at_10000_versions_as_at_200(long_and_short) -> None:
    short, long = long_and_short
    v_short, calls_short = _open_cost(short)
    v_long, calls_long = _open_cost(long)
    assert (v_short, v_long) == (200, 10_000)
    # hint + manifest + tail GETs and one HEAD probe; no index segment
    assert calls_short == {"get": 3, "head": 1}
    assert calls_long == {"get": 3, "head": 1}
    reopened = lakestream.open(long)
    assert reopened.producers["p"][0] == 9_999 and ids(reopened.read_step(0)) == [0, 1]


def test_a_stale_or_missing_hint_costs_a_bounded_probe(long_and_short) -> None:
    _, long = long_and_short
    store = open_store(long)
    fresh = store.get(HINT_KEY)
    try:
        store.put(HINT_KEY, b'{"version": 0}')
        version, calls = _open_cost(long)
        assert version == 10_000 and calls["list"] == 0
        assert calls["head"] <= 2 * 7 + 2  # exponential then binary search over 100 snapshots
        store.delete(HINT_KEY)
        version, calls = _open_cost(long)
        assert version == 10_000 and calls["list"] == 0 and calls["head"] <= 2 * 7 + 3
        store.put(HINT_KEY, b"{torn")
        assert _open_cost(long)[0] == 10_000
    finally:
        store.put(HINT_KEY, fresh)


def test_a_missing_snapshot_costs_only_a_longer_tail(tmp_path) -> None:
    uri = str(tmp_path / "s")
    _grow(uri, 351)
    store = open_store(uri)
    store.delete(snapshot_key(300))  # as if its committer was killed while writing it
    store.put(HINT_KEY, b'{"version": 200}')
    version, calls = _open_cost(uri)
    # hint, manifest 200, 150 entries, and the absent ones the last parallel round of the
    # tail read asks for
    assert version == 350 and calls["get"] <= 2 + 150 + TAIL_WIDTH


def test_the_log_alone_replays_without_any_snapshot(tmp_path) -> None:
    uri = str(tmp_path / "s")
    _grow(uri, 150)
    store = open_store(uri)
    for m in list(store.list("_lakestream/")):
        store.delete(m.key)
    assert _open_cost(uri)[0] == 149
    store.delete(log_key(0))
    with pytest.raises(lakestream.NotFoundError):
        lakestream.open(uri)
