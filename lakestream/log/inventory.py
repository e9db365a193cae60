"""What the store holds beside the log: data files no live fragment references."""

from __future__ import annotations

from collections.abc import Iterator

from lakestream.log.keys import DATA_DIR
from lakestream.log.replay import ReplayState
from lakestream.store.base import ObjectMeta, ObjectStore


def unreferenced(store: ObjectStore, state: ReplayState) -> Iterator[ObjectMeta]:
    """Data files that no live fragment of ``state`` references: uploads never committed
    (orphans of a crash, or commits still under way), void appends, reclaimed fragments.

    Lists ``data/`` once and fetches the whole index; the caller decides by the store's
    timestamps what is old enough.
    """
    live = {path for cols in state.index.columns() for path in cols.paths.to_pylist()}
    for meta in store.list(DATA_DIR):
        if meta.key not in live:
            yield meta
