"""Memory a reader fills again and again: blocks of a size, handed out as numpy arrays and
taken back when the last user of an array lets it go, so that a batch's bytes land in memory
that is already mapped rather than in fresh pages (on this machine's VM the kernel took 3.9 µs
to fault in each 4 KiB page: about a CPU-second per GB delivered, more than the copy)."""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections import defaultdict

import numpy as np

MAX_POOLED_BYTES = 1 << 30
"""Free blocks a pool keeps, in all; past it a returned block is let go."""


class BufferPool:
    """Blocks of memory by size. ``array(n)`` is a writable uint8 array of ``n`` bytes on a
    block of the pool: the block returns to the pool when that array (and everything made
    from it, a tensor by ``torch.from_numpy`` included) is gone. New blocks are mapped with
    huge pages where the kernel allows (``MADV_HUGEPAGE``). Thread-safe."""

    def __init__(self, max_bytes: int = MAX_POOLED_BYTES) -> None:
        self._free: defaultdict[int, list[mmap.mmap]] = defaultdict(list)
        self._bytes = 0
        self._max = max_bytes
        self._lock = threading.Lock()

    def array(self, nbytes: int) -> np.ndarray:
        """A uint8 array of ``nbytes`` bytes (its content is whatever the block held)."""
        size = max(mmap.PAGESIZE, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
        with self._lock:
            free = self._free[size]
            block = free.pop() if free else None
            if block is not None:
                self._bytes -= size
        if block is None:
            # Private: an anonymous mapping is shared by default, and a forked DataLoader
            # worker would then fill the very pages its parent's pool hands out.
            block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                block.madvise(mmap.MADV_HUGEPAGE)
        out = np.frombuffer(block, np.uint8, nbytes)
        weakref.finalize(out, self._give_back, size, block)
        return out

    def _give_back(self, size: int, block: mmap.mmap) -> None:
        with self._lock:
            if self._bytes + size <= self._max:
                self._free[size].append(block)
                self._bytes += size
        # Past the bound the block is let go, not closed: the dying array's export of it
        # ends after this callback, and the mapping goes with the last reference.


_POOL = BufferPool()


def buffer_pool() -> BufferPool:
    """The process's pool (what every reader of the process fills)."""
    return _POOL


def whole_pages(data: object, nbytes: int) -> memoryview | None:
    """``nbytes`` bytes of memory from ``data``'s first byte, where ``data`` is a contiguous
    array starting at a page of a mapped block (a pool's, or any other ``mmap``) that holds
    that many from there: what a direct write of ``data`` moves (whole pages, the last one
    past its end) without a copy into an aligned block first. None for anything else."""
    if not isinstance(data, np.ndarray) or not data.flags.c_contiguous:
        return None
    base = data.base
    while isinstance(base, np.ndarray):
        base = base.base
    if not isinstance(base, memoryview) or not isinstance(base.obj, mmap.mmap) \
            or not base.c_contiguous:
        return None
    block = base.cast("B") if base.format != "B" else base
    at = data.ctypes.data - np.frombuffer(block, np.uint8).ctypes.data
    if data.ctypes.data % mmap.PAGESIZE or at < 0 or at + nbytes > block.nbytes:
        return None
    return block[at:at + nbytes]


def read_file(fd: int, size: int, block: int = 0) -> np.ndarray | bytes:
    """The first ``size`` bytes of the open file ``fd``, read (``preadv``) into a block of
    the process's pool of ``block`` bytes (at least ``size``: a direct read moves whole
    pages); fewer, as ``bytes``, if the file ends sooner."""
    out = buffer_pool().array(max(size, block))
    view = memoryview(out)  # type: ignore[arg-type]
    at = 0
    while at < size:
        n = os.preadv(fd, [view[at:]], at)
        if n == 0:
            return bytes(view[:at])
        at += n
    return out if len(out) == size else out[:size]
