"""The steps of one stream under a read-time policy: stale groups dropped or masked, groups
a filter rejects skipped, each step refilled from later samples, and ranks given groups by
tokens. ``lakestream.plan.choose`` decides; this reads the planning columns it needs (small,
columnar), then each rank's rows, and counts what each step skipped (``skipped``).

Steps are planned one after another from a known (step, cursor): the cursor of the next
step is where this one stopped, and every sample between them that the step did not take
is counted once, as dropped for staleness or rejected by the filter. A handle plans each
step once and keeps the choices of the last ``KEPT_CHOICES`` steps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakestream.checks import check_int, check_names
from lakestream.errors import StepNotAvailableError
from lakestream.plan.balance import balance_groups
from lakestream.plan.choose import FRESH, Choice, choose, kept
from lakestream.plan.mix import runs
from lakestream.plan.slices import check_rank, check_world, equal_count
from lakestream.read.cache import FragmentCache
from lakestream.read.offsets import Readable
from lakestream.read.tensors import Alloc
from lakestream.schema.arrays import as_numpy

Accept = Callable[[pa.Table], bool]
STALE_COLUMN = "stale"
"""The per-sample column a step carries with ``on_stale="mask"``."""
COUNTS_KEY = "read_policy"
"""The key of each batch's counts of the samples its step dropped or masked."""
KEPT_CHOICES = 4096
VERSION_COLUMNS = ("policy_version_min", "policy_version")
"""The column that gives a sample's oldest policy version, the first the stream has."""


@dataclass(frozen=True)
class ReadPolicy:
    """What a reader drops, masks and balances (see ``StreamDataset``).

    ``accept`` must be a pure function of a group's rows (``accept_columns`` of them, all
    if None), the same function on every rank and after every restart: it decides which
    samples each step holds.
    """

    max_staleness: int | None = None
    on_stale: str = "drop"
    accept: Accept | None = None
    accept_columns: tuple[str, ...] | None = None
    balance: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_staleness",
                           check_int("max_staleness", self.max_staleness, optional=True))
        if self.on_stale not in ("drop", "mask"):
            raise ValueError(f"on_stale must be 'drop' or 'mask', got {self.on_stale!r}")
        if self.on_stale == "mask" and self.max_staleness is None:
            raise ValueError("on_stale='mask' marks the samples older than max_staleness: "
                             "give max_staleness too")
        if self.accept is not None and not callable(self.accept):
            raise ValueError(f"accept must be a function of a group's rows, got "
                             f"{self.accept!r}")
        if self.accept_columns is not None:
            if self.accept is None:
                raise ValueError("accept_columns are the columns accept= reads: give accept "
                                 "too")
            check_names("accept_columns", self.accept_columns)

    @property
    def active(self) -> bool:
        return self.max_staleness is not None or self.accept is not None \
            or self.balance is not None

    def describe(self) -> dict[str, object]:
        """What identifies the policy in a saved state (the filter by its name)."""
        accept = None if self.accept is None else \
            f"{getattr(self.accept, '__module__', '?')}.{getattr(self.accept, '__qualname__', '?')}"
        return {"max_staleness": self.max_staleness, "on_stale": self.on_stale,
                "accept": accept, "accept_columns": None if self.accept_columns is None
                else list(self.accept_columns), "balance": self.balance}

    def check(self, schema: pa.Schema, uri: str) -> None:
        """Raises ValueError unless ``schema`` has every column the policy reads."""
        names = schema.names
        version = version_column(schema)
        if self.max_staleness is not None:
            if version is None:
                raise ValueError(f"max_staleness needs a policy version: {uri} has none of "
                                 f"the columns {list(VERSION_COLUMNS)}")
            if not pa.types.is_integer(schema.field(version).type):
                raise ValueError(f"max_staleness compares policy versions as integers, and "
                                 f"{uri}'s {version!r} is {schema.field(version).type}")
        if COUNTS_KEY in names:
            raise ValueError(f"{uri} has a column {COUNTS_KEY!r}, where each batch of a "
                             "read policy carries its counts: rename the column")
        if self.max_staleness is not None and self.on_stale == "mask" \
                and STALE_COLUMN in names:
            raise ValueError(f"{uri} has a column {STALE_COLUMN!r}, where on_stale='mask' "
                             "puts its mask: rename the column or drop stale groups")
        unknown = [c for c in self.accept_columns or () if c not in names]
        if unknown:
            raise ValueError(f"accept_columns {unknown} are not columns of {uri} ({names})")
        if self.balance is not None:
            if self.balance not in names:
                raise ValueError(f"balance={self.balance!r} is not a column of {uri} "
                                 f"({names})")
            t = schema.field(self.balance).type
            if not (pa.types.is_list(t) or pa.types.is_large_list(t)
                    or pa.types.is_integer(t)):
                raise ValueError(f"balance={self.balance!r} must name a list column (its "
                                 f"lengths are the cost) or an integer one, not {t}")


