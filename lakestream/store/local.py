"""The local-filesystem store: atomic create by hard link, atomic overwrite by rename."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import BinaryIO

from lakestream.errors import AlreadyExistsError, NotFoundError, StoreError
from lakestream.store.base import ObjectMeta, PutMode, check_key

TMP_PREFIX = ".tmp-"


class LocalStore:
    """A directory as an object store.

    ``put(mode="create")`` writes a temp file and hard-links it into place, so the object
    appears whole or not at all and a second create fails, even across processes. Temp files
    left by a killed writer start with ``.tmp-``; LIST skips them and gc removes them.
    """

    def __init__(self, root: str, *, fsync: bool = False) -> None:
        self.root = os.path.abspath(root)
        self.fsync = fsync

    @property
    def uri(self) -> str:
        return self.root

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    def _write_temp(self, path: str, data: bytes) -> str:
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        with open(tmp, "wb") as f:
            f.write(data)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        return tmp

    def _rel(self, folder: str) -> str:
        rel = os.path.relpath(folder, self.root).replace(os.sep, "/")
        return "" if rel == "." else rel + "/"

    def put(self, key: str, data: bytes, *, mode: PutMode = "overwrite") -> None:
        path = self._path(key)
        try:
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
