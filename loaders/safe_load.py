"""Reading a DCP checkpoint's files as data: its ``.metadata`` admits only torch's checkpoint
metadata classes, and its values other than tensors load with ``weights_only=True``."""

from __future__ import annotations

import io
import pathlib
import pickle
import re
from typing import IO, Any

import torch
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import ReadItem

from lakestream.errors import IncompleteCheckpointError

_METADATA_CLASSES: dict[tuple[str, str], Any] = {
    (cls.__module__, cls.__qualname__): cls for cls in (
        dcp_metadata.Metadata, dcp_metadata.MetadataIndex, dcp_metadata.StorageMeta,
        dcp_metadata.TensorStorageMetadata, dcp_metadata.BytesStorageMetadata,
        dcp_metadata.ChunkStorageMetadata, dcp_metadata.TensorProperties,
        dcp_metadata._MEM_FORMAT_ENCODING, _StorageInfo, torch.Size,
        pathlib.PosixPath, pathlib.PurePosixPath)}
"""What a DCP ``.metadata`` pickle may name, besides torch's dtypes and layouts: the
classes of torch's checkpoint metadata and the values they hold (a ``StorageMeta`` holds
the checkpoint's path)."""

_FILE_NAME = re.compile(r"[A-Za-z0-9_.-]+")
"""The files a checkpoint's metadata may name (DCP's are ``__<rank>_<n>.distcp``)."""


class _MetadataUnpickler(pickle.Unpickler):
    """Admits only torch's checkpoint metadata classes. DCP's own reader unpickles
    ``.metadata`` with ``pickle.load``, which calls whatever the file names: the file lies
    wherever the checkpoint does, so it is read as data, not as code."""

    def find_class(self, module: str, name: str) -> Any:
        found = _METADATA_CLASSES.get((module, name))
        if found is not None:
            return found
        value = getattr(torch, name, None) if module == "torch" else None
        if isinstance(value, (torch.dtype, torch.layout)):
            return value
        if (module, name) == ("torch.serialization", "_get_layout"):  # a layout by its name
            return torch.serialization._get_layout
        raise pickle.UnpicklingError(
            f"it names {module}.{name}, which is not a class of torch's checkpoint metadata "
            "(refused: nothing it names was run)")


def read_metadata(stream: IO[bytes]) -> Metadata:
    """The DCP ``Metadata`` in ``stream``, read admitting only torch's checkpoint metadata
    classes; every file it names is a plain name in the checkpoint's folder.

    Raises:
        pickle.UnpicklingError: it names anything else, or holds no ``Metadata``.
    """
    metadata = _MetadataUnpickler(stream).load()
    if type(metadata) is not Metadata:
        raise pickle.UnpicklingError(f"it holds a {type(metadata).__name__}, not DCP's Metadata")
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not _FILE_NAME.fullmatch(name) or name in (".", ".."):
            raise pickle.UnpicklingError(f"it names the file {name!r}, not a plain file name in "
                                         "the checkpoint's folder")
    return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, loading the state's values other than tensors with
    ``torch.load(weights_only=True)``: DCP's own loads them without that restriction,
    which runs what the file names. Plain Python values, tensors and the classes given to
    ``torch.serialization.add_safe_globals`` load; anything else is refused."""

    def __init__(self, checkpoint_id: str) -> None:
        super().__init__()
        self.checkpoint_id = checkpoint_id

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Loads one value other than a tensor.

        Raises:
            IncompleteCheckpointError: it names anything but plain values and tensors.
        """
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            why = next((line.strip() for line in str(e).splitlines() if "GLOBAL" in line),
                       "it is not plain values and tensors")
            raise IncompleteCheckpointError(
                f"checkpoint {self.checkpoint_id}: the value of {read_item.dest_index.fqn} "
                f"was refused ({why}), and nothing it names was run; resume from an earlier "
                "checkpoint marker (Stream.checkpoints(group)), or register a class of your "
                "own with torch.serialization.add_safe_globals") from None
        # Handed on as DCP's planner takes it, saved again from the values that loaded.
        again = io.BytesIO()
        torch.save(loaded, again)
        again.seek(0)
        super().load_bytes(read_item, again)