@dataclass(frozen=True)
class Skipped:
    """Samples a step passed over: dropped for staleness, or rejected by the filter."""

    stale_dropped: int = 0
    filtered: int = 0

    def __add__(self, other: Skipped) -> Skipped:
        return Skipped(self.stale_dropped + other.stale_dropped,
                       self.filtered + other.filtered)


def skipped(keep: np.ndarray, dropped: np.ndarray, group_size: int) -> Skipped:
    """The samples of a run of groups that are not kept: those whose staleness dropped them
    (``dropped``), the rest rejected by the filter. The one count of what a step skips,
    whether the groups its choice passes over or those dropped before it could be filled:
    each batch's ``read_policy`` counts are these."""
    passed = ~np.asarray(keep, bool)
    stale = int((passed & dropped).sum())
    return Skipped(stale * group_size, (int(passed.sum()) - stale) * group_size)


def version_column(schema: pa.Schema) -> str | None:
    return next((c for c in VERSION_COLUMNS if c in schema.names), None)


class SelectedSteps:
    """``stream``'s steps under ``policy``, planned from step ``base_step`` at offset
    ``base_cursor``. Offers what ``MixSteps`` offers, so readers take either."""

    def __init__(self, stream: Readable, policy: ReadPolicy, base_step: int = 0,
                 base_cursor: int = 0) -> None:
        policy.check(stream.schema, stream.uri)
        if base_cursor % stream.group_size:
            raise ValueError(f"cursor {base_cursor} is not at a group's start "
                             f"(group size {stream.group_size})")
        self.streams = [stream]
        self.policy = policy
        self.base_step = base_step
        self.global_batch_size = stream.global_batch_size
        self._groups = stream.global_batch_size // stream.group_size
        self._cursors = {base_step: base_cursor}
        self._choices: dict[int, tuple[Choice, Skipped]] = {}
        self._next = base_step  # the first step not planned yet
        self._lock = threading.Lock()
        # Planning columns of the samples from the next step's cursor on.
        self._lo = self._hi = base_cursor
        self._versions = np.zeros(0, np.int64)
        self._accepted = np.zeros(0, bool)
        self._costs = np.zeros(0, np.int64)
        self._skipped = Skipped()
        """Samples dropped from the buffer's front before the next step was filled: that
        step counts them."""
        self._cache = FragmentCache(64 << 20)  # fragments a step shares with the next
        self._version_column = version_column(stream.schema) \
            if policy.max_staleness is not None else None
        columns = {self._version_column, policy.balance} - {None}
        if policy.accept is not None:
            columns |= set(policy.accept_columns or stream.schema.names)
        self._columns = [c for c in stream.schema.names if c in columns]
        """The planning columns, in the stream's order."""

    @property
    def stream(self) -> Readable:
        return self.streams[0]

    @property
    def uri(self) -> str:
        return self.stream.uri

    # -- planning --------------------------------------------------------------------------

    def _extend(self) -> bool:
        """Reads the planning columns of newly committed groups; False if there are none."""
        stream = self.stream
        hi = stream.num_samples
        if hi <= self._hi:
            return False
        hi = min(hi, self._hi + max(4 * self.global_batch_size, 4096 // stream.group_size
                                    * stream.group_size))
        if self._columns:
            table = stream.read_offsets([(self._hi, hi)], self._columns,
                                        what=f"samples [{self._hi}, {hi}) planned")
        else:
            table = pa.table({"_": pa.nulls(hi - self._hi)})
        g = stream.group_size
        n = (hi - self._hi) // g
        if self._version_column is not None:
            v = pc.cast(table.column(self._version_column), pa.int64())
            versions = as_numpy(v, fill=FRESH).astype(np.int64, copy=False)
        else:
            versions = np.full(hi - self._hi, FRESH, np.int64)
        accept = self.policy.accept
        if accept is None:
            accepted = np.ones(n, bool)
        else:
            rows = table.select(list(self.policy.accept_columns)) \
                if self.policy.accept_columns is not None else table
            accepted = np.array([bool(accept(rows.slice(i * g, g))) for i in range(n)],
                                dtype=bool)
        if self.policy.balance is not None:
            col = table.column(self.policy.balance)
            t = col.type
            per = pc.list_value_length(col) if not pa.types.is_integer(t) else col
            per_sample = as_numpy(per, fill=0).astype(np.int64, copy=False)
            costs = per_sample.reshape(n, g).sum(axis=1)
        else:
            costs = np.zeros(n, np.int64)
        self._versions = np.concatenate([self._versions, versions])
        self._accepted = np.concatenate([self._accepted, accepted])
        self._costs = np.concatenate([self._costs, costs])
        self._hi = hi
        return True

    def _kept(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per group in the buffer, whether ``step`` may take it and whether its staleness
        drops it; per sample, whether it is stale."""
        return kept(step, self.stream.group_size, self._versions, self._accepted,
                    self.policy.max_staleness, self.policy.on_stale == "drop")

    def _skip(self, keep: np.ndarray, dropped: np.ndarray, groups: int) -> Skipped:
        """Counts the buffer's first ``groups`` groups that are not kept, and moves the
        buffer past them all; returns what the step skipped so far."""
        self._skipped += skipped(keep[:groups], dropped[:groups], self.stream.group_size)
        self._advance(self._lo + groups * self.stream.group_size)
        return self._skipped

    def _advance(self, offset: int) -> None:
        g = self.stream.group_size
        groups = (offset - self._lo) // g
        self._versions = self._versions[offset - self._lo:]
        self._accepted = self._accepted[groups:]
        self._costs = self._costs[groups:]
        self._lo = offset

    def _plan(self, step: int, refresh: bool = False) -> bool:
        """Plans every step up to ``step``; False if the committed samples do not fill it
        yet (as this handle sees them; ``refresh`` looks at the log once more first)."""
        if step < self._next:
            return True
        if step < self.base_step:
            raise ValueError(f"step {step} is before step {self.base_step}, where this "
                             "handle's planning starts")
        with self._lock:
            while self._next <= step:
                t = self._next
                keep, dropped, stale = self._kept(t)
                choice = choose(t, self._lo, self.stream.group_size, self._groups, keep=keep,
                                stale=stale, costs=self._costs)
                if choice is None:
                    # Drop the groups before the first kept one (all, if none), so that a
                    # filter rejecting everything does not grow the buffer.
                    self._skip(keep, dropped, int(np.argmax(keep)) if keep.any() else len(keep))
                    if not self._extend():
                        if not refresh:
                            return False
                        refresh = False
                        self.stream.refresh()
                    continue
                passed = (choice.end - self._lo) // self.stream.group_size
                self._choices[t] = (choice, self._skip(keep, dropped, passed))
                self._skipped = Skipped()
                self._choices.pop(t - KEPT_CHOICES, None)
                self._cursors[t + 1] = choice.end
                self._cursors.pop(t - KEPT_CHOICES, None)
                self._next = t + 1
            return True

    def choice(self, step: int) -> Choice:
        """What ``step`` takes.

        Raises:
            StepNotAvailableError: not enough samples are committed for it yet.
        """
        return self._planned(step)[0]

    def _planned(self, step: int) -> tuple[Choice, Skipped]:
        if not self._plan(step, refresh=True):
            raise StepNotAvailableError(
                f"step {step} of {self.uri} is not filled yet: {self.committed()} (the "
                "read policy skips some)")
        planned = self._choices.get(step)
        if planned is None:
            raise ValueError(f"step {step} was planned more than {KEPT_CHOICES} steps ago "
                             "by this handle: open another to read it")
        return planned

    # -- what readers ask ----------------------------------------------------------------

    def ended(self, step: int) -> bool:
        """Whether the stream is sealed and what is left does not fill ``step``."""
        sealed = self.stream.sealed_at
        return sealed is not None and not self._plan(step) and self._hi >= sealed

    def ready(self, step: int) -> bool:
        return self._plan(step)

    def poll(self) -> float:
        self.stream.poll()
        return self.stream.poll_wait_s()

    def committed(self) -> str:
        return f"{self.stream.num_samples} samples in {self.uri}"

    def check_world(self, world_size: int) -> None:
        check_world(self.global_batch_size, self.stream.group_size, world_size)

    def cursors(self, step: int) -> list[int]:
        """Where step ``step`` starts reading (it is planned up to there if need be).

        Raises:
            StepNotAvailableError: the steps before it are not all committed.
        """
        if step not in self._cursors:
            self.choice(step - 1)
        return [self._cursors[step]]

    def hold_from(self, step: int) -> list[int]:
        return self.cursors(step)

    def progress_offsets(self, step: int) -> list[int]:
        """The cursor of ``step`` once it is filled. Until then, its cursor plus every
        sample after it known to be skipped (they stay skipped): producers held to
        ``max_lag_steps`` count only what the reader may still take, or a run of skipped
        groups longer than the bound would stop them and the reader for ever."""
        if self._plan(step, refresh=True):
            return self.cursors(step)
        with self._lock:
            keep, dropped, _ = self._kept(self._next)
            ahead = skipped(keep, dropped, self.stream.group_size)
            return [self._lo + ahead.stale_dropped + ahead.filtered]

    def counts(self, step: int) -> dict[str, int] | None:
        """Samples dropped or masked at ``step``."""
        choice, passed = self._planned(step)
        return {"stale_dropped": passed.stale_dropped, "filtered": passed.filtered,
                "stale_masked": int(choice.stale.sum())}

    def expect_overtaking(self, steps: int) -> None:
        """Nothing to do: this cache keeps what it holds by its bound alone, not until a
        later step begins."""

    def read(self, step: int, rank: int, world_size: int,
             columns: list[str] | None = None, *, alloc: Alloc | None = None) -> pa.Table:
        """Rank ``rank`` of ``world_size``'s rows of ``step``: its groups (by tokens with
        ``balance``), in log order, plus the stale mask with ``on_stale="mask"``. Tensor
        columns come in the table (``alloc`` is not used: a policy's groups are many small
        runs)."""
        choice = self.choice(step)
        g = self.stream.group_size
        ranks = balance_groups(choice.costs, world_size) if self.policy.balance is not None \
            else equal_count(len(choice.groups), world_size)
        mine = ranks[check_rank(rank, world_size)]
        offsets = (choice.groups[mine][:, None] + np.arange(g)[None, :]).ravel()
        table = self.stream.read_offsets(runs(offsets), columns, what=f"step {step}",
                                         cache=self._cache)
        if self.policy.max_staleness is not None and self.policy.on_stale == "mask":
            stale = choice.stale.reshape(-1, g)[mine].ravel()
            table = table.append_column(STALE_COLUMN, pa.array(stale, pa.bool_()))
        return table
