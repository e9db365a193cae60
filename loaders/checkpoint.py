"""Saving a training checkpoint and its marker in one call, on a local path or S3 under the
trainer's checkpoint root, and refusing to resume from a checkpoint that is not whole or
not the trainer's own."""

from __future__ import annotations

import io
import logging
import os
import shutil
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, cast

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as _FsspecFileSystem
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from lakestream.errors import IncompleteCheckpointError
from lakestream.loaders.dataset import StreamDataset
from lakestream.loaders.locations import CheckpointLocationError, Location, check_location
from lakestream.loaders.resume import STATE_KEYS, StreamMismatchError
from lakestream.loaders.safe_load import SafeLoadPlanner, read_metadata
from lakestream.reading import Marker, failpoint, open_filesystem

log = logging.getLogger("lakestream")

__all__ = ["CheckpointLocationError", "StreamMismatchError", "load_checkpoint",
           "save_checkpoint"]

METADATA = ".metadata"
"""The file DCP writes last (through ``.metadata.tmp`` and a rename): the checkpoint's
table of contents."""


class _CopyingWriter(io.RawIOBase):
    """Hands the file a copy of each buffer written. obstore's writer keeps a reference to
    the caller's buffer after ``write`` returns, and ``torch.save`` reuses its buffers, so
    without the copy a checkpoint on S3 holds garbage of the right size."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return int(self._inner.write(bytes(data)))

    def tell(self) -> int:
        return int(self._inner.tell())

    def close(self) -> None:
        if not self.closed:
            self._inner.close()
        super().close()


class _BoundFileSystem(_FsspecFileSystem):
    """DCP's fsspec adapter on a filesystem built here, so that the options it was built
    with are kept (DCP would rebuild one from the path alone)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def init_path(self, path: str | os.PathLike[str], **kwargs: Any) -> str | os.PathLike[str]:
        return path

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        with super().create_stream(path, mode) as stream:
            yield _CopyingWriter(stream) if "w" in mode else stream


class _Writer(FileSystemWriter):
    """DCP's file writer, on a local path or an fsspec filesystem; the failpoint
    ``before_checkpoint_metadata`` kills the process with every shard written but no
    ``.metadata`` (a save that dies midway)."""

    def __init__(self, path: str, fs: Any | None) -> None:
        # fsync applies to local files only (on others DCP would sync the whole machine).
        super().__init__(path, sync_files=fs is None)
        if fs is not None:
            self.fs = cast(Any, _BoundFileSystem(fs))
            self.path = path

    def finish(self, *args: Any, **kwargs: Any) -> None:
        failpoint("before_checkpoint_metadata")
        super().finish(*args, **kwargs)


class _Reader(FileSystemReader):
    def __init__(self, path: str, fs: Any | None) -> None:
        super().__init__(path)
        if fs is not None:
            self.fs = cast(Any, _BoundFileSystem(fs))
            self.path = path

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's ``read_metadata``, through ``safe_load.read_metadata``."""
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = read_metadata(cast(IO[bytes], stream))
        storage_meta = metadata.storage_meta or StorageMeta()
        storage_meta.load_id = self.load_id  # as DCP's reader does
        metadata.storage_meta = storage_meta
        return metadata


def _storage(location: Location, dataset: StreamDataset,
             storage_options: dict[str, str] | None) -> Any | None:
    """The checkpoint's filesystem (None: a local path). Without ``storage_options`` a
    checkpoint on S3 uses the stream's when the stream is on S3 too."""
    if not location.remote:
        return None
    if storage_options is None and dataset.uri.startswith(("s3://", "s3a://")):
        storage_options = dataset.options.storage_options
    return open_filesystem(location.uri, storage_options)


