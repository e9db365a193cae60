"""The put-if-absent rule, applied in one place (``put_log_entry``): after a put that did not
answer success, the entry read back at the version says who won, for the stream's creation
as for every commit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import lakestream
from lakestream.errors import AlreadyExistsError, StoreError
from lakestream.log.codec import encode_entry
from lakestream.log.entries import Create, StreamMeta
from lakestream.log.keys import log_key
from lakestream.log.opening import create_log
from lakestream.log.put import put_log_entry
from lakestream.store.local import LocalStore
from tests.helpers import HookedStore

META = StreamMeta(pa.schema([("x", pa.int64())]), 4, 1)


def _failing(key: str, phase: str) -> Any:
    """A hook failing the first put of ``key``, ``phase`` ("before": it never lands;
    "after": it lands and its reply is lost)."""
    fired = []

    def hook(op: str, k: str, p: str) -> None:
        if op == "put" and k == key and p == phase and not fired:
            fired.append(k)
            raise StoreError(f"injected failure {phase} putting {k}")
    return hook


def test_a_creation_whose_reply_was_lost_is_ours(tmp_path: Path) -> None:
    store = HookedStore(LocalStore(str(tmp_path)), _failing(log_key(0), "after"))
    state = create_log(store, str(tmp_path), META)  # type: ignore[arg-type]
    assert state.version == 0
    assert lakestream.open(str(tmp_path)).global_batch_size == 4


def test_a_creation_that_never_landed_raises_the_store_error(tmp_path: Path) -> None:
    store = HookedStore(LocalStore(str(tmp_path)), _failing(log_key(0), "before"))
    with pytest.raises(StoreError, match="injected"):
        create_log(store, str(tmp_path), META)  # type: ignore[arg-type]
    assert not (tmp_path / log_key(0)).exists()
    create_log(LocalStore(str(tmp_path)), str(tmp_path), META)  # nothing left in the way


def test_another_streams_version_0_is_already_there(tmp_path: Path) -> None:
    lakestream.create(str(tmp_path), META.schema, global_batch_size=8)
    store = HookedStore(LocalStore(str(tmp_path)), _failing(log_key(0), "before"))
    with pytest.raises(AlreadyExistsError, match="already exists"):  # not the put's failure
        create_log(store, str(tmp_path), META)  # type: ignore[arg-type]
    assert lakestream.open(str(tmp_path)).global_batch_size == 8


def test_put_log_entry_says_landed_taken_or_unknown(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    mine, theirs = Create(META), Create(META)
    put = put_log_entry(store, 0, encode_entry(mine), mine.commit_id)
    assert (put.landed, put.holder, put.failure) == (True, None, None)
    again = put_log_entry(store, 0, encode_entry(mine), mine.commit_id)  # a retried put
    assert again.landed and again.holder is not None and again.failure is None
    lost = put_log_entry(store, 0, encode_entry(theirs), theirs.commit_id)
    assert not lost.landed and lost.holder is not None
    assert lost.holder.commit_id == mine.commit_id
    down = HookedStore(store, _failing(log_key(1), "before"))
    unknown = put_log_entry(down, 1, encode_entry(theirs), theirs.commit_id)  # type: ignore[arg-type]
    assert not unknown.landed and unknown.holder is None
    assert isinstance(unknown.failure, StoreError)
