"""Planning what every rank reads at every step when steps mix several sources, shuffle
them and repeat them: pure functions of the sources' sizes, the step and the world.

A plan has sources i = 0..n-1, each giving ``take`` samples (k_i) to every step, so a step
holds B = sum(k_i) samples. Step t takes, from source i, the positions
``start_i + (t - base_step) * k_i + j`` for j < k_i of that source's sample sequence, which
is its log order, possibly shuffled and repeated:

- ``cycle``: a sealed source wraps around: position q is sample ``q mod N`` of source epoch
  ``q div N`` (N: its sealed size). Up-sampling.
- ``epochs=n`` (every non-cycling source sealed): the whole mix runs n times; an epoch lasts
  as many steps as the shortest non-cycling source allows, and each re-reads its sources from
  the start.
- ``shuffle_window=w``: each window of ``w * k_i`` consecutive positions of source i is
  permuted by a seeded permutation of its groups (G_i samples stay together). When the
  source's size is known for the whole plan (``epochs`` or ``cycle``), each source epoch also
  takes its windows in a fresh seeded order. Live sources keep windows in log order: a window
  is readable once every sample in it is committed.

Rank r of W reads the r-th share of each source's k_i slots (``lakestream.plan.slices``), so
every rank sees the same proportions (W must divide k_i, and k_i / W must hold whole
groups). Nothing here reads a store: every rank and every restart derives the same rows
from the same inputs.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from lakestream.checks import check_int
from lakestream.plan.slices import check_world, rank_slice

KEPT_PER_SOURCE = 4
"""Window permutations, and epoch orders of windows, a plan keeps per source: a step and the
reads ahead of it touch at most two windows of each source, and two epochs of a cycling one."""
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _seed(*parts: int) -> int:
    h = _GOLDEN
    for p in parts:
        h = int(_mix(np.array([(h ^ (p & _MASK)) + _GOLDEN & _MASK], np.uint64))[0])
    return h


def permutation(n: int, *key: int) -> np.ndarray:
    """A permutation of ``range(n)`` determined by ``key`` alone: the same on every machine
    and numpy version (it sorts a fixed hash of each index)."""
    base = np.uint64(_seed(*key))
    return np.argsort(_mix(np.arange(n, dtype=np.uint64) + base), kind="stable")


@dataclass(frozen=True)
class SourcePlan:
    """What the planner knows of one source."""

    take: int
    """Samples per step (k)."""
    group_size: int = 1
    cycle: bool = False
    sealed: int | None = None
    """The source's size in samples once sealed; None while appends may still come."""
    start: int = 0
    """The position this source reads at ``base_step`` (its cursor when the mix began)."""
    key: int | None = None
    """What its shuffle permutations are keyed by: a fixed hash of the stream's identity
    (``source_key``), so that a changed mix (a source added before it) permutes it as
    before; None keys them by the source's index, as plans did before (states saved then
    resume with the permutations they were read with)."""