def _locate(checkpoint: str | Marker, dataset: StreamDataset, root: str | None) -> Location:
    """Checks where ``checkpoint`` is (``locations.check_location``) before anything is
    opened.

    Raises:
        CheckpointLocationError: the location is not the trainer's to open.
        ValueError: a marker without ``root``.
    """
    streams = [source.uri for source in dataset.sources]
    if not isinstance(checkpoint, Marker):
        return check_location(checkpoint, root, streams)
    if root is None:
        raise ValueError("a checkpoint marker's location is read from the stream's log: pass "
                         "root=, the folder or s3:// prefix this trainer keeps its checkpoints "
                         "under, and only a checkpoint under it is opened")
    if checkpoint.checkpoint_id is None:
        raise CheckpointLocationError(
            f"the checkpoint marker of group {checkpoint.group!r} at step {checkpoint.step} "
            f"(log version {checkpoint.version}) names no checkpoint: resume from a marker "
            "that save_checkpoint committed")
    return check_location(checkpoint.checkpoint_id, root, streams, marker=checkpoint)


def _check_whole(reader: _Reader, checkpoint_id: str) -> Metadata:
    """Reads the checkpoint's ``.metadata`` and checks that every file it names holds the
    bytes it lists (a writer that dropped a shard, or a save that died, fails here).

    Raises:
        IncompleteCheckpointError: naming what is missing, or why ``.metadata`` was refused.
    """
    fs = reader.fs
    if not fs.exists(fs.concat_path(reader.path, METADATA)):
        raise IncompleteCheckpointError(
            f"checkpoint {checkpoint_id} has no {METADATA}: its save did not finish (or its "
            "writer dropped it); resume from an earlier checkpoint marker "
            "(Stream.checkpoints(group))")
    try:
        metadata = reader.read_metadata()
    except Exception as e:  # a truncated or garbled pickle, or one naming other classes
        raise IncompleteCheckpointError(
            f"checkpoint {checkpoint_id}: its {METADATA} cannot be read ({e}); resume from an "
            "earlier checkpoint marker (Stream.checkpoints(group))") from None
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, end in sorted(needed.items()):
        path = fs.concat_path(reader.path, name)
        size = None
        if fs.exists(path):
            with fs.create_stream(path, "rb") as f:
                size = f.seek(0, io.SEEK_END)
        if size is None or size < end:
            found = "missing" if size is None else f"{size} bytes, {end} needed"
            raise IncompleteCheckpointError(
                f"checkpoint {checkpoint_id}: {name} is {found}; resume from an earlier "
                "checkpoint marker (Stream.checkpoints(group))")
    return metadata


def _checked_on_rank_zero(check: Callable[[], object]) -> None:
    """Runs ``check`` on rank 0 and raises what it raised on every rank."""
    distributed = dist.is_available() and dist.is_initialized()
    error: list[IncompleteCheckpointError | None] = [None]
    if not distributed or dist.get_rank() == 0:
        try:
            check()
        except IncompleteCheckpointError as e:
            error[0] = e
    if distributed:
        dist.broadcast_object_list(error, src=0)
    if error[0] is not None:
        raise error[0]


