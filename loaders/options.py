"""How a StreamDataset reads: its options as one value, each checked once, when it is made.

``StreamDataset(uri, group, options)`` takes a ``ReadOptions``; its keyword arguments are
the same names (``StreamDataset(uri, read_threads=4)``) and override the given value's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lakestream.loaders.collate import Collate
from lakestream.loaders.device import check_delivery
from lakestream.reading import Accept, DiskCache, ReadPolicy, check_int, check_names


@dataclass(frozen=True)
class ReadOptions:
    """A StreamDataset's options (all optional).

    Args:
        batch_size: samples per step over all ranks, chosen at read time (None: the
            stream's global batch size): the stream's samples in log order, cut into
            batches of this many, groups whole (a multiple of the group size; W must divide
            it into whole groups). Resumes, markers and retention work as with the stream's
            own steps; a checkpoint may resume with another batch size.
        rank, world_size: default to torch.distributed, then RANK/WORLD_SIZE, then 0/1.
        start_step: the first step to read. max_steps: iteration stops before this step.
        columns: the columns to read (all if None). timeout: seconds to wait for a step
            (None waits forever). collate: "padded", "packed" or a callable on the table.
        storage_options: the object store's options (credentials, endpoint), for every
            source that names none of its own.
        transform: a function of each collated batch (decoding images, resizing,
            augmenting) whose result is yielded instead; it runs in the read threads (in
            each DataLoader worker's, with workers), beside decoding, never in the
            training loop's thread. Defined at a module's top level if workers are used.
        read_threads: threads reading, collating and transforming steps; None: this rank's
            share of the host's cores less one (``loaders/host.py``: ``LOCAL_WORLD_SIZE``
            ranks share the cores, a DataLoader's workers share the rank's), at least 1,
            and 4 more while reads wait on the store (measured: S3, a ``disk_cache``, a
            slow mount; a count given here is the count read with).
            However many there are, per-byte work runs in at most that many at once
            (``lakestream.store.slots``): threads past it only wait for a remote store.
        prefetch: steps read ahead, in those threads, and one more per waiting thread
            while they run; None: one per thread and two more.
        pin_memory: deliver batches in pinned memory, pinned in the read threads (needs
            CUDA). device: e.g. "cuda": deliver batches there, copied in the read threads on
            their own CUDA streams ahead of use (the batch is ready for the consumer's
            current stream without a host wait). Both apply when the dataset is iterated in
            the trainer process; with DataLoader workers, pass ``pin_memory=True`` to the
            loader instead.
        progress_interval_s: how often rank 0 publishes progress (for producers'
            ``max_lag_steps``), from a background thread that stops when iteration ends or
            on ``close``; 0 disables it.
        keep_last: if set, each ``commit_checkpoint`` also runs retention keeping the last
            ``keep_last`` markers of every group, and ``save_checkpoint`` deletes the older
            checkpoints it saved under its root in this process (off by default).
        step_key: the key under which each batch carries its step number; a stream with a
            column of that name needs another (``ValueError`` otherwise).
        shuffle_window, seed, epochs: a mix's shuffle and epochs (``StreamDataset``;
            default: log order, once, no end).
        max_staleness, on_stale, accept, accept_columns, balance: the read-time policy
            (``StreamDataset``; default: none).
        disk_cache: a ``DiskCache(folder, limit)`` that whole fragments are fetched through,
            shared by every process on the host that names the same folder (ranks, their
            DataLoader workers): each fragment is then fetched from the store once while
            the cache holds it (``lakestream.store.diskcache``). Off by default.

    Raises:
        TypeError, ValueError: an option of the wrong type or out of its range, named.
    """

    batch_size: int | None = None
    rank: int | None = None
    world_size: int | None = None
    start_step: int = 0
    max_steps: int | None = None
    columns: list[str] | None = None
    timeout: float | None = None
    collate: str | Collate = "padded"
    storage_options: Mapping[str, str] | None = None
    transform: Callable[[Any], Any] | None = None
    read_threads: int | None = None
    prefetch: int | None = None
    pin_memory: bool = False
    device: str | None = None
    progress_interval_s: float = 1.0
    keep_last: int | None = None
    step_key: str = "step"
    shuffle_window: int | None = None
    seed: int = 0
    epochs: int | None = None
    max_staleness: int | None = None
    on_stale: str = "drop"
    accept: Accept | None = None
    accept_columns: Sequence[str] | None = None
    balance: str | None = None
    disk_cache: DiskCache | None = None

    def __post_init__(self) -> None:
        for name, least, optional in (("batch_size", 1, True), ("start_step", 0, False),
                                      ("read_threads", 1, True), ("prefetch", 0, True),
                                      ("keep_last", 1, True)):
            value = check_int(name, getattr(self, name), least=least, optional=optional)
            object.__setattr__(self, name, value)
        if self.disk_cache is not None and not isinstance(self.disk_cache, DiskCache):
            raise TypeError(f"disk_cache must be a lakestream DiskCache(folder, limit), got "
                            f"{self.disk_cache!r}")
        if not callable(self.collate) and self.collate not in ("padded", "packed"):
            raise ValueError(f"collate must be 'padded', 'packed' or a callable, got "
                             f"{self.collate!r}")
        if self.transform is not None and not callable(self.transform):
            raise TypeError(f"transform must be a callable on a batch, got {self.transform!r}")
        # lists, as the readers take them, made once
        object.__setattr__(self, "columns", check_names("columns", self.columns))
        object.__setattr__(self, "accept_columns",
                           check_names("accept_columns", self.accept_columns))
        check_delivery(self.pin_memory, self.device)

    @classmethod
    def of(cls, options: ReadOptions | None, settings: Mapping[str, Any]) -> ReadOptions:
        """``options`` (the defaults if None) with ``settings`` (option names) overriding.

        Raises:
            TypeError: a name that is no option, with the names there are.
        """
        if options is not None and not isinstance(options, ReadOptions):
            raise TypeError(f"options must be a ReadOptions, got {options!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - names)
        if unknown:
            raise TypeError(f"StreamDataset has no option {', '.join(map(repr, unknown))}: "
                            f"its options are {', '.join(sorted(names))}")
        return dataclasses.replace(options or cls(), **settings)

    def policy(self) -> ReadPolicy:
        """The read-time policy these options ask for (inactive if none)."""
        return ReadPolicy(self.max_staleness, self.on_stale, self.accept,
                          None if self.accept_columns is None else tuple(self.accept_columns),
                          self.balance)