class MixPlan:
    """The rows of every step of a mix (see the module docstring).

    Raises (construction):
        ValueError: an argument is out of range, or ``cycle``/``epochs`` is asked of a source
            that is not sealed.
    """

    def __init__(self, sources: Sequence[SourcePlan], *, shuffle_window: int | None = None,
                 seed: int = 0, epochs: int | None = None, base_step: int = 0) -> None:
        if not sources:
            raise ValueError("a mix needs at least one source")
        for i, s in enumerate(sources):
            if not isinstance(s.take, int) or s.take < 1 or s.take % s.group_size:
                raise ValueError(f"source {i}: take={s.take!r} must be a positive multiple of "
                                 f"its group size {s.group_size}")
            if s.cycle and not s.sealed:
                raise ValueError(f"source {i}: cycle needs a sealed, non-empty source "
                                 "(Stream.seal() it first)")
            if s.start < 0:
                raise ValueError(f"source {i}: start must be >= 0, got {s.start}")
        shuffle_window = check_int("shuffle_window", shuffle_window, least=1, optional=True)
        epochs = check_int("epochs", epochs, least=1, optional=True)
        if epochs is not None:
            linear = [i for i, s in enumerate(sources) if not s.cycle]
            if not linear:
                raise ValueError("epochs needs a source that does not cycle: its size sets "
                                 "the epoch's length")
            live = [i for i in linear if sources[i].sealed is None]
            if live:
                raise ValueError(f"epochs needs sealed sources; source(s) {live} may still "
                                 "grow (Stream.seal() them first)")
            if base_step or any(s.start for s in sources):
                raise ValueError("a mix with epochs starts every source at 0")
        self.sources = tuple(sources)
        self.shuffle_window, self.seed, self.epochs = shuffle_window, seed, epochs
        self.base_step = base_step
        self.global_batch_size = sum(s.take for s in sources)
        self.steps_per_epoch: int | None = None
        if epochs is not None:
            self.steps_per_epoch = min((s.sealed or 0) // s.take for s in sources
                                       if not s.cycle)
        self._orders: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._sigmas: OrderedDict[tuple[int, int, int, int], np.ndarray] = OrderedDict()
        self._kept = KEPT_PER_SOURCE * len(sources)

    # -- sizes ------------------------------------------------------------------------

    @property
    def num_steps(self) -> int | None:
        """Steps in the whole mix, or None while it has no end (a live, non-cycling source).
        It ends when a sealed, non-cycling source runs out."""
        if self.epochs is not None:
            assert self.steps_per_epoch is not None
            return self.epochs * self.steps_per_epoch
        ends = [self.base_step + max(0, s.sealed - s.start) // s.take
                for s in self.sources if not s.cycle and s.sealed is not None]
        return min(ends) if ends else None

    def ended(self, step: int) -> bool:
        """Whether the mix ends before ``step``."""
        end = self.num_steps
        return end is not None and step >= end

    @cached_property
    def aligned(self) -> bool:
        """Whether every source's shuffle windows start where the plan's windows of steps
        do (at steps ``base_step + k * shuffle_window``): then each window of steps reads
        whole source windows, and no later step reads one an earlier window of steps read.

        Not so when a source's windows are permuted (``epochs``, ``cycle``) and its size is
        not a whole number of windows (the short one falls anywhere in the order), or when a
        cycling source resumes in the middle of a window. (A plan with epochs starts at 0,
        and with every size a whole number of windows so is every epoch.)
        """
        if self.shuffle_window is None:
            return True
        for i, s in enumerate(self.sources):
            if not self._permutes_windows(i):
                continue  # live: its windows start at its start, as the steps' do
            size = self._window(i)
            if s.sealed is None or s.sealed % size:
                return False
            if s.cycle and s.start % size:
                return False
        return True

    def check_world(self, world_size: int) -> None:
        """Raises ValueError unless every rank can take whole groups of every source."""
        for i, s in enumerate(self.sources):
            check_world(s.take, s.group_size, world_size, where=None if len(self.sources) == 1
                        else f"source {i} takes {s.take} samples per step")

    def with_sealed(self, sealed: Sequence[int | None]) -> MixPlan:
        """The same plan with the sources' current sealed sizes (a source sealed since)."""
        if all(s.sealed == n for s, n in zip(self.sources, sealed, strict=True)):
            return self
        return MixPlan([replace(s, sealed=n) for s, n in zip(self.sources, sealed,
                                                                strict=True)],
                       shuffle_window=self.shuffle_window, seed=self.seed,
                       epochs=self.epochs, base_step=self.base_step)

    # -- positions --------------------------------------------------------------------

    def position(self, i: int, step: int) -> int:
        """The first position source ``i`` reads at ``step`` (its cursor there), counted
        over all its epochs."""
        s = self.sources[i]
        if self.epochs is not None and not s.cycle:
            assert self.steps_per_epoch is not None
            _, within = divmod(step, max(self.steps_per_epoch, 1))
            return within * s.take
        return s.start + (step - self.base_step) * s.take

    def _epoch_positions(self, i: int, step: int, slots: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
        """(source epoch, position within it) of each slot of ``step``."""
        s = self.sources[i]
        q = self.position(i, step) + slots
        if s.cycle:
            assert s.sealed
            return q // s.sealed, q % s.sealed
        epoch = 0
        if self.epochs is not None:
            assert self.steps_per_epoch is not None
            epoch = step // max(self.steps_per_epoch, 1)
        return np.full_like(q, epoch), q

    def _windows(self, i: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Source ``i``'s windows in the order epoch ``epoch`` takes them, and where each
        starts in that order (a last, shorter window included)."""
        key = (i, epoch)
        found = self._orders.get(key)
        if found is None:
            s, size = self.sources[i], self._window(i)
            assert s.sealed is not None
            count = -(-s.sealed // size)
            order = permutation(count, self.seed, self._key(i), epoch, 0)
            sizes = np.where(order == count - 1, s.sealed - (count - 1) * size, size)
            found = order, np.concatenate([[0], np.cumsum(sizes)])
            _keep(self._orders, key, found, self._kept)
        return found

    def _key(self, i: int) -> int:
        key = self.sources[i].key
        return i if key is None else key

    def _window(self, i: int) -> int:
        assert self.shuffle_window is not None
        return self.shuffle_window * self.sources[i].take

    def _permutes_windows(self, i: int) -> bool:
        return self.epochs is not None or self.sources[i].cycle

    def _sigma(self, i: int, epoch: int, w: int, groups: int) -> np.ndarray:
        """The permutation of window ``w``'s groups (kept for the last few windows: every
        step of a window asks for it, and every rank)."""
        key = (i, epoch, w, groups)
        sigma = self._sigmas.get(key)
        if sigma is None:
            sigma = permutation(groups, self.seed, self._key(i), epoch, w + 1)
            _keep(self._sigmas, key, sigma, self._kept)
        return sigma

    def _offsets(self, i: int, step: int, slots: np.ndarray, *, rows: bool = True
                 ) -> tuple[np.ndarray | None, int]:
        """The source offsets of ``slots`` of ``step`` (None unless ``rows``), and the offset
        the step needs committed (the end of the windows it reads)."""
        s = self.sources[i]
        epochs, pos = self._epoch_positions(i, step, slots)
        if self.shuffle_window is None:
            return pos, int(pos.max()) + 1
        size, g = self._window(i), s.group_size
        out = np.empty_like(pos) if rows else None
        needed = 0
        for epoch, mask in _groups_of(epochs):
            p = pos[mask]
            if self._permutes_windows(i):
                order, starts = self._windows(i, epoch)
                at = np.searchsorted(starts, p, side="right") - 1
                wid, within = order[at], p - starts[at]
                base = 0
            else:
                base = s.start if self.epochs is None else 0
                wid, within = (p - base) // size, (p - base) % size
            got = np.empty_like(p)
            for w, sel in _groups_of(wid):
                first = base + w * size
                length = size if s.sealed is None else min(size, s.sealed - first)
                needed = max(needed, first + length)
                if out is None:
                    continue
                sigma = self._sigma(i, epoch, w, length // g)
                u = within[sel]
                got[sel] = first + sigma[u // g] * g + u % g
            if out is not None:
                out[mask] = got
        return out, needed

    # -- what a step reads --------------------------------------------------------------

    def rank_spans(self, step: int, rank: int, world_size: int) -> list[list[tuple[int, int]]]:
        """For each source, the offset ranges ``[lo, hi)`` rank ``rank`` of ``world_size``
        reads at ``step``, in the order its samples come in the step."""
        out = []
        for i, s in enumerate(self.sources):
            slots = rank_slice(s.take, rank, world_size, f"source {i}'s take of {s.take}")
            offsets, _ = self._offsets(i, step, np.arange(slots.start, slots.stop))
            assert offsets is not None
            out.append(runs(offsets))
        return out

    def last_step(self, i: int, step: int, lo: int, hi: int) -> int:
        """The last step, from ``step`` (which reads some of them) on, that may read source
        ``i``'s offsets ``[lo, hi)`` (any rank's share) before the source comes round to
        them again in a later epoch or cycle: how long a reader keeps what it decoded of
        them (``lakestream.read.cache``).

        In log order, the step that reaches ``hi - 1`` (within the epoch). Shuffled, the
        end of the window of steps that reads the source window holding ``hi - 1``; where
        the source's windows are permuted (``epochs``, ``cycle``), the end of the window of
        steps of ``step`` (one window more where windows do not line up: ``aligned``): a
        fragment across two source windows that the permutation puts apart is read again.
        """
        s = self.sources[i]
        if self.shuffle_window is None:
            first = self.position(i, step)
            last = hi - 1
            if s.cycle:  # the pass over the source that this step reads [lo, hi) in
                assert s.sealed
                last += (first + s.take - 1 - lo) // s.sealed * s.sealed
            end = step + max(0, last - first) // s.take
            if self.epochs is not None and not s.cycle:
                assert self.steps_per_epoch is not None
                spe = max(self.steps_per_epoch, 1)
                end = min(end, (step // spe + 1) * spe - 1)
            return end
        w = self.shuffle_window
        window = (step - self.base_step) // w
        if self._permutes_windows(i):
            window += 0 if self.aligned else 1
        else:
            window = max(window, (hi - 1 - s.start) // self._window(i))
        return self.base_step + (window + 1) * w - 1

    def reads_again(self, i: int, step: int) -> bool:
        """Whether a later pass of the plan reads source ``i``'s offsets that ``step`` reads:
        a cycling source comes round for ever, a mix with epochs until its last epoch; a
        source read once reads each offset once."""
        if self.sources[i].cycle:
            return True
        if self.epochs is None:
            return False
        assert self.steps_per_epoch is not None
        return step // max(self.steps_per_epoch, 1) < self.epochs - 1

    def needed(self, step: int) -> list[int]:
        """For each source, the samples that must be committed for ``step`` to be readable
        (by every rank at once)."""
        return [self._offsets(i, step, np.arange(s.take), rows=False)[1]
                for i, s in enumerate(self.sources)]

    def cursor(self, step: int) -> list[int]:
        """For each source, where a changed mix taking over at ``step`` resumes it: its
        position, or for a live shuffled source the start of its window there (samples of
        that window read before are read again rather than skipped)."""
        out = []
        for i, s in enumerate(self.sources):
            p = self.position(i, step)
            if self.shuffle_window is not None and not self._permutes_windows(i):
                size = self._window(i)
                p = s.start + (p - s.start) // size * size
            out.append(p)
        return out

    def hold_from(self, step: int) -> list[int]:
        """For each source, the lowest offset that a run resuming at ``step`` may read: what
        its checkpoint marker must keep from retention."""
        return [0 if self._permutes_windows(i) else c  # a later epoch reads it all again
                for i, c in enumerate(self.cursor(step))]


def source_key(identity: str) -> int:
    """A source's permutation key: a fixed 64-bit hash of its stream's identity (its table
    id), the same on every machine and after the mix around it changed."""
    return int.from_bytes(hashlib.blake2b(identity.encode(), digest_size=8).digest(), "big")


def resume_position(cursor: int, sealed: int | None, *, same_order: bool) -> int:
    """Where a source whose windows are permuted (``cycle``) resumes when the mix changed
    at its ``cursor``: there, if its permutations are as they were (same key, take, window
    and seed), so every position names the sample it named; otherwise at the start of its
    next epoch, since the rest of this epoch would map to other samples and could repeat
    ones already read. Each sample of the epoch is then read at most once."""
    if same_order or not sealed:
        return cursor
    return -(-cursor // sealed) * sealed


def runs(offsets: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive offsets merged into ``[lo, hi)`` ranges, in order."""
    if offsets.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(offsets) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [offsets.size]])
    return list(zip(offsets[starts].tolist(), (offsets[ends - 1] + 1).tolist(), strict=True))


def _groups_of(values: np.ndarray) -> list[tuple[int, slice | np.ndarray]]:
    """Each distinct value and where it is (all of it, the common case, as a slice)."""
    if len(values) and (values == values[0]).all():
        return [(int(values[0]), slice(None))]
    return [(int(v), values == v) for v in np.unique(values)]


def _keep(cache: OrderedDict, key: tuple, value: object, limit: int) -> None:
    """Adds ``value`` to ``cache``, dropping the oldest entries beyond ``limit``."""
    cache[key] = value
    while len(cache) > limit:
        cache.popitem(last=False)