def save_checkpoint(state: dict[str, Any], checkpoint_id: str, dataset: Any,
                    key: str = "data", *, root: str | None = None,
                    storage_options: dict[str, str] | None = None) -> int | None:
    """Saves ``state`` plus the loader's state (under ``key``) with
    ``torch.distributed.checkpoint``, checks it is whole, then commits the checkpoint marker.

    Collective: call it on every rank. ``root`` is the folder or ``s3://bucket/prefix``
    under which this trainer keeps its checkpoints, outside every stream; ``checkpoint_id``
    is a name under it (``"step-100"``) or a full location under it. Without ``root``,
    ``checkpoint_id`` is a local path or an ``s3://`` URL outside every stream the dataset
    reads. On S3 the stream's ``storage_options`` are used when the stream is on S3 too
    (or the ones given). ``dataset`` is the ``StreamDataset``, or the loader over it (a
    ``StreamLoader``, or torchdata's ``StatefulDataLoader``, whose state holds its workers'
    positions): its state is saved, and the marker resumes where it does.

    The marker is committed only once every rank's save has returned and rank 0 has read the
    checkpoint's ``.metadata`` back and found every file it names whole; so a marker always
    names a checkpoint that loads. It records the checkpoint's full location (an absolute
    path or an ``s3://`` URL).

    Returns:
        The marker's log version on rank 0, None elsewhere.

    Raises:
        CheckpointLocationError: the location is outside ``root``, inside a stream, or not
            a local path or ``s3://`` (nothing is written).
        IncompleteCheckpointError: on every rank, if the saved checkpoint is not whole (no
            marker is committed).
    """
    ds = _dataset_of(dataset)
    location = _locate(checkpoint_id, ds, root)
    fs = _storage(location, ds, storage_options)
    dcp.save({**state, key: dataset}, storage_writer=_Writer(location.uri, fs))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    _checked_on_rank_zero(lambda: _check_whole(_Reader(location.uri, fs), location.uri))
    hold = None
    if dataset is not ds:
        # The trainer process's dataset has not seen what its workers consumed (nor a base
        # they loaded): take both from the loader's state.
        hold = ds.load_loader_state(dataset.state_dict())
    version = ds.commit_checkpoint(checkpoint_id=location.uri, hold_offsets=hold)
    _SAVED.setdefault(ds, set()).add(location.uri.rstrip("/"))
    if version is not None and ds.options.keep_last is not None and root is not None:
        try:
            _prune(ds, root, fs)
        except Exception as e:  # rank 0 alone prunes: it must not leave the others waiting
            log.warning("keep_last: could not delete older checkpoints under %s: %s", root, e)
    return version


PRUNE_LOOKBACK = 4
"""How many of the markers just past ``keep_last`` a save looks at to delete their
checkpoints: the one this save pushed out, and a few a crash may have left (the cost of a
save stays bounded however many markers the group has)."""
_SAVED: weakref.WeakKeyDictionary[StreamDataset, set[str]] = weakref.WeakKeyDictionary()
"""The checkpoints each dataset saved in this process: the only ones its ``keep_last`` may
delete. A marker is a log entry any producer may commit, naming any checkpoint under the
root (one a user saved by hand, another run's): the log alone says nothing of who wrote
what a marker names."""
_GLOB = frozenset("*?[")
"""Characters a filesystem's ``rm`` would expand: a location holding one is never deleted."""


def _prune(ds: StreamDataset, root: str, fs: Any | None) -> None:
    """Deletes the checkpoints of the group's markers that ``keep_last`` no longer keeps
    (as ``save_total_limit`` does in other trainers): retention has reclaimed, or will
    reclaim, the data they resume at. Only a checkpoint this dataset saved in this process
    (``_SAVED``), in a folder under ``root`` (not ``root`` itself) that holds a DCP
    ``.metadata``, is deleted, and never one that holds, or lies in, a location a kept
    marker of this group, or any marker of another group, names."""
    group, keep = ds.group, ds.options.keep_last
    if group is None or keep is None:
        return
    streams = [source.uri for source in ds.sources]

    def place(marker: Marker) -> str | None:
        try:
            return check_location(marker.checkpoint_id or "", root, streams,
                                  marker=marker).uri.rstrip("/")
        except CheckpointLocationError:
            return None  # not under root: not this trainer's

    absolute = root if "://" in root else os.path.abspath(root)
    top = check_location(absolute, root, streams).uri.rstrip("/")
    saved = _SAVED.get(ds, set())
    candidates = [uri for marker in ds.streams[0].checkpoints(group)[:-keep][-PRUNE_LOOKBACK:]
                  if (uri := place(marker)) is not None and uri in saved and uri != top
                  and not _GLOB & set(uri)]
    if not candidates:  # the common case after a restart: nothing to read the markers for
        return
    kept: set[str] = set()
    for stream in ds.streams:
        for other in stream.groups:
            markers = stream.checkpoints(other)
            kept.update(p for m in (markers[-keep:] if other == group else markers)
                        if (p := place(m)) is not None)
    for uri in candidates:
        if any(k == uri or k.startswith(uri + "/") or uri.startswith(k + "/") for k in kept):
            continue
        if (fs is not None) == uri.startswith(("s3://", "s3a://")):  # as the new one is
            _delete_checkpoint(uri, fs)


