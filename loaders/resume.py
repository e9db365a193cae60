"""A StreamDataset's saved state: its format, the streams it names, and the cases in which a
saved state resumes a dataset (docs/design.md §6): each case says where the steps are planned
from after it, and whether a DataLoader worker's own state may resume it."""

from __future__ import annotations

import enum
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from lakestream.errors import LakestreamError
from lakestream.reading import Accept, Source, resume_position

STATE_VERSION = 4
"""2 added the worker fields, 3 the mix (sources, cursors, shuffle, epochs), 4 the streams'
identities; older states still load."""
STATE_KEYS = frozenset({"version", "next_step", "group", "global_batch_size"})
"""The keys of every StreamDataset state (a DCP checkpoint's keys must stay those saved)."""
log = logging.getLogger("lakestream")

Base = tuple[int, list[int]]
"""Where a dataset's steps are planned from: a step, and each source's position there."""


class StreamMismatchError(LakestreamError):
    """A dataset state (a checkpoint's) was saved reading another stream than this dataset
    reads: one created anew, or another one altogether."""


class Resume(enum.Enum):
    """How a saved state resumes a dataset: by what it was saved reading, and what the
    dataset reads now."""

    LOG_ORDER = "one stream in log order, as saved"
    POLICY_FROM_LOG_ORDER = "a read policy taking over a state saved in log order"
    MIX_FROM_LOG_ORDER = "a mix, shuffle or epochs from a state saved in log order"
    SAME = "the mix or read policy the state was saved with"
    CHANGED = "a mix or read policy other than the state was saved with"

    @classmethod
    def of(cls, saved: dict[str, Any] | None, described: dict[str, Any], *, policy: bool,
           plain: bool) -> Resume:
        """The case of a state whose mix is ``saved`` (None: saved in log order) for a
        dataset described by ``described``, with a read policy or not, ``plain`` (one
        stream, whole steps, log order) or not."""
        if saved is None:
            if policy:
                return cls.POLICY_FROM_LOG_ORDER
            return cls.LOG_ORDER if plain else cls.MIX_FROM_LOG_ORDER
        if {k: saved.get(k) for k in described} == described:
            return cls.SAME
        return cls.CHANGED

    @property
    def plans_again(self) -> bool:
        """Whether the steps are planned anew from the saved step: a DataLoader worker's
        state cannot resume that, since each worker would plan from its own step."""
        return self in (Resume.POLICY_FROM_LOG_ORDER, Resume.CHANGED)


def refuse_worker_state(saved: dict[str, Any] | None) -> LakestreamError:
    """The error for a DataLoader worker's state that would plan the steps again."""
    was = "in log order, without a read policy" if saved is None else \
        f"with another mix or read policy ({saved['sources']}, policy {saved.get('policy')})"
    return LakestreamError(
        f"this loader state was saved {was}; its DataLoader workers would each take over at "
        "their own step: resume as it was saved, or load the dataset's own state "
        "(StreamLoader, save_checkpoint)")


def check_streams(state: dict[str, Any], mine: Sequence[tuple[str, str]],
                  global_batch_size: int) -> None:
    """Checks that each stream the state was saved reading is the one read now at that URI
    (``mine``: each source's URI and stream id; one stream to one stream whatever its URI,
    so a stream moved still resumes). States saved before identities were kept pass.

    Raises:
        StreamMismatchError: naming both streams.
    """
    if "streams" not in state:  # saved before identities were kept
        return
    saved = json.loads(state["streams"])
    if len(saved) == 1 and len(mine) == 1:
        pairs = [(saved[0], mine[0])]
    else:
        by_uri = dict(mine)
        pairs = [(s, (s["uri"], by_uri[s["uri"]])) for s in saved if s["uri"] in by_uri]
    b = int(state["global_batch_size"])
    sizes = f" (saved for global batch size {b}; this dataset's is " \
        f"{global_batch_size})" if b != global_batch_size else ""
    for theirs, (uri, table_id) in pairs:
        if theirs["id"] != table_id:
            raise StreamMismatchError(
                f"this state was saved reading the stream {theirs['uri']} (id "
                f"{theirs['id']}), and {uri} is another stream (id {table_id}){sizes}: "
                "load it into a dataset over the stream it was saved from, or start this "
                "one without it")


