"""The store contract, run over every backend."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

from lakestream.errors import AlreadyExistsError, NotFoundError, StoreError
from lakestream.store import check_key, open_store


@pytest.fixture
def store(backend):
    return open_store(backend.uri("store"), backend.options)


def test_put_get_head_list_delete(store) -> None:
    store.put("a/b/one", b"hello")
    store.put("a/two", b"world!", mode="create")
    store.put("a/three", memoryview(b"a view, not a copy"), mode="create")
    assert store.get("a/three") == b"a view, not a copy"
    store.delete("a/three")
    assert store.get("a/b/one") == b"hello"
    assert store.get_range("a/two", 1, 4) == b"orl"
    meta = store.head("a/two")
    assert meta.size == 6 and meta.last_modified > 0
    assert [m.key for m in store.list("a/")] == ["a/b/one", "a/two"]
    store.put("a/b/one", b"replaced", mode="overwrite")
    assert store.get("a/b/one") == b"replaced"
    store.delete("a/b/one")
    store.delete("a/b/one")  # deleting an absent key is not an error
    with pytest.raises(NotFoundError):
        store.get("a/b/one")
    with pytest.raises(NotFoundError):
        store.head("missing")


def test_second_create_of_a_key_fails(store) -> None:
    """Canary: the endpoint honours If-None-Match, else every race test is meaningless."""
    store.put("log/0", b"first", mode="create")
    with pytest.raises(AlreadyExistsError):
        store.put("log/0", b"second", mode="create")
    assert store.get("log/0") == b"first"


def test_exactly_one_racing_create_wins(store) -> None:
    wins: list[int] = []
    barrier = threading.Barrier(8)

    def race(i: int) -> None:
        barrier.wait()
        for k in range(20):
            try:
                store.put(f"race/{k}", str(i).encode(), mode="create")
                wins.append(k)
            except AlreadyExistsError:
                pass

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == list(range(20))


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-file", "named-temp"])
def test_local_creates_link_a_whole_file_and_leave_no_temp_file(tmp_path, unnamed) -> None:
    """Both ways a local create works (an unnamed file where Linux has them, a named temp
    file elsewhere): the object appears whole under its key, a second create fails, the
    folder is made on first use, and nothing else is left in it."""
    from lakestream.store.local import LocalStore

    store = LocalStore(str(tmp_path))
    store._unnamed = store._unnamed and unnamed
    body = bytes(range(256)) * 4096  # larger than one write may take
    store.put("data/p/1", memoryview(body), mode="create")
    with pytest.raises(AlreadyExistsError):
        store.put("data/p/1", b"again", mode="create")
    store.put("data/p/2", b"over", mode="overwrite")
    store.put("data/p/2", b"written", mode="overwrite")
    assert store.get("data/p/1") == body and store.get("data/p/2") == b"written"
    assert sorted(p.name for p in (tmp_path / "data" / "p").iterdir()) == ["1", "2"]
    assert not list(store.list_temp(""))


def test_open_input_reads_ranges(store) -> None:
    data = bytes(range(256)) * 1000
    store.put("blob", data)
    with store.open_input("blob", len(data)) as f:
        f.seek(1000)
        assert f.read(10) == data[1000:1010]
        f.seek(-5, 2)
        assert f.read() == data[-5:]


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "..", "a/./b", "a//b", "a/%2E%2e/b",
                                 "a\\b", "a\x00b", "a\nb", "s3://other/x"])
def test_unsafe_keys_are_rejected(key: str) -> None:
    with pytest.raises(ValueError):
        check_key(key)


def test_a_local_store_takes_fsync_and_refuses_other_options(tmp_path) -> None:
    import lakestream
    from tests.helpers import SCHEMA, rows

    assert open_store(str(tmp_path / "a"), {"fsync": "true"}).fsync  # type: ignore[attr-defined]
    assert not open_store(str(tmp_path / "a"), None).fsync  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="AWS_REGION"):
        open_store(str(tmp_path / "a"), {"AWS_REGION": "us-east-1"})
    with pytest.raises(ValueError, match="fsync='maybe'"):
        open_store(str(tmp_path / "a"), {"fsync": "maybe"})
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4,
                          storage_options={"fsync": "true"})
    s.append(rows(0, 4))
    assert lakestream.open(s.uri, storage_options={"fsync": "true"}).num_samples == 4


def _open_in_child(uri: str, options: dict[str, str], out: Any) -> None:
    try:
        open_store(uri, options).get("x")
        out.put("opened")
    except Exception as e:  # noqa: BLE001 - reported to the parent
        out.put(f"{type(e).__name__}: {e}")


def test_a_forked_child_of_an_s3_user_is_told_to_spawn(s3_options: dict[str, str]) -> None:
    # The S3 client's runtime threads do not survive fork(): a child that used it would
    # hang or crash. It gets a clear error instead (DataLoader workers: use spawn).
    import multiprocessing as mp

    from tests.conftest import BUCKET

    uri = f"s3://{BUCKET}/forked"
    open_store(uri, s3_options).put("x", b"1")
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_open_in_child, args=(uri, s3_options, out))
    child.start()
    said = out.get(timeout=60)
    child.join(60)
    assert said.startswith("LakestreamError") and "spawn" in said, said
    spawned = mp.get_context("spawn")
    out2 = spawned.Queue()
    child = spawned.Process(target=_open_in_child, args=(uri, s3_options, out2))
    child.start()
    assert out2.get(timeout=120) == "opened"
    child.join(60)


def _use_in_child(store: Any, out: Any) -> None:
    try:
        store.get("x")
        out.put("read")
    except Exception as e:  # noqa: BLE001 - reported to the parent
        out.put(f"{type(e).__name__}: {e}")


def test_a_store_made_before_fork_is_refused_in_the_child(s3_options: dict[str, str]) -> None:
    # A forked DataLoader worker reuses the dataset's store, built in the parent: the check
    # at construction never ran in the child, and its first request hung for ever.
    import multiprocessing as mp

    from tests.conftest import BUCKET

    store = open_store(f"s3://{BUCKET}/forked-store", s3_options)
    store.put("x", b"1")
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_use_in_child, args=(store, out))
    child.start()
    try:
        said = out.get(timeout=60)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    assert said.startswith("LakestreamError") and "spawn" in said, said
    assert store.get("x") == b"1"  # the parent's client still works


def test_an_unknown_s3_option_is_named(s3_options: dict[str, str]) -> None:
    from tests.conftest import BUCKET

    with pytest.raises(ValueError, match="'AWS_ENDPONT_URL' is not an S3 option"):
        open_store(f"s3://{BUCKET}/typo", {**s3_options, "AWS_ENDPONT_URL": "http://x"})
    with pytest.raises(ValueError, match="storage option"):
        open_store(f"s3://{BUCKET}/typo", {**s3_options, "LAKESTREAM_MAX_RETRIES": "many"})
    assert open_store(f"s3://{BUCKET}/ok", {**s3_options, "LAKESTREAM_MAX_RETRIES": "2",
                                            "lakestream_request_timeout_s": "60"}) is not None


def test_an_endpoint_that_gives_no_answer_is_named_with_what_to_check(
        s3_options: dict[str, str]) -> None:
    """A wrong port, https:// against a plain-HTTP server, or a host that does not resolve:
    the client's own text was "... after 8 retries ... HTTP error: error sending request"."""
    import socket

    from tests.conftest import BUCKET

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    endpoint = s3_options["AWS_ENDPOINT_URL"]
    for url in (f"http://127.0.0.1:{closed}", endpoint.replace("http://", "https://"),
                "http://no-such-host.invalid:9000"):
        store = open_store(f"s3://{BUCKET}/silent", {**s3_options, "AWS_ENDPOINT_URL": url,
                                                     "LAKESTREAM_MAX_RETRIES": "1"})
        with pytest.raises(StoreError, match=f"no answer from {re.escape(url)} .*check the "
                                             r"endpoint \(AWS_ENDPOINT_URL\)"):
            store.get("x")