def _delete_checkpoint(uri: str, fs: Any | None) -> None:
    """Deletes the DCP checkpoint at ``uri`` if it is one (it has a ``.metadata``), that
    file first: a half-deleted checkpoint never reads as whole."""
    if fs is None:
        if os.path.isfile(os.path.join(uri, METADATA)):
            os.unlink(os.path.join(uri, METADATA))
            shutil.rmtree(uri, ignore_errors=True)
            log.info("deleted checkpoint %s (keep_last)", uri)
        return
    if fs.exists(f"{uri}/{METADATA}"):
        fs.rm_file(f"{uri}/{METADATA}")
        fs.rm(uri, recursive=True)
        log.info("deleted checkpoint %s (keep_last)", uri)


def load_checkpoint(state: dict[str, Any], checkpoint: str | Marker, dataset: Any,
                    key: str = "data", *, root: str | None = None,
                    storage_options: dict[str, str] | None = None) -> None:
    """Loads what ``save_checkpoint`` saved into ``state`` (in place) and the dataset or
    loader (another world size is fine).

    ``checkpoint`` is a marker (``Stream.checkpoints(group)[-1]``: resuming after a
    restart), which needs ``root``, or a location the caller names. A marker's location is
    read from the stream's log, which every identity that may commit to the stream can
    write: it is data, never a command. It is opened only if it lies under ``root`` (the
    folder or ``s3://`` prefix this trainer keeps its checkpoints under), outside every
    stream the dataset reads, on a local path or ``s3://``; otherwise nothing is opened or
    connected to. The same holds for a location given with ``root``; one given without it
    is checked for its scheme and the streams only. Whatever the location, the checkpoint's
    ``.metadata`` is read admitting only torch's checkpoint metadata classes, and the
    state's values other than tensors with ``torch.load(weights_only=True)``, so a
    checkpoint's files run no code.

    Raises:
        CheckpointLocationError: the location fails those checks; for a marker the error
            names its group, step, log version and location.
        IncompleteCheckpointError: the checkpoint has no readable ``.metadata`` (or one
            naming anything but torch's checkpoint metadata), or a file it names is missing
            or short (a save that died midway).
        StreamMismatchError: the checkpoint was saved by a dataset over another stream.
        ValueError: a marker without ``root``.
    """
    ds = _dataset_of(dataset)
    location = _locate(checkpoint, ds, root)
    name = location.uri
    fs = _storage(location, ds, storage_options)
    saved = _check_whole(_Reader(location.uri, fs), name).state_dict_metadata
    template = dataset.state_dict()
    # DCP requires every key of the template: a dataset state saved by an earlier version
    # has fewer ("mix", "streams"), and the dataset takes what it finds.
    _drop_unsaved(template, key, saved)
    try:
        dcp.load({**state, key: template}, storage_reader=_Reader(location.uri, fs),
                 planner=SafeLoadPlanner(name))
    except CheckpointException as e:  # a value refused: raised as itself, on every rank
        refused = [f[0] for f in e.failures.values()
                   if isinstance(f[0], IncompleteCheckpointError)]
        if refused:
            raise refused[0] from None
        raise
    dataset.load_state_dict(template)


def _drop_unsaved(node: Any, fqn: str, saved: Any) -> None:
    """Removes from each ``StreamDataset`` state inside ``node`` (at DCP's key ``fqn``) the
    keys the checkpoint does not hold."""
    if isinstance(node, dict):
        if STATE_KEYS <= node.keys():
            for k in [k for k in node if f"{fqn}.{k}" not in saved]:
                del node[k]
            return
        for k, value in node.items():
            _drop_unsaved(value, f"{fqn}.{k}", saved)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _drop_unsaved(value, f"{fqn}.{i}", saved)


def _dataset_of(loader: Any) -> StreamDataset:
    if isinstance(loader, StreamDataset):
        return loader
    ds = getattr(loader, "dataset", None)
    if isinstance(ds, StreamDataset):
        return ds
    raise TypeError(f"expected a StreamDataset or a loader over one, got {type(loader).__name__}")
