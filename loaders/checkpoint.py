"""Saving a training checkpoint and its marker in one call, on a local path or an object
store, and refusing to resume from a checkpoint that is not whole."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as _FsspecFileSystem
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata

from lakestream.errors import IncompleteCheckpointError
from lakestream.failpoints import failpoint
from lakestream.loaders.dataset import StreamDataset
from lakestream.store import open_filesystem

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


def _storage(checkpoint_id: str, dataset: StreamDataset,
             storage_options: dict[str, str] | None) -> tuple[str, Any | None]:
    """The checkpoint's location and filesystem (None: a local path). Without
    ``storage_options`` a checkpoint on the stream's kind of store uses the stream's."""
    if not isinstance(checkpoint_id, str) or not checkpoint_id:
        raise ValueError(f"checkpoint_id must be a non-empty str, got {checkpoint_id!r}")
    if checkpoint_id.startswith("file://"):
        return checkpoint_id[len("file://"):], None
    if "://" not in checkpoint_id:
        return checkpoint_id, None
    scheme, rest = checkpoint_id.split("://", 1)
    scheme = "s3" if scheme == "s3a" else scheme
    stream_scheme = dataset.uri.split("://", 1)[0] if "://" in dataset.uri else "file"
    if storage_options is None and stream_scheme.replace("s3a", "s3") == scheme:
        storage_options = dataset.storage_options
    path = f"{scheme}://{rest}".rstrip("/")
    return path, open_filesystem(path, storage_options)


def _check_whole(reader: _Reader, checkpoint_id: str) -> Metadata:
    """Reads the checkpoint's ``.metadata`` and checks that every file it names holds the
    bytes it lists (a writer that dropped a shard, or a save that died, fails here).

    Raises:
        IncompleteCheckpointError: naming what is missing.
    """
    fs = reader.fs
    if not fs.exists(fs.concat_path(reader.path, METADATA)):
        raise IncompleteCheckpointError(
            f"checkpoint {checkpoint_id} has no {METADATA}: its save did not finish (or its "
            "writer dropped it); resume from an earlier checkpoint marker "
            "(Stream.checkpoints(group))")
    try:
        metadata = reader.read_metadata()
    except Exception as e:  # a truncated or garbled pickle
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
                    key: str = "data", *,
                    storage_options: dict[str, str] | None = None) -> int | None:
    """Saves ``state`` plus the loader's state (under ``key``) with
    ``torch.distributed.checkpoint``, checks it is whole, then commits the checkpoint marker.

    Collective: call it on every rank. ``checkpoint_id`` is a local path or a URL:
    ``s3://bucket/prefix`` uses the stream's ``storage_options`` when the stream is on S3
    too (or the ones given); any other scheme goes to its fsspec filesystem with the
    ``storage_options`` given. ``dataset`` is the ``StreamDataset``, or the loader over it
    (a ``StreamLoader``, or torchdata's ``StatefulDataLoader``, whose state holds its
    workers' positions): its state is saved, and the marker resumes where it does.

    The marker is committed only once every rank's save has returned and rank 0 has read the
    checkpoint's ``.metadata`` back and found every file it names whole; so a marker always
    names a checkpoint that loads.

    Returns:
        The marker's log version on rank 0, None elsewhere.

    Raises:
        IncompleteCheckpointError: on every rank, if the saved checkpoint is not whole (no
            marker is committed).
    """
    ds = _dataset_of(dataset)
    path, fs = _storage(checkpoint_id, ds, storage_options)
    dcp.save({**state, key: dataset}, storage_writer=_Writer(path, fs))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    _checked_on_rank_zero(lambda: _check_whole(_Reader(path, fs), checkpoint_id))
    hold = None
    if dataset is not ds:
        # The trainer process's dataset has not seen what its workers consumed (nor a base
        # they loaded): take both from the loader's state.
        hold = ds.load_loader_state(dataset.state_dict())
    return ds.commit_checkpoint(checkpoint_id=checkpoint_id, hold_offsets=hold)


def load_checkpoint(state: dict[str, Any], checkpoint_id: str, dataset: Any,
                    key: str = "data", *,
                    storage_options: dict[str, str] | None = None) -> None:
    """Loads what ``save_checkpoint`` saved into ``state`` (in place) and the dataset or
    loader (another world size is fine).

    Raises:
        IncompleteCheckpointError: the checkpoint has no readable ``.metadata``, or a file
            it names is missing or short (a save that died midway).
    """
    path, fs = _storage(checkpoint_id, _dataset_of(dataset), storage_options)
    saved = _check_whole(_Reader(path, fs), checkpoint_id).state_dict_metadata
    if isinstance(dataset, StreamDataset):
        # DCP requires every key of the template: one saved by an earlier version has
        # fewer (no "mix"), and the dataset takes what it finds.
        template = {k: v for k, v in dataset.state_dict().items() if f"{key}.{k}" in saved}
        dcp.load({**state, key: template}, storage_reader=_Reader(path, fs))
        dataset.load_state_dict(template)
    else:
        dcp.load({**state, key: dataset}, storage_reader=_Reader(path, fs))


def _dataset_of(loader: Any) -> StreamDataset:
    if isinstance(loader, StreamDataset):
        return loader
    ds = getattr(loader, "dataset", None)
    if isinstance(ds, StreamDataset):
        return ds
    raise TypeError(f"expected a StreamDataset or a loader over one, got {type(loader).__name__}")
