"""The local-filesystem store: atomic create by hard link, atomic overwrite by rename, and
never a step through a symbolic link inside the stream's folder."""

from __future__ import annotations

import errno
import itertools
import os
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from lakestream.errors import (
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    StoreError,
)
from lakestream.store.base import Buffer, ObjectMeta, PutMode, check_key, too_large
from lakestream.store.hooks import observed, request
from lakestream.store.pool import read_file

TMP_PREFIX = ".tmp-"

_UNNAMED = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")
"""Linux: a create writes an unnamed file (``O_TMPFILE``) and links it into place."""
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW


def _chained(e: OSError) -> bool:
    """Whether the store's error keeps the file system's as its cause (a permission or an
    unexpected failure: the detail helps; a missing or existing object says all)."""
    return isinstance(e, PermissionError) or not isinstance(
        e, FileExistsError | FileNotFoundError | LinkError | NotAFileError) \
        and e.errno != errno.ELOOP


class LinkError(OSError):
    """A path inside the stream's folder is a symbolic link (or not a folder where one is
    needed): the store does not follow it."""


class NotAFileError(OSError):
    """A path where an object is read is not a regular file (a folder, a FIFO, a device):
    the store reads no such thing, and never waits on one."""


@observed
class LocalStore:
    """A directory as an object store.

    ``put(mode="create")`` writes the object in full before it gets its name, then links it
    into place, so it appears whole or not at all and a second create fails, even across
    processes. On Linux the file has no name until then (``O_TMPFILE``): a killed writer
    leaves nothing. Elsewhere, and for overwrites (renamed into place), it is a temp file
    whose name starts with ``.tmp-``; LIST skips those and gc removes them.

    Every object is reached from the root one folder at a time, each opened with
    ``O_NOFOLLOW``: a symbolic link anywhere under the root (``data/`` made a link to
    another folder, a fragment that is a link to a file elsewhere) is never followed, so
    nothing outside the root is read, written or deleted through the store (a link itself
    may be deleted). The root's own path may hold links: it is the operator's choice.
    """

    def __init__(self, root: str, *, fsync: bool = False) -> None:
        self.root = os.path.abspath(root)
        self.fsync = fsync
        self._unnamed = _UNNAMED
        self._tmp_prefix = f"{TMP_PREFIX}{uuid.uuid4().hex[:12]}"
        self._tmp_count = itertools.count()

    @property
    def uri(self) -> str:
        return self.root

    # -- reaching a folder without following links -----------------------------------------

    def _folder(self, parts: list[str], *, create: bool) -> int:
        """A descriptor of the folder ``parts`` under the root, opened one component at a
        time without following links (made on the way with ``create``).

        Raises:
            FileNotFoundError: a folder on the way is missing (and not ``create``).
            LinkError: a component is a link or not a folder.
        """
        if parts and not create:
            # The first folder from the root's path: the root's own components may be links
            # (the operator's choice), and this one is opened without following one, as
            # opening the root and then it would; a request for a log entry saves an open.
            try:
                fd = os.open(os.path.join(self.root, parts[0]), _DIR)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise LinkError(e.errno, f"{parts[0]} is a link or not a folder") from None
                raise
            parts = parts[1:]
        else:
            try:
                fd = os.open(self.root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            except FileNotFoundError:
                if not create:
                    raise
                os.makedirs(self.root, exist_ok=True)
                fd = os.open(self.root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            for part in parts:
                try:
                    child = os.open(part, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, dir_fd=fd)
                    except FileExistsError:
                        pass  # made by another writer meanwhile
                    child = os.open(part, _DIR, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise LinkError(e.errno, f"{part} is a link or not a folder") from None
                    raise
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextmanager
    def _at(self, key: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """The descriptor of ``key``'s folder and its name there."""
        *parts, name = check_key(key).split("/")
        fd = self._folder(parts, create=create)
        try:
            yield fd, name
        finally:
            os.close(fd)

    @contextmanager
    def _errors(self, doing: str, key: str) -> Iterator[None]:
        """Maps the file system's errors onto the store's: every one a LakestreamError."""
        try:
            yield
        except OSError as e:
            raise self._mapped(doing, key, e) from (e if _chained(e) else None)

    def _mapped(self, doing: str, key: str, e: OSError) -> Exception:
        """The store's error for the file system's ``e`` while ``doing`` ``key``."""
        where = f"{self.root}/{key}"
        if isinstance(e, FileExistsError):
            return AlreadyExistsError(f"{where} already exists")
        if isinstance(e, FileNotFoundError):
            return NotFoundError(f"{where} does not exist")
        if isinstance(e, LinkError):
            return StoreError(f"{doing} {where} refused: {e.strerror}; the local store follows "
                              "no links inside the stream's folder")
        if isinstance(e, NotAFileError):
            return StoreError(f"{doing} {where} refused: {e.strerror}; an object is a regular "
                              "file (remove what is there)")
        if isinstance(e, PermissionError):
            return PermissionDeniedError(f"{doing} {where}: {e}")
        if e.errno == errno.ELOOP:
            return StoreError(f"{doing} {where} refused: it is a symbolic link, which the "
                              "local store does not follow")
        return StoreError(f"{doing} {where} failed: {e}")

    # -- writing -----------------------------------------------------------------------

    def _write(self, fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view):]
        if self.fsync:
            os.fsync(fd)

    def _create_unnamed(self, dfd: int, name: str, data: bytes | memoryview) -> bool:
        """Writes ``data`` as an unnamed file in folder ``dfd`` and links it to ``name``;
        False if the file system cannot make unnamed files (nothing is written then)."""
        try:
            fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o644, dir_fd=dfd)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                self._unnamed = False
                return False
            raise
        try:
            self._write(fd, data)
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd, follow_symlinks=True)
        finally:
            os.close(fd)
        return True

    def _write_temp(self, dfd: int, data: bytes | memoryview) -> str:
        """Writes ``data`` to a new temp file in folder ``dfd``; returns its name."""
        tmp = f"{self._tmp_prefix}-{os.getpid()}-{next(self._tmp_count)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644, dir_fd=dfd)
        try:
            self._write(fd, data)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        return tmp

    @request("put")
    def put(self, key: str, data: bytes | memoryview, *, mode: PutMode = "overwrite") -> None:
        with self._errors("writing", key), self._at(key, create=True) as (dfd, name):
            if mode == "create" and self._unnamed and self._create_unnamed(dfd, name, data):
                return
            tmp = self._write_temp(dfd, data)
            try:
                if mode == "create":
                    os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                else:
                    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                    tmp = ""
            finally:
                if tmp:
                    os.unlink(tmp, dir_fd=dfd)

    # -- reading -----------------------------------------------------------------------

    def _open(self, dfd: int, name: str) -> tuple[int, int]:
        """A descriptor of the regular file ``name`` in folder ``dfd``, and its size. Opened
        without blocking: a FIFO (or a device) put where an object goes would otherwise
        block the reader until something writes to it.

        Raises:
            NotAFileError: ``name`` is a folder, a FIFO, a socket or a device.
        """
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK, dir_fd=dfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise NotAFileError(errno.EINVAL, f"{name} is not a regular file")
        return fd, st.st_size  # O_NONBLOCK changes nothing for a regular file's reads

    @staticmethod
    def _read(fd: int, start: int, n: int) -> bytes:
        """Up to ``n`` bytes from ``start``: plain reads, not a buffered file object, which
        doubled the cost of a small GET."""
        parts, at = [], start
        while n > 0:
            chunk = os.pread(fd, n, at)
            if not chunk:
                break
            parts.append(chunk)
            at += len(chunk)
            n -= len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _open_key(self, key: str) -> tuple[int, int]:
        """The file at ``key`` open for reading, and its size. Written out, not through
        ``_at`` and ``_errors``: the log reader's every entry is a GET, and the two context
        managers took a sixth of one.

        Raises:
            OSError: as ``_open``.
        """
        *parts, name = check_key(key).split("/")
        dfd = self._folder(parts, create=False)
        try:
            return self._open(dfd, name)
        finally:
            os.close(dfd)

    @request("get")
    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        try:
            fd, size = self._open_key(key)
            try:
                # Objects are whole once named (linked or renamed into place): the size is
                # theirs, and one past the bound is enough to refuse a larger one.
                data = self._read(fd, 0, size if max_bytes is None else min(size,
                                                                            max_bytes + 1))
            finally:
                os.close(fd)
        except OSError as e:
            raise self._mapped("reading", key, e) from (e if _chained(e) else None)
        return too_large(key, data, max_bytes)

    @request("get_buffer")
    def get_buffer(self, key: str, size: int) -> Buffer:
        """See ``ObjectStore.get_buffer``: read into a block of the process's buffer pool
        (``lakestream.store.pool``), whose pages are mapped already after the first reads,
        where a fresh ``bytes`` took a page fault each 4 KiB."""
        try:
            fd, found = self._open_key(key)
            try:
                if found != size:  # the caller's check names the difference
                    return self._read(fd, 0, min(found, size + 1))
                return read_file(fd, size)  # cut meanwhile: short, the caller refuses it
            finally:
                os.close(fd)
        except OSError as e:
            raise self._mapped("reading", key, e) from (e if _chained(e) else None)

    @request("get_range")
    def get_range(self, key: str, start: int, end: int) -> bytes:
        with self._errors("reading", key), self._at(key) as (dfd, name):
            fd, _ = self._open(dfd, name)
            try:
                return self._read(fd, start, max(0, end - start))
            finally:
                os.close(fd)

    @request("head")
    def head(self, key: str) -> ObjectMeta:
        with self._errors("reading", key), self._at(key) as (dfd, name):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                raise NotAFileError(errno.EINVAL, f"{name} is not a regular file")
        return ObjectMeta(key, st.st_size, st.st_mtime)

    @request("open_input")
    def open_input(self, key: str, size: int | None = None) -> BinaryIO:
        with self._errors("reading", key), self._at(key) as (dfd, name):
            return os.fdopen(self._open(dfd, name)[0], "rb")

    # -- listing and deleting ------------------------------------------------------------

    @request("list")
    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        return self._walk(prefix, temp=False)

    def list_temp(self, prefix: str) -> Iterator[ObjectMeta]:
        """Yields temp files a killed writer left under ``prefix`` (for gc)."""
        return self._walk(prefix, temp=True)

    def _walk(self, prefix: str, *, temp: bool) -> Iterator[ObjectMeta]:
        """The objects under ``prefix`` in key order (``temp``: the temp files instead). A
        file renamed or removed between listing its folder and reading its size (a
        concurrent overwrite's temp file, a concurrent delete) is skipped: LIST shows what
        was there when it was taken. Links are listed as what they are (objects the size of
        the link), never followed into.

        Raises:
            StoreError: a folder cannot be read, or a folder of ``prefix`` is a link.
        """
        parts = [p for p in prefix.split("/") if p]
        found: list[ObjectMeta] = []
        with self._errors("listing", prefix or "."):
            try:
                top = self._folder(parts, create=False)
            except FileNotFoundError:
                return iter(())
            def fail(e: OSError) -> None:
                if not isinstance(e, FileNotFoundError):  # a folder gone meanwhile: empty
                    raise e

            try:
                for folder, _dirs, files, dfd in os.fwalk(".", onerror=fail, dir_fd=top,
                                                          follow_symlinks=False):
                    rel = "/".join([*parts, *folder.split("/")[1:]])
                    rel = rel + "/" if rel else ""
                    for name in files:
                        if name.startswith(TMP_PREFIX) != temp:
                            continue
                        try:
                            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        found.append(ObjectMeta(rel + name, st.st_size, st.st_mtime))
            finally:
                os.close(top)
        found.sort(key=lambda m: m.key)
        return iter(found)

    @request("delete")
    def delete(self, key: str) -> None:
        """Deletes ``key`` (a link is deleted itself, never what it points at); deleting an
        absent key is not an error."""
        try:
            with self._errors("deleting", key), self._at(key) as (dfd, name):
                os.unlink(name, dir_fd=dfd)
        except NotFoundError:
            pass
