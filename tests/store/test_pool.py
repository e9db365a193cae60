"""The buffer pool a reader fills: a block comes back only once nothing made from it lives,
a forked worker's pool is its own, the pool keeps no more than its bound, and an array at the
start of a block extends to the pages behind it (what a direct write moves)."""

from __future__ import annotations

import gc
import mmap
import os

import numpy as np
import torch

from lakestream.store.pool import BufferPool, whole_pages


def test_a_block_is_handed_out_again_only_once_every_view_of_it_is_gone() -> None:
    pool = BufferPool()
    a = pool.array(10_000)
    where = a.ctypes.data
    tensor = torch.from_numpy(a[100:200])
    del a
    gc.collect()
    b = pool.array(10_000)  # the tensor still holds the first block
    assert b.ctypes.data != where
    del tensor
    gc.collect()
    c = pool.array(10_000)
    assert c.ctypes.data == where and len(c) == 10_000
    assert b.flags.writeable and c.flags.writeable


def test_a_forked_worker_fills_its_own_blocks_not_its_parents() -> None:
    """A DataLoader worker forked from a reader inherits its pool: the blocks must be private
    copies, or the worker's reads land in the memory the parent's next batch is read into."""
    pool = BufferPool()
    a = pool.array(1 << 16)
    a[:] = 1
    where = a.ctypes.data
    del a
    gc.collect()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            pool.array(1 << 16)[:] = 7
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    again = pool.array(1 << 16)
    assert again.ctypes.data == where
    assert (again == 1).all()


def test_the_pool_keeps_no_more_free_bytes_than_its_bound() -> None:
    pool = BufferPool(max_bytes=3 << 12)
    blocks = [pool.array(1 << 12) for _ in range(5)]
    for b in blocks:
        b[:] = 9  # a fresh block is the kernel's zeros; a kept one still says 9
    del blocks, b
    gc.collect()
    again = [pool.array(1 << 12) for _ in range(5)]
    assert sorted(int(b[0]) for b in again) == [0, 0, 9, 9, 9]


def test_whole_pages_extends_an_array_at_the_start_of_a_block_to_what_the_block_holds() -> None:
    page = mmap.PAGESIZE
    pool = BufferPool()
    block = pool.array(3 * page + 1)  # four pages
    data = block[:page + 100]
    view = whole_pages(data, 2 * page)
    assert view is not None and view.nbytes == 2 * page
    assert np.frombuffer(view, np.uint8).ctypes.data == data.ctypes.data  # the same memory
    assert whole_pages(data, 4 * page) is not None
    assert whole_pages(data, 4 * page + 1) is None  # past the block
    assert whole_pages(block[1:page], page) is None  # not at a page
    assert whole_pages(np.zeros(page + 100, np.uint8), 2 * page) is None  # not a mapped block
    assert whole_pages(block[::2], page) is None  # not contiguous
    assert whole_pages(bytes(page + 100), 2 * page) is None
    words = mmap.mmap(-1, 4 * page)  # a view of it by 4-byte items: counted in bytes all the same
    ints = np.frombuffer(memoryview(words).cast("I"), np.uint32)
    assert whole_pages(ints[page // 4:], 3 * page).nbytes == 3 * page  # type: ignore[union-attr]
    assert whole_pages(ints[page // 4:], 3 * page + 1) is None
    del ints