def check_batch_size(state: dict[str, Any], global_batch_size: int, uri: str) -> None:
    """A state saved in log order names the batch size of the one stream it read.

    Raises:
        LakestreamError: it is not this dataset's.
    """
    b = int(state["global_batch_size"])
    if b != global_batch_size:
        raise LakestreamError(
            f"state was saved reading one stream of global batch size {b}, and {uri} has "
            f"{global_batch_size} samples per step: load it into a dataset over the stream "
            "it was saved from")


def changed_mix_starts(saved: dict[str, Any], sources: Sequence[Source],
                       sealed: Sequence[int | None], *, shuffle_window: int | None, seed: int,
                       epochs: int | None) -> list[int]:
    """Where each source resumes when the mix changed since ``saved``: a source found there
    at its saved position (a cycling shuffled source whose permutations changed at its next
    epoch), a new one at its start.

    Raises:
        LakestreamError: a mix with epochs changed (its epochs would no longer line up).
    """
    if epochs is not None or saved.get("epochs") is not None:
        raise LakestreamError(
            f"the state was saved by another mix ({saved['sources']}, epochs "
            f"{saved.get('epochs')}); a mix with epochs cannot change: resume it as it "
            "was, or start a new run")
    cursors = {s["uri"]: int(c) for s, c in zip(saved["sources"], saved["cursors"],
                                                 strict=True)}
    before = {s["uri"]: s for s in saved["sources"]}
    starts = []
    for source, size in zip(sources, sealed, strict=True):
        cursor = cursors.get(source.uri, 0)
        if source.cycle and shuffle_window is not None and source.uri in before:
            # Its windows are permuted: the same positions name the same samples only if
            # its permutations are as they were.
            was = before[source.uri]
            same = bool(saved.get("keyed")) and was["take"] == source.take \
                and was["cycle"] and saved["shuffle_window"] == shuffle_window \
                and saved["seed"] == seed
            cursor = resume_position(cursor, size, same_order=same)
        starts.append(cursor)
    log.warning("the mix changed since the state was saved (%s); each source resumes at "
                "its saved position (a cycling shuffled source whose permutations changed "
                "at its next epoch), new ones at their start: %s",
                [s["uri"] for s in saved["sources"]],
                dict(zip([s.uri for s in sources], starts, strict=True)))
    return starts


def worker_next(state: dict[str, Any], worker: tuple[int, int] | None) -> int | None:
    """The next step of the DataLoader worker ``(id, num_workers)`` loading ``state``: the
    saved one if the state is that worker's, else None (the worker starts from the
    dataset's step)."""
    if worker is None or "worker_next_step" not in state:
        return None
    same = (state.get("worker"), state.get("num_workers")) == worker
    return int(state["worker_next_step"]) if same else None


def dataset_states(state: Any) -> list[dict[str, Any]]:
    """Every ``StreamDataset`` state inside a loader's state (a ``StatefulDataLoader`` holds
    one per worker, each as of the last batch it handed out)."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if STATE_KEYS <= node.keys():
                found.append(node)
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(state)
    return found


def check_named(accept: Accept) -> None:
    """Refuses a filter that its name does not find again: a checkpoint records ``accept``
    as ``module.qualname``, and a resume compares that name, so two lambdas (or two nested
    functions of one name) would pass for the same filter.

    Raises:
        ValueError: ``accept`` is a lambda, a nested function or a callable without a name
            that resolves to it.
    """
    module = sys.modules.get(getattr(accept, "__module__", None) or "")
    name = getattr(accept, "__qualname__", None)
    found: Any = module
    for part in (name or "<none>").split("."):
        found = getattr(found, part, None)
    if found is None or found is not getattr(accept, "__func__", accept):
        what = ("a lambda" if name and "<lambda>" in name else
                "a nested function" if name and "<locals>" in name else
                f"{accept!r}, which its module and name do not find again")
        raise ValueError(
            f"accept= got {what}: the filter is recorded by name (module.qualname) in "
            "checkpoints, so a resume can check it is the same; define it with def at the "
            "top level of a module")
