"""Images, audio and tensors through the loader: tensor columns collate into one contiguous
``[n, *shape]`` tensor, binary columns into bytes and offsets, a ``transform`` runs in the read
threads, read threads follow the host's cores, and pinning is refused without CUDA."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

import lakestream
from lakestream import CorruptLogError, tensor_field
from lakestream.loaders import StreamDataset, StreamLoader, collate_table
from lakestream.loaders.host import default_prefetch, default_read_threads
from lakestream.producers import Producer
from tests.helpers import SCHEMA, rows

SHAPE = (6, 7, 3)


def _table(n: int, *, dtype: str = "uint8", nullable: bool = False) -> tuple[pa.Table, Any]:
    spec_dtype = np.dtype("uint16" if dtype == "bfloat16" else dtype)
    values = np.arange(n * int(np.prod(SHAPE)), dtype=np.int64).astype(spec_dtype).reshape(
        n, *SHAPE)
    field = tensor_field("x", SHAPE, dtype, nullable=nullable)
    col = pa.array([v.tobytes() for v in values], pa.binary())
    return pa.Table.from_arrays([col], schema=pa.schema([field])), values


@pytest.mark.parametrize("dtype", ["uint8", "int16", "float32", "float64", "bool"])
@pytest.mark.parametrize("shared", [False, True])
def test_a_tensor_column_collates_to_one_contiguous_tensor(dtype: str, shared: bool) -> None:
    table, values = _table(5, dtype=dtype)
    out = collate_table(table, shared=shared)["x"]
    assert out.shape == (5, *SHAPE) and out.is_contiguous() and out.is_shared() == shared
    assert out.dtype == torch.from_numpy(values).dtype
    assert np.array_equal(out.numpy(), values)


def test_bfloat16_tensors_keep_their_bits() -> None:
    table, values = _table(2, dtype="bfloat16")
    out = collate_table(table)["x"]
    assert out.dtype == torch.bfloat16
    assert np.array_equal(out.view(torch.int16).numpy().view(np.uint16), values)


def test_tensor_rows_from_many_sliced_chunks_and_nulls_come_back_in_order() -> None:
    table, values = _table(9, nullable=True)
    col = table.column("x").chunk(0)
    nulled = pa.array([None if i in (2, 7) else v for i, v in enumerate(col.to_pylist())],
                      pa.binary())
    chunks = [nulled.slice(0, 4), nulled.slice(4, 1), nulled.slice(5, 4)]
    table = pa.Table.from_arrays([pa.chunked_array(chunks)], schema=table.schema)
    out = collate_table(table, "packed")["x"].numpy()
    expected = values.copy()
    expected[[2, 7]] = 0
    assert np.array_equal(out, expected)


def test_a_tensor_value_of_the_wrong_length_is_corrupt_not_misread() -> None:
    table, _ = _table(2)
    bad = pa.Table.from_arrays([pa.array([b"\x00" * 3, b"\x00" * 3])], schema=table.schema)
    with pytest.raises(CorruptLogError, match="column x holds a value of 3 bytes"):
        collate_table(bad)


def test_an_empty_value_that_is_not_null_is_corrupt_not_zeros() -> None:
    """A null row is zeros; a present value of no bytes (a writer that went around the
    producer's checks) is damage, also beside nulls in the same chunk."""
    table, values = _table(3, nullable=True)
    bad = pa.Table.from_arrays([pa.array([values[0].tobytes(), None, b""], pa.binary())],
                               schema=table.schema)
    with pytest.raises(CorruptLogError, match="column x holds a value of 0 bytes at row 2"):
        collate_table(bad)


@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_a_binary_column_collates_to_bytes_and_offsets(mode: str) -> None:
    blobs = [b"ab", None, b"", b"\x00\xff\x10", b"z" * 300]
    arr = pa.array(blobs, pa.binary())
    table = pa.table({"b": pa.chunked_array([arr.slice(0, 2), arr.slice(2, 3)])})
    out = collate_table(table, mode)
    data, offsets = out["b"].numpy().tobytes(), out["b_offsets"].tolist()
    assert out["b"].dtype == torch.uint8 and out["b_offsets"].dtype == torch.int64
    got = [data[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    assert got == [b or b"" for b in blobs]


def _image_stream(tmp_path: Path, n: int = 32, batch: int = 8) -> tuple[str, np.ndarray]:
    schema = pa.schema([tensor_field("image", SHAPE), pa.field("label", pa.int64()),
                        pa.field("jpeg", pa.binary())])
    uri = str(tmp_path / "images")
    lakestream.create(uri, schema, global_batch_size=batch, group_size=1)
    images = np.random.default_rng(1).integers(0, 256, (n, *SHAPE), dtype=np.uint8)
    with Producer(uri, producer_id="p") as p:
        for at in range(0, n, 8):
            p.write({"image": images[at:at + 8], "label": np.arange(at, at + 8),
                     "jpeg": [bytes([i]) * (i % 5) for i in range(at, at + 8)]})
    return uri, images


def _decode(batch: dict[str, Any]) -> dict[str, Any]:
    """A transform at a module's top level (workers find it by name)."""
    batch["thread"] = threading.current_thread().name
    batch["mean"] = batch["image"].float().mean(dim=(1, 2, 3))
    return batch


def test_a_transform_runs_in_the_read_threads_on_each_rank_slice(tmp_path: Path) -> None:
    uri, images = _image_stream(tmp_path)
    ds = StreamDataset(uri, group=None, rank=1, world_size=2, max_steps=4, transform=_decode)
    seen = list(ds)
    assert [b["step"] for b in seen] == [0, 1, 2, 3]
    for b in seen:
        assert b["thread"].startswith("lakestream-read")
        want = images[b["step"] * 8 + 4:b["step"] * 8 + 8]
        assert np.array_equal(b["image"].numpy(), want)
        assert torch.allclose(b["mean"], torch.from_numpy(want).float().mean(dim=(1, 2, 3)))
        assert b["label"].tolist() == list(range(b["step"] * 8 + 4, b["step"] * 8 + 8))


def test_a_transform_runs_in_dataloader_workers(tmp_path: Path) -> None:
    uri, images = _image_stream(tmp_path)
    ds = StreamDataset(uri, group=None, max_steps=4, transform=_decode)
    got = list(StreamLoader(ds, num_workers=2))
    assert [b["step"] for b in got] == [0, 1, 2, 3]
    assert all(np.array_equal(b["image"].numpy(), images[b["step"] * 8:b["step"] * 8 + 8])
               for b in got)


def test_a_transform_that_is_not_callable_is_refused(tmp_path: Path) -> None:
    uri, _ = _image_stream(tmp_path)
    with pytest.raises(TypeError, match="transform must be a callable"):
        StreamDataset(uri, group=None, transform="decode")  # type: ignore[arg-type]


def test_read_threads_follow_the_cores_and_the_ranks_sharing_them(monkeypatch) -> None:
    monkeypatch.setattr("lakestream.loaders.host.usable_cores", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert default_read_threads() == 8  # past 8, more threads read less (MAX_READ_THREADS)
    assert default_read_threads(workers=4) == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert default_read_threads() == 1
    monkeypatch.setattr("lakestream.loaders.host.usable_cores", lambda: 96)
    assert default_read_threads() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert default_read_threads() == 5
    monkeypatch.setattr("lakestream.loaders.host.usable_cores", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert default_read_threads() == 1  # the other core runs the training loop
    assert default_prefetch(15) == 17


def test_the_reader_uses_the_host_derived_threads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("lakestream.loaders.host.usable_cores", lambda: 7)
    uri, _ = _image_stream(tmp_path)
    ds = StreamDataset(uri, group=None, max_steps=1)
    list(ds)
    assert ds.last_reader is not None
    assert (ds.last_reader.threads, ds.last_reader.prefetch) == (6, 8)


def test_read_threads_past_the_cores_wait_rather_than_compete(tmp_path: Path,
                                                              monkeypatch) -> None:
    """Six read threads on a rank whose share is 3 cores (one for the training loop): at
    most 2 read, collate and transform at once, and every step still comes, in order."""
    monkeypatch.setattr("lakestream.loaders.host.usable_cores", lambda: 3)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    uri, images = _image_stream(tmp_path, n=96)
    now, most, lock = [0], [0], threading.Lock()

    def busy(batch: dict[str, Any]) -> dict[str, Any]:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.03)
        with lock:
            now[0] -= 1
        return batch

    ds = StreamDataset(uri, group=None, read_threads=6, transform=busy, max_steps=12)
    got = list(ds)
    assert [b["step"] for b in got] == list(range(12))
    assert all(np.array_equal(b["image"].numpy(), images[b["step"] * 8:b["step"] * 8 + 8])
               for b in got)
    assert most[0] == 2, most[0]  # the slots were used together, never more of them


def test_reads_that_wait_on_a_local_store_run_in_the_waiting_threads(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """A local stream whose fragment reads each take 30 ms more (a slow mount, a proxy) on
    a 2-core host: the reader measures its step reads waiting and reads several steps at
    once, and they still come in order. Before, one read thread read the steps (one
    fragment each) one after another, each paying the whole wait."""
    from lakestream.log.keys import DATA_DIR
    from lakestream.store import Request, add_request_hook

    monkeypatch.setattr("lakestream.loaders.host.usable_cores", lambda: 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    uri, images = _image_stream(tmp_path, n=96)
    now, most, lock = [0], [0], threading.Lock()
    names: set[str] = set()

    def slow(request: Request) -> None:
        if request.key.startswith(DATA_DIR):
            with lock:
                now[0] += 1
                most[0] = max(most[0], now[0])
                names.add(threading.current_thread().name)
            time.sleep(0.03)
            with lock:
                now[0] -= 1

    remove = add_request_hook(slow)
    try:
        ds = StreamDataset(uri, group=None, max_steps=12)
        got = list(ds)
    finally:
        remove()
    assert [b["step"] for b in got] == list(range(12))
    assert all(np.array_equal(b["image"].numpy(), images[b["step"] * 8:b["step"] * 8 + 8])
               for b in got)
    reader = ds.last_reader
    assert most[0] > 1, most[0]
    assert reader is not None and reader.threads == 1 and reader.waits
    assert any(n.startswith("lakestream-read-waiting") for n in names), names


def test_a_consumer_that_stops_leaves_the_steps_not_begun_unread(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """Closing the iteration drops the steps queued for the read threads; only the read
    under way ends. Before, every step read ahead was read, collated and transformed
    first (here 5 more steps of 0.1 s each)."""
    monkeypatch.setattr("lakestream.loaders.host.usable_cores", lambda: 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    uri, _ = _image_stream(tmp_path, n=96)
    done: list[int] = []

    def slow(batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.1)
        done.append(int(batch["step"]))
        return batch

    ds = StreamDataset(uri, group=None, max_steps=12, transform=slow, prefetch=4)
    it = iter(ds)
    assert next(it)["step"] == 0
    it.close()
    assert ds.last_reader is not None and ds.last_reader.threads == 1
    assert len(done) <= 3, done  # the first, the one under way, at most one more


def test_reads_that_do_not_wait_leave_the_waiting_threads_idle(tmp_path: Path,
                                                               monkeypatch) -> None:
    """The same stream without the delay: its reads are measured not waiting."""
    monkeypatch.setattr("lakestream.loaders.host.usable_cores", lambda: 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    uri, _ = _image_stream(tmp_path, n=96)
    ds = StreamDataset(uri, group=None, max_steps=12)
    assert [b["step"] for b in ds] == list(range(12))
    assert ds.last_reader is not None and not ds.last_reader.waits


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU-only host")
@pytest.mark.parametrize("kwargs", [{"pin_memory": True}, {"device": "cuda"}])
def test_pinning_or_a_cuda_device_without_cuda_is_refused_up_front(
        tmp_path: Path, kwargs: dict[str, Any]) -> None:
    uri, _ = _image_stream(tmp_path)
    with pytest.raises(ValueError, match="need CUDA"):
        StreamDataset(uri, group=None, **kwargs)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="delivery to a GPU: runs on a host with CUDA")


@needs_cuda
def test_pinned_batches_hold_the_samples_in_page_locked_memory(tmp_path: Path) -> None:
    uri, images = _image_stream(tmp_path)
    seen = list(StreamDataset(uri, group=None, max_steps=4, pin_memory=True))
    assert [b["step"] for b in seen] == [0, 1, 2, 3]
    for b in seen:
        assert b["image"].is_pinned() and b["label"].is_pinned()
        assert b["jpeg"].is_pinned() and b["jpeg_offsets"].is_pinned()
        assert np.array_equal(b["image"].numpy(), images[b["step"] * 8:b["step"] * 8 + 8])


@needs_cuda
def test_batches_copied_to_the_gpu_are_there_and_ready_on_the_consumers_stream(
        tmp_path: Path) -> None:
    uri, images = _image_stream(tmp_path, n=256)
    ds = StreamDataset(uri, group=None, max_steps=32, device="cuda")
    sums = []
    for b in ds:  # no synchronisation here: the hand-over makes this stream wait
        assert b["image"].device.type == "cuda" and b["label"].device.type == "cuda"
        assert "_lakestream_ready" not in b
        sums.append((b["step"], b["image"].long().sum(), b["label"].clone()))
    torch.cuda.synchronize()
    for step, total, label in sums:
        want = images[step * 8:step * 8 + 8]
        assert int(total) == int(want.astype(np.int64).sum())
        assert label.tolist() == list(range(step * 8, step * 8 + 8))


@needs_cuda
def test_a_worker_loader_pins_its_batches(tmp_path: Path) -> None:
    uri, images = _image_stream(tmp_path)
    loader = StreamLoader(StreamDataset(uri, group=None, max_steps=4), num_workers=2,
                          pin_memory=True)
    seen = list(loader)
    assert sorted(b["step"] for b in seen) == [0, 1, 2, 3]
    for b in seen:
        assert b["image"].is_pinned()
        assert np.array_equal(b["image"].numpy(), images[b["step"] * 8:b["step"] * 8 + 8])


def test_a_device_that_is_not_a_cpu_or_gpu_is_refused(tmp_path: Path) -> None:
    uri, _ = _image_stream(tmp_path)
    with pytest.raises(ValueError, match="CPU or CUDA device"):
        StreamDataset(uri, group=None, device="meta")


def test_malformed_tensor_metadata_read_from_the_store_is_corrupt_not_a_crash() -> None:
    from lakestream.schema.tensors import TENSOR_KEY

    field = pa.field("x", pa.binary(), metadata={TENSOR_KEY: b'{"shape": "wide"}'})
    table = pa.Table.from_arrays([pa.array([b"\x00"])], schema=pa.schema([field]))
    with pytest.raises(CorruptLogError, match="the stream's schema: column x"):
        collate_table(table)


def test_a_tensor_column_is_read_straight_into_the_batch_tensor(tmp_path: Path,
                                                                monkeypatch) -> None:
    """One copy from the fragment's bytes to the batch: the tensor the loader yields is the
    array the read copied the rows into, not a copy of it."""
    import lakestream.read.spans as spans

    uri, images = _image_stream(tmp_path, n=64, batch=16)
    filled: set[int] = set()
    copy_rows = spans.copy_rows

    def recorded(buf: Any, values: Any, start: int, stop: int, out: np.ndarray) -> None:
        filled.add(out.ctypes.data)
        copy_rows(buf, values, start, stop, out)

    monkeypatch.setattr(spans, "copy_rows", recorded)
    # Without the binary column, the number column is read straight too.
    seen = list(StreamDataset(uri, group=None, max_steps=4, columns=["image", "label"]))
    assert [b["step"] for b in seen] == [0, 1, 2, 3]
    for b in seen:
        assert b["image"].data_ptr() in filled and b["label"].data_ptr() in filled
        assert np.array_equal(b["image"].numpy(), images[b["step"] * 16:b["step"] * 16 + 16])
        assert b["label"].tolist() == list(range(b["step"] * 16, b["step"] * 16 + 16))


def test_a_numeric_column_is_a_tensor_in_every_step_nulls_or_not(tmp_path: Path) -> None:
    """A null in a number column reads as 0 (False): a batch's fields have one type whichever
    steps hold a null, for the widths read straight from the file and the others alike."""
    schema = pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.int8()),
                        pa.field("c", pa.float32()), pa.field("d", pa.bool_())])
    uri = str(tmp_path / "s")
    stream = lakestream.create(uri, schema, global_batch_size=4)
    stream.append(pa.table({"a": [1, 2, 3, 4], "b": [1, 2, 3, 4], "c": [1.0, 2, 3, 4],
                            "d": [True] * 4}, schema=schema))
    stream.append(pa.table({"a": [5, None, 7, 8], "b": [None, 6, 7, 8],
                            "c": [5.0, 6, None, 8], "d": [True, True, True, None]},
                           schema=schema))
    for batches in (list(StreamDataset(uri, group=None, max_steps=2)),
                    list(StreamLoader(StreamDataset(uri, group=None, max_steps=2),
                                      num_workers=2))):
        first, second = batches
        for name in "abcd":
            assert isinstance(second[name], torch.Tensor)
            assert second[name].dtype == first[name].dtype and second[name].shape == (4,)
        assert second["a"].tolist() == [5, 0, 7, 8] and second["b"].tolist() == [0, 6, 7, 8]
        assert second["c"].tolist() == [5.0, 6.0, 0.0, 8.0]
        assert second["d"].tolist() == [True, True, True, False]


def test_numbers_beside_a_list_column_are_decoded_with_it_not_read_apart(
        tmp_path: Path, monkeypatch) -> None:
    """Arrow decodes a fragment's list columns anyway, and its columns of one number a row
    ride along: read apart as well, each fragment cost a second pass (a shuffled SFT mix fell
    to 0.65x log order). Alone, or beside a tensor column, numbers are read straight."""
    import lakestream.read.spans as spans

    apart: list[str] = []
    fill = spans._fill

    def counted(reader: Any, cache: Any, f: Any, pieces: Any, sink: Any, last: Any) -> None:
        apart.extend(sink.columns)
        fill(reader, cache, f, pieces, sink, last)

    monkeypatch.setattr(spans, "_fill", counted)
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4)
    s.append(rows(0, 8))
    batches = list(StreamDataset(uri, group=None, max_steps=2))
    assert [b["id"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert apart == []
    assert [b["id"].tolist() for b in StreamDataset(uri, group=None, max_steps=2,
                                                    columns=["id"])] == [[0, 1, 2, 3],
                                                                         [4, 5, 6, 7]]
    assert set(apart) == {"id"}
