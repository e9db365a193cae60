"""Where a training checkpoint may be opened: under the trainer's checkpoint root, outside
every stream it reads, on a local path or ``s3://``; checked before anything is opened."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from lakestream.errors import LakestreamError
from lakestream.reading import Marker


class CheckpointLocationError(LakestreamError, ValueError):
    """A checkpoint location this trainer does not open: outside its checkpoint root, inside
    a stream it reads (where producers write), on a scheme other than a local path or
    ``s3://``, or not a plain path. Raised before anything is opened or connected to."""


@dataclass(frozen=True)
class Location:
    """A checked checkpoint location: what is opened, and what its marker records."""

    uri: str
    """An absolute local path (symlinks resolved), or ``s3://bucket/key``."""
    remote: bool
    """On S3 (else a local path)."""


@dataclass(frozen=True)
class _Place:
    """A parsed location: a resolved local path, or an S3 bucket and key."""

    path: str
    bucket: str | None = None

    def holds(self, other: _Place) -> bool:
        """Whether ``other`` is this place or inside it."""
        if self.bucket != other.bucket:
            return False
        if self.bucket is None:
            return os.path.commonpath([self.path, other.path]) == self.path
        return not self.path or other.path == self.path \
            or other.path.startswith(self.path + "/")

    def __str__(self) -> str:
        return self.path if self.bucket is None else f"s3://{self.bucket}/{self.path}".rstrip("/")


def describe(marker: Marker) -> str:
    """How an error names a marker: its group, step, log version and location."""
    return (f"the checkpoint marker of group {marker.group!r} at step {marker.step} (log "
            f"version {marker.version}), checkpoint_id {marker.checkpoint_id!r},")


def _relative(root: str | None) -> str:
    """What to say of a root given relative: the usual reason a trainer's own checkpoint lies
    outside it is that it was saved from another working directory."""
    if root is None or "://" in root or os.path.isabs(root):
        return ""
    return (f" (the root {root!r} is relative, taken from the working directory "
            f"{os.getcwd()}: a checkpoint saved from another one lies elsewhere; give the "
            "root as an absolute path or s3:// prefix, the same in every run)")


def check_location(checkpoint_id: str, root: str | None, streams: Sequence[str], *,
                   marker: Marker | None = None) -> Location:
    """Checks a checkpoint location, before anything is opened.

    A relative ``checkpoint_id`` is taken under ``root`` (without a root, under the working
    directory); an absolute one, or a URL, must lie under ``root`` once normalised (``..``
    folded, a local path's symlinks resolved). Without a root (a location the caller's code
    names itself) only the scheme and the streams are checked. Whatever the root, only a
    local path (``file://`` too) or ``s3://`` is taken, never one inside a stream of
    ``streams``, and an S3 key must have no empty, ``.`` or ``..`` segment.

    Args:
        checkpoint_id: the location, as given or as a marker records it.
        root: the folder or ``s3://`` prefix under which this trainer keeps its checkpoints.
        streams: the URIs of the streams the dataset reads.
        marker: the marker ``checkpoint_id`` was read from, named by the error.

    Raises:
        CheckpointLocationError: naming the location (and the marker) and what to do.
    """
    what = describe(marker) if marker is not None else f"checkpoint location {checkpoint_id!r}"
    todo = ("pass the root its checkpoints were saved under, or resume from an earlier "
            "marker (Stream.checkpoints(group)) or start afresh; if no trainer of yours saved "
            "it there, find out who committed this marker: any identity that may write the "
            "stream's log can commit one" if marker is not None else
            "save and load checkpoints under the trainer's checkpoint root (root=), a folder "
            "or s3:// prefix that only trainers write, outside every stream")

    def refuse(why: str) -> CheckpointLocationError:
        return CheckpointLocationError(f"{what} {why}; nothing was opened: {todo}")

    base: _Place | None = None
    if root is not None:
        try:
            base = _parse(root, None)
        except _Refused as e:
            raise CheckpointLocationError(
                f"checkpoint root {root!r} {e}: pass a local folder or an s3:// prefix") from None
        for uri in streams:
            stream = _parse(uri, None)
            if stream.holds(base):
                raise CheckpointLocationError(
                    f"checkpoint root {root!r} is inside the stream {uri}, where its producers "
                    "write: put the trainer's checkpoints where only trainers write")
    try:
        place = _parse(checkpoint_id, base)
    except _Refused as e:
        raise refuse(str(e)) from None
    for uri in streams:
        if _parse(uri, None).holds(place):
            raise refuse(f"is inside the stream {uri}, where its producers write")
    if base is not None and not base.holds(place):
        raise refuse(f"is outside the checkpoint root {base}{_relative(root)}")
    return Location(str(place), place.bucket is not None)


class _Refused(Exception):
    """Why a location cannot be parsed (the caller says whose it is)."""


def _parse(location: str, base: _Place | None) -> _Place:
    """The place ``location`` names, relative ones under ``base`` (or the working
    directory)."""
    if not isinstance(location, str) or not location:
        raise _Refused("is not a non-empty str")
    if "\x00" in location:
        raise _Refused("holds a NUL character")
    scheme, sep, rest = location.partition("://")
    if not sep and base is not None and base.bucket is not None \
            and not location.startswith("/"):  # relative to an S3 root
        scheme, sep, rest = "s3", "://", f"{base}/{location}"[len("s3://"):]
    if not sep:
        return _Place(_local(location, base))
    if scheme == "file":
        if not rest.startswith("/"):
            raise _Refused("names a host (file://HOST/...); use file:///path or a plain path")
        return _Place(_local(rest, None))
    if scheme not in ("s3", "s3a"):
        raise _Refused(f"uses the scheme {scheme}://, and checkpoints are read and written "
                       "only on a local path or s3://")
    bucket, _, key = rest.partition("/")
    key = key.rstrip("/")
    if not bucket or (key and any(s in ("", ".", "..") for s in key.split("/"))):
        raise _Refused("is not a plain s3://bucket/key (no empty, '.' or '..' segment)")
    return _Place(key, bucket)


def _local(path: str, base: _Place | None) -> str:
    """An absolute local path, symlinks resolved (``..`` too): a relative one under a local
    ``base``, else under the working directory."""
    if base is not None and base.bucket is None:
        path = os.path.join(base.path, path)
    return os.path.realpath(path)
