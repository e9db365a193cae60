"""The local-filesystem store: atomic create by hard link, atomic overwrite by rename."""

from __future__ import annotations

import errno
import itertools
import os
import uuid
from collections.abc import Iterator
from typing import BinaryIO

from lakestream.errors import AlreadyExistsError, NotFoundError, StoreError
from lakestream.store.base import ObjectMeta, PutMode, check_key

TMP_PREFIX = ".tmp-"


_UNNAMED = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")
"""Linux: a create writes an unnamed file (``O_TMPFILE``) and links it into place."""


class LocalStore:
    """A directory as an object store.

    ``put(mode="create")`` writes the object in full before it gets its name, then links it
    into place, so it appears whole or not at all and a second create fails, even across
    processes. On Linux the file has no name until then (``O_TMPFILE``): a killed writer
    leaves nothing. Elsewhere, and for overwrites (renamed into place), it is a temp file
    whose name starts with ``.tmp-``; LIST skips those and gc removes them.
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

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    def _write(self, fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view):]
        if self.fsync:
            os.fsync(fd)

    def _open_folder(self, folder: str) -> int:
        """A descriptor of ``folder``, created on first use (not checked on every put)."""
        try:
            return os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
            return os.open(folder, os.O_RDONLY | os.O_DIRECTORY)

    def _create_unnamed(self, path: str, data: bytes | memoryview) -> bool:
        """Writes ``data`` as an unnamed file in ``path``'s folder and links it to ``path``;
        False if the file system cannot make unnamed files (nothing is written then)."""
        folder, name = os.path.split(path)
        dfd = self._open_folder(folder)
        try:
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
        finally:
            os.close(dfd)
        return True

    def _write_temp(self, path: str, data: bytes | memoryview) -> str:
        folder = os.path.dirname(path)
        tmp = os.path.join(folder, f"{self._tmp_prefix}-{os.getpid()}-{next(self._tmp_count)}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            fd = os.open(tmp, flags, 0o644)
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
            fd = os.open(tmp, flags, 0o644)
        try:
            self._write(fd, data)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def _rel(self, folder: str) -> str:
        rel = os.path.relpath(folder, self.root).replace(os.sep, "/")
        return "" if rel == "." else rel + "/"

    def put(self, key: str, data: bytes | memoryview, *, mode: PutMode = "overwrite") -> None:
        path = self._path(key)
        try:
            if mode == "create" and self._unnamed and self._create_unnamed(path, data):
                return
            tmp = self._write_temp(path, data)
            try:
                if mode == "create":
                    os.link(tmp, path)
                else:
                    os.replace(tmp, path)
                    tmp = ""
            finally:
                if tmp:
                    os.unlink(tmp)
        except FileExistsError:
            raise AlreadyExistsError(f"{self.root}/{key} already exists") from None
        except OSError as e:
            raise StoreError(f"writing {self.root}/{key} failed: {e}") from e

    def get(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise NotFoundError(f"{self.root}/{key} does not exist") from None
        except OSError as e:
            raise StoreError(f"reading {self.root}/{key} failed: {e}") from e

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read(max(0, end - start))
        except FileNotFoundError:
            raise NotFoundError(f"{self.root}/{key} does not exist") from None

    def head(self, key: str) -> ObjectMeta:
        try:
            st = os.stat(self._path(key))
        except FileNotFoundError:
            raise NotFoundError(f"{self.root}/{key} does not exist") from None
        return ObjectMeta(key, st.st_size, st.st_mtime)

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        base = os.path.join(self.root, *[p for p in prefix.split("/") if p])
        found: list[ObjectMeta] = []
        for folder, _dirs, files in os.walk(base):
            rel = self._rel(folder)
            for name in files:
                if name.startswith(TMP_PREFIX):
                    continue
                try:
                    st = os.stat(os.path.join(folder, name))
                except FileNotFoundError:
                    continue
                found.append(ObjectMeta(rel + name, st.st_size, st.st_mtime))
        found.sort(key=lambda m: m.key)
        yield from found

    def list_temp(self, prefix: str) -> Iterator[ObjectMeta]:
        """Yields temp files a killed writer left under ``prefix`` (for gc)."""
        base = os.path.join(self.root, *[p for p in prefix.split("/") if p])
        for folder, _dirs, files in os.walk(base):
            rel = self._rel(folder)
            for name in files:
                if name.startswith(TMP_PREFIX):
                    st = os.stat(os.path.join(folder, name))
                    yield ObjectMeta(rel + name, st.st_size, st.st_mtime)

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def open_input(self, key: str, size: int | None = None) -> BinaryIO:
        try:
            return open(self._path(key), "rb")
        except FileNotFoundError:
            raise NotFoundError(f"{self.root}/{key} does not exist") from None
