"""Loader benchmark for multimodal training: the same samples fed to one trainer by six
loaders, in interleaved repetitions (every loader of repetition r before any of r + 1, the
order rotated each repetition), each measurement in a process of its own.

The loaders, all yielding the same ``[B, 224, 224, 3]`` uint8 ``image`` and ``[B]``
``label`` tensors (``[B, seq]`` int32 ``tokens`` with ``--lm``):
  synthetic           batches made before the run, already tensors: the ceiling;
  lakestream          ``StreamDataset(uri, group=None)`` iterated in the trainer process,
                      at its defaults (its read threads and prefetch);
  lakestream-loader   ``StreamLoader(StreamDataset(...), num_workers=W)``;
  colocated-samples   a map-style Dataset over Parquet files of the same samples (each file
                      read once per worker, then one row per ``__getitem__``), with
                      ``DataLoader(batch_size=B, num_workers=W)`` and its default collate;
  colocated-batches   one Parquet file per batch, ``DataLoader(batch_size=None,
                      num_workers=W)``;
  mosaic-streaming    MosaicML Streaming over MDS shards, ``DataLoader(num_workers=W)``
                      (where the ``streaming`` package imports: run with .venv-bench);
  lakestream-batch    (``--loaders`` only) ``lakestream`` over a copy of the stream whose
                      own steps are 4 batches, read with ``batch_size=`` a batch: the cost
                      of a batch size chosen at read time;
  lakestream-s3       (``--loaders`` only) ``lakestream`` over a copy of the stream on a
                      SeaweedFS server on 127.0.0.1, each GET ``--s3-get-delay-ms``
                      longer (a store as far away as S3 is): held by the tests' fault
                      proxy, or with ``--s3-delay-by hook`` by a sleep after it in the
                      reading process (no proxy copying the bytes on the same cores);
  lakestream-nvjpeg   (``--jpeg`` on CUDA only) ``StreamDataset`` in the trainer process
                      handing over the JPEG bytes pinned, decoded on the GPU by nvJPEG
                      (``torchvision.io.decode_jpeg(device="cuda")``) inside ``next()``;
  lakestream@t<N>, lakestream@si<MS>
                      (``--loaders`` only) ``lakestream`` with N read threads, or with the
                      interpreter's switch interval at MS ms while it reads (in place of
                      ``SWITCH_INTERVAL_S``): what each costs the training loop's steps.
Raw pixels are a tensor column in the stream and a plain ``binary`` column in Parquet;
``--jpeg`` stores JPEG quality 90 bytes instead (``bench/images.py``), decoded by
Lakestream's ``transform=`` (in its read threads or workers), with PIL per sample in the
colocated-samples ``__getitem__``, per batch elsewhere (torchvision's CPU decoder where it
imports, else PIL).

Three trainers:
  ``--trainer null``: only copies each batch to the GPU (to a tensor on the CPU with
      ``--stand-in``) and reduces it, so that each loader runs at its own ceiling (with
      synthetic batches, the copy engine's);
  ``--stand-in`` (CPU): per batch, the main thread touches the batch, then runs tiny torch
      CPU ops (dispatch-bound, as a CUDA training loop's main thread is) for ``--step-ms``
      (``--step-kind time``), or for as many ops as take that long on an idle machine
      (``work``: contention from the loader then slows the steps too);
  default (CUDA): ViT-S/16 (``--model``: a timm ViT by name, ``vit_tiny_patch16_224``
      asks for more images a second; one written here where timm is missing) in bf16 autocast
      with fused AdamW, batches copied ``non_blocking`` from pinned memory (pinned by the
      DataLoaders' pin thread; by in-process Lakestream's read threads, ``pin_memory=True``,
      or copied to the GPU there with ``--device-copy``); ``--lm``: a GPT-2-small-sized
      decoder on 2,048-token sequences. Without CUDA it says so and exits 0.

Per loader, over the steps after ``--warmup``: the fraction of the synthetic loader's rate
(same repetition), images (tokens) per second, the trainer thread's CPU ms per batch inside
``next()`` (and its wall ms there), the loader's CPU-s per GB of decoded samples delivered
(the trainer process and its DataLoader workers, less the trainer thread's own steps) and
the cores that is; with the stand-in, ``dispatch``: the trainer thread's ops per ms inside
its steps over the synthetic run's (below 1: the loader's threads took the GIL or the core
from it). The producer's CPU-s per GB of raw image bytes is measured while writing.

Usage: .venv-bench/bin/python -m bench.gpu --stand-in [--jpeg] [--reps 3]
       python -m bench.gpu [--jpeg | --lm] [--trainer null | --model NAME]   (CUDA)
Writes bench/results/gpu_standin[_jpeg|_lm].json and .png (gpu[_jpeg|_lm] with CUDA; a
``_null`` or ``_<model>`` before the suffix for those trainers); while
it runs, ``<that>.partial.json`` holds the measurements so far.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch import nn

import lakestream
from bench import images
from bench.loader import children, cpu_of, split_lists  # (also stubs Streaming's vision)
from bench.output import RESULTS, ROOT, command, save
from bench.reps import spread, summarise
from lakestream.loaders import StreamDataset, StreamLoader
from lakestream.loaders.host import default_read_threads
from lakestream.producers import Producer

# Zero-copy views of Parquet buffers are read-only; torch warns once per process on each.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
warnings.filterwarnings("ignore", message="The given buffer is not writable")

LOADERS = ("synthetic", "lakestream", "lakestream-loader", "colocated-samples",
           "colocated-batches", "mosaic-streaming", "lakestream-nvjpeg", "lakestream-batch",
           "lakestream-s3")
READ_TIME_FACTOR = 4
"""``lakestream-batch`` reads a stream whose own steps are this many batches."""
VOCAB = 50257
POOL_BATCHES = 4
"""The data repeats a pool of this many batches of distinct samples (its pictures are not
all cached by the CPU); the stored files still hold every batch."""


# -- the data ------------------------------------------------------------------------------

def column(config: dict[str, Any]) -> str:
    return "tokens" if config["kind"] == "tokens" else "image"


def sample_shape(config: dict[str, Any]) -> tuple[int, ...]:
    return (config["seq"],) if config["kind"] == "tokens" else images.SHAPE


def sample_bytes(config: dict[str, Any]) -> int:
    """Bytes of one decoded sample as the trainer gets it."""
    return int(np.prod(sample_shape(config))) * (4 if config["kind"] == "tokens" else 1)


def make_pool(config: dict[str, Any]) -> Any:
    """``POOL_BATCHES`` batches of distinct samples: pictures ``[P, 224, 224, 3]``, their
    JPEGs (a list of bytes) or token sequences ``[P, seq]`` int32."""
    n = POOL_BATCHES * config["batch"]
    if config["kind"] == "tokens":
        return np.random.default_rng(0).integers(0, VOCAB, (n, config["seq"]), np.int32)
    pictures = images.smooth_images(n)
    return images.encode_jpeg(pictures) if config["kind"] == "jpeg" else pictures


def batch_rows(config: dict[str, Any], pool: Any, k: int) -> dict[str, Any]:
    """Batch ``k`` as a producer hands it over: the pool's rows (a numpy view for pixels,
    a list of bytes for JPEGs, a list of arrays for tokens) and the sample numbers."""
    b = config["batch"]
    rows = pool[(k % POOL_BATCHES) * b:(k % POOL_BATCHES + 1) * b]
    if config["kind"] == "tokens":
        return {"tokens": list(rows)}
    return {"image": rows, "label": np.arange(k * b, (k + 1) * b, dtype=np.int64)}


def stream_schema(config: dict[str, Any]) -> pa.Schema:
    if config["kind"] == "tokens":
        return pa.schema([pa.field("tokens", pa.list_(pa.int32()))])
    image = lakestream.tensor_field("image", images.SHAPE, "uint8") \
        if config["kind"] == "raw" else pa.field("image", pa.binary())
    return pa.schema([image, pa.field("label", pa.int64())])


def write_stream(uri: str, config: dict[str, Any], pool: Any, steps_of: int = 1,
                 options: dict[str, str] | None = None) -> dict[str, Any]:
    """The stream, one fragment per batch, its own steps ``steps_of`` batches, through a
    Producer; its CPU per GB."""
    lakestream.create(uri, stream_schema(config), global_batch_size=config["batch"] * steps_of,
                      group_size=1, storage_options=options)
    batches = [batch_rows(config, pool, k) for k in range(config["batches"])]
    wall, cpu = time.perf_counter(), time.process_time()
    with Producer(uri, "bench-producer", storage_options=options) as producer:
        for rows in batches:
            producer.write(rows)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stream = lakestream.open(uri, storage_options=options)
    stored = sum(f.size for f in stream.state.all_fragments())
    raw = config["batches"] * config["batch"] * sample_bytes(config)
    return {"cpu_s": cpu, "wall_s": wall, "cores": cpu / wall, "stored_bytes": stored,
            "raw_bytes": raw, "cpu_s_per_raw_gb": cpu / (raw / 1e9),
            "cpu_s_per_stored_gb": cpu / (stored / 1e9), "fragments": config["batches"]}


def parquet_table(config: dict[str, Any], pool: Any, k: int) -> pa.Table:
    rows = batch_rows(config, pool, k)
    if config["kind"] == "tokens":
        return pa.table({"tokens": pa.array(rows["tokens"], pa.list_(pa.int32()))})
    data = [bytes(r) for r in rows["image"]] if config["kind"] == "raw" else rows["image"]
    return pa.table({"image": pa.array(data, pa.binary()), "label": rows["label"]})


def write_parquet(root: str, config: dict[str, Any], pool: Any) -> list[str]:
    """One Parquet file per batch, encoded as Lakestream encodes fragments (binary columns
    uncompressed, others zstd level 1): the input of both colocated loaders."""
    os.makedirs(f"{root}/parquet")
    paths = []
    for k in range(config["batches"]):
        table = parquet_table(config, pool, k)
        codecs = {f.name: "none" if pa.types.is_binary(f.type) else "zstd"
                  for f in table.schema}
        paths.append(f"{root}/parquet/{k:06d}.parquet")
        pq.write_table(table, paths[-1], compression=codecs, use_dictionary=False,
                       compression_level={n: 1 for n, c in codecs.items() if c == "zstd"})
    return paths


def write_mds(root: str, config: dict[str, Any], pool: Any) -> str:
    from streaming import MDSWriter

    out = f"{root}/mds"
    kind, shape = config["kind"], ",".join(map(str, sample_shape(config)))
    columns = {"tokens": f"ndarray:int32:{shape}"} if kind == "tokens" else {
        "image": "bytes" if kind == "jpeg" else f"ndarray:uint8:{shape}", "label": "int64"}
    with MDSWriter(out=out, columns=columns, size_limit=1 << 26) as writer:
        for k in range(config["batches"]):
            rows = batch_rows(config, pool, k)
            for i in range(config["batch"]):
                writer.write({name: values[i] for name, values in rows.items()})
    return out


# -- the loaders ---------------------------------------------------------------------------

def table_batch(config: dict[str, Any], table: pa.Table) -> dict[str, torch.Tensor]:
    """A whole Parquet file as one batch, vectorised (the colocated-batches loader)."""
    if config["kind"] == "tokens":
        arr = table.column("tokens").combine_chunks()
        offsets = arr.offsets.to_numpy()
        values = arr.values.to_numpy()[offsets[0]:offsets[-1]]
        return {"tokens": torch.from_numpy(values.reshape(len(arr), -1))}
    arr = table.column("image").combine_chunks()
    offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)
    values = np.frombuffer(arr.buffers()[2], np.uint8)
    label = torch.from_numpy(table.column("label").to_numpy())
    if config["kind"] == "jpeg":
        start = int(offsets[0])
        flat = torch.from_numpy(values[start:int(offsets[-1])])
        return {"image": images.decode_batch(flat, (offsets - start).tolist()), "label": label}
    pixels = values[int(offsets[0]):int(offsets[-1])].reshape(len(arr), *images.SHAPE)
    return {"image": torch.from_numpy(pixels), "label": label}


class ParquetSamples(torch.utils.data.Dataset[dict[str, Any]]):
    """Colocated, per sample: the Parquet files' rows one by one, as a PyTorch user
    writes it: each file read once per worker (then its rows indexed), a JPEG decoded with
    PIL in ``__getitem__``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config, self.files, self.rows = config, config["files"], config["batch"]
        self._cached: tuple[int, list[Any], np.ndarray | None] | None = None

    def __len__(self) -> int:
        return len(self.files) * self.rows

    def __getitem__(self, i: int) -> dict[str, Any]:
        f, row = divmod(i, self.rows)
        if self._cached is None or self._cached[0] != f:
            t = pq.read_table(self.files[f])
            if self.config["kind"] == "tokens":
                self._cached = (f, split_lists(t.column("tokens")), None)
            else:
                self._cached = (f, t.column("image").to_pylist(), t.column("label").to_numpy())
        _, values, labels = self._cached
        if labels is None:
            return {"tokens": values[row]}
        image = images.decode_one(values[row]) if self.config["kind"] == "jpeg" else \
            np.frombuffer(values[row], np.uint8).reshape(images.SHAPE)
        return {"image": image, "label": int(labels[row])}


class ParquetBatches(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Colocated, per batch: one Parquet file per batch, read and decoded whole."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def __len__(self) -> int:
        return len(self.config["files"])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return table_batch(self.config, pq.read_table(self.config["files"][i]))


def stream_dataset(config: dict[str, Any], *, in_process: bool,
                   gpu_decode: bool = False, read_time: bool = False,
                   s3: bool = False) -> StreamDataset:
    """Lakestream's dataset at its defaults (no consumer group; its read threads and
    prefetch sized from the host), decoding JPEGs with ``transform=`` (unless the GPU
    decodes them: ``gpu_decode``); in the trainer
    process on CUDA, delivering pinned batches (or, with ``--device-copy``, batches on
    the GPU already), each done in its read threads."""
    kw: dict[str, Any] = {"group": None, "max_steps": config["batches"], "timeout": 600.0}
    if config["kind"] == "jpeg" and not gpu_decode:
        kw["transform"] = images.DecodeJpeg()
    if in_process and config.get("read_threads"):
        kw["read_threads"] = config["read_threads"]
    if in_process and not config["stand_in"]:
        if config["device_copy"]:
            kw["device"] = "cuda"
        else:
            kw["pin_memory"] = True
    if read_time:
        return StreamDataset(config["uri_batch"], batch_size=config["batch"], **kw)
    if s3:
        return StreamDataset(config["uri_s3"], storage_options=config["s3_options"], **kw)
    return StreamDataset(config["uri"], **kw)


def make_loader(config: dict[str, Any], name: str) -> tuple[Any, dict[str, Any]]:
    """Loader ``name`` over the run's data, and what it was set up with."""
    gpu, w = not config["stand_in"], config["workers"]
    workers: dict[str, Any] = {"num_workers": w, "pin_memory": gpu}
    if w:
        workers["multiprocessing_context"] = "spawn"
    if name == "synthetic":
        return Synthetic(config), {"in_process": True}
    if name.startswith("lakestream@"):
        return variant(config, name.partition("@")[2])
    if name == "lakestream":
        ds = stream_dataset(config, in_process=True)
        return ds, {"in_process": True, "pin_memory": ds.options.pin_memory,
                    "device": ds.options.device}
    if name == "lakestream-s3":
        if config["s3_delay_by"] == "hook":
            from bench.latency import delay_requests

            delay_requests(config["s3_get_delay_ms"] / 1e3, gets_only=True)
        ds = stream_dataset(config, in_process=True, s3=True)
        return ds, {"in_process": True, "get_delay_ms": config["s3_get_delay_ms"],
                    "delay_by": config["s3_delay_by"]}
    if name == "lakestream-batch":
        ds = stream_dataset(config, in_process=True, read_time=True)
        return ds, {"in_process": True, "batch_size": ds.options.batch_size,
                    "stream_batch": config["batch"] * READ_TIME_FACTOR}
    if name == "lakestream-nvjpeg":
        ds = stream_dataset(config, in_process=True, gpu_decode=True)
        return NvJpeg(ds), {"in_process": True, "pin_memory": ds.options.pin_memory,
                            "decoder": "torchvision.io.decode_jpeg(device='cuda')"}
    if name == "lakestream-loader":
        ds = stream_dataset(config, in_process=False)
        return StreamLoader(ds, **workers), {
            **workers,
            "read_threads_per_worker": ds.options.read_threads or default_read_threads(w)}
    if name == "colocated-samples":
        return torch.utils.data.DataLoader(ParquetSamples(config), batch_size=config["batch"],
                                           **workers), workers
    if name == "colocated-batches":
        return torch.utils.data.DataLoader(ParquetBatches(config), batch_size=None,
                                           **workers), workers
    if name == "mosaic-streaming":
        from streaming import StreamingDataset

        ds = StreamingDataset(local=config["mds"], batch_size=config["batch"], shuffle=False)
        collate = images.collate_jpeg if config["kind"] == "jpeg" else None
        return torch.utils.data.DataLoader(ds, batch_size=config["batch"], collate_fn=collate,
                                           **workers), workers
    raise ValueError(f"unknown loader {name!r}; expected one of {LOADERS}")


def variant(config: dict[str, Any], how: str) -> tuple[Any, dict[str, Any]]:
    """In-process ``lakestream`` with ``t<N>`` read threads or a switch interval of
    ``si<MS>`` ms while it reads."""
    if how.startswith("t") and how[1:].isdigit():
        ds = stream_dataset({**config, "read_threads": int(how[1:])}, in_process=True)
        return ds, {"in_process": True, "read_threads": int(how[1:])}
    if how.startswith("si"):
        from lakestream.loaders import host

        host.SWITCH_INTERVAL_S = float(how[2:]) / 1e3
        return stream_dataset(config, in_process=True), {
            "in_process": True, "switch_interval_s": host.SWITCH_INTERVAL_S}
    raise ValueError(f"unknown variant lakestream@{how}; expected t<threads> or si<ms>")


class NvJpeg:
    """A loader's batches of JPEG bytes (flat ``image`` values and ``image_offsets``, as a
    ``binary`` column collates) decoded on the GPU in one batched nvJPEG call, as the
    ``[n, 224, 224, 3]`` uint8 CUDA tensor every loader yields."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    @property
    def last_reader(self) -> Any:
        return getattr(self.loader, "last_reader", None)

    def __iter__(self) -> Any:
        from torchvision.io import decode_jpeg

        for batch in self.loader:
            values, offsets = batch.pop("image"), batch.pop("image_offsets").tolist()
            pieces = [values[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
            batch["image"] = torch.stack(decode_jpeg(pieces, device="cuda")).permute(0, 2, 3, 1)
            yield batch


class Synthetic:
    """Batches made before the run (pinned for CUDA), handed out in turn."""

    def __init__(self, config: dict[str, Any]) -> None:
        b, gpu = config["batch"], not config["stand_in"]
        shape = (b, *sample_shape(config))
        self.batches = []
        for k in range(2):
            if config["kind"] == "tokens":
                batch = {"tokens": torch.randint(0, VOCAB, shape, dtype=torch.int32)}
            else:
                batch = {"image": torch.randint(0, 256, shape, dtype=torch.uint8),
                         "label": torch.arange(k * b, (k + 1) * b)}
            self.batches.append({n: t.pin_memory() if gpu else t for n, t in batch.items()})
        self.total = config["batches"]

    def __iter__(self) -> Any:
        return (self.batches[k % 2] for k in range(self.total))


# -- the trainers --------------------------------------------------------------------------

def check(config: dict[str, Any], batch: Any) -> torch.Tensor:
    """The batch's samples tensor, which must be what every loader is to yield."""
    want = (config["batch"], *sample_shape(config))
    value = batch.get(column(config)) if isinstance(batch, dict) else None
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != want:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(f"batch[{column(config)!r}] is {got}; every loader must yield a "
                        f"{want} tensor")
    return value


class StandIn:
    """The CPU stand-in trainer: a dispatch-bound main thread, no model."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config, self.x, self.ops = config, torch.ones(64), 0
        self.step_s, self.iters = config["step_ms"] / 1e3, config["step_iters"]

    def step(self, batch: Any) -> None:
        samples = check(self.config, batch)
        int(samples.reshape(-1)[-1])  # the batch must really be there
        x = self.x
        if self.config["step_kind"] == "work":
            for _ in range(self.iters):
                x = x * 1.0001 + 0.0
            self.ops += self.iters
        else:
            end = time.perf_counter() + self.step_s
            while time.perf_counter() < end:
                x = x * 1.0001 + 0.0
                self.ops += 1
        self.x = x

    def finish(self) -> None:
        pass


def calibrate(step_ms: float) -> int:
    """Stand-in ops that take ``step_ms`` on this machine now (the ``work`` step)."""
    x, n, t0 = torch.ones(64), 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        x = x * 1.0001 + 0.0
        n += 1
    return max(1, round(n * step_ms / 1e3 / (time.perf_counter() - t0)))


class Block(nn.Module):
    """A pre-norm transformer block (causal in the language model)."""

    def __init__(self, dim: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads) \
            .permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """ViT-S/16 (384 wide, 12 blocks, 6 heads) when timm is not there."""

    def __init__(self, dim: int = 384, depth: int = 12, heads: int = 6,
                 classes: int = 1000) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 16, 16)
        self.pos = nn.Parameter(torch.zeros(1, (224 // 16) ** 2, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads, False) for _ in range(depth)))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.blocks(x)).mean(1))


class GPT(nn.Module):
    """A GPT-2-small-sized decoder (768 wide, 12 blocks, 12 heads, tied embeddings)."""

    def __init__(self, seq: int, vocab: int = 50304, dim: int = 768, depth: int = 12,
                 heads: int = 12) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Parameter(torch.zeros(1, seq, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads, True) for _ in range(depth)))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        nn.init.normal_(self.tok.weight, std=0.02)  # GPT-2's; N(0, 1) makes logits huge
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[:, :idx.shape[1]]
        return self.head(self.norm(self.blocks(x)))


class CudaTrainer:
    """A real training step on CUDA: bf16 autocast, fused AdamW; the batch copied
    ``non_blocking`` (from pinned memory, which every loader here gives)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.lm = config["kind"] == "tokens"
        if self.lm:
            model: nn.Module = GPT(config["seq"])
        else:
            try:
                import timm

                model = timm.create_model(config["model"], num_classes=1000)
            except ImportError:
                if config["model"] != "vit_small_patch16_224":
                    raise
                model = ViT()
        self.model = model.cuda().train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)

    def step(self, batch: Any) -> None:
        samples = check(self.config, batch).cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if self.lm:
                tokens = samples.long()
                logits = self.model(tokens[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            else:
                x = samples.permute(0, 3, 1, 2).float().div_(255.0).sub_(0.5)
                labels = batch["label"].cuda(non_blocking=True) % 1000
                loss = F.cross_entropy(self.model(x), labels)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def finish(self) -> None:
        torch.cuda.synchronize()


class NullTrainer:
    """Only what any trainer does with a batch: its samples copied to the GPU
    (``non_blocking``, from pinned memory) and reduced, the step waited for so that the
    loader may fill the batch's memory again; with ``--stand-in``, copied into a tensor of
    the CPU instead. What it takes a second is the loader's own ceiling."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config, self.cuda = config, not config["stand_in"]
        self.total = torch.zeros((), dtype=torch.float64,
                                 device="cuda" if self.cuda else "cpu")
        self.into: torch.Tensor | None = None

    def step(self, batch: Any) -> None:
        samples = check(self.config, batch)
        if self.cuda:
            x = samples.cuda(non_blocking=True)
            self.total += x.view(-1)[::4096].sum(dtype=torch.float64)
            torch.cuda.current_stream().synchronize()
        else:
            if self.into is None:
                self.into = torch.empty_like(samples)
            self.into.copy_(samples)
            self.total += self.into.view(-1)[::4096].sum(dtype=torch.float64)

    def finish(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


# -- one measurement -----------------------------------------------------------------------

def measure(config: dict[str, Any], name: str) -> dict[str, Any]:
    """Loader ``name`` feeding the trainer for ``warmup + steps`` batches; the figures are
    over the ``steps`` after the warm-up (worker start-up excluded)."""
    trainer: StandIn | CudaTrainer | NullTrainer = NullTrainer(config) \
        if config["trainer"] == "null" else StandIn(config) if config["stand_in"] \
        else CudaTrainer(config)
    loader, setup = make_loader(config, name)
    it = iter(loader)
    for _ in range(config["warmup"]):
        trainer.step(next(it))
    trainer.finish()
    kids = children()
    kids0 = cpu_of(kids, {})
    ops0 = trainer.ops if isinstance(trainer, StandIn) else 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    next_cpu = next_wall = step_cpu = step_wall = 0.0
    for _ in range(config["steps"]):
        c, w = time.thread_time(), time.perf_counter()
        batch = next(it)
        c2, w2 = time.thread_time(), time.perf_counter()
        trainer.step(batch)
        next_cpu, next_wall = next_cpu + c2 - c, next_wall + w2 - w
        step_cpu, step_wall = step_cpu + time.thread_time() - c2, step_wall + \
            time.perf_counter() - w2
    trainer.finish()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    kids1 = cpu_of(kids, kids0)
    reader = getattr(loader, "last_reader", None)
    if reader is not None:  # Lakestream in this process: what its defaults came to
        setup |= {"read_threads": reader.threads, "prefetch": reader.prefetch}
    workers_cpu = sum(kids1[p] - kids0.get(p, kids1[p]) for p in kids1)
    del it
    samples = config["steps"] * config["batch"]
    loader_cpu = cpu - step_cpu + workers_cpu
    gb = samples * sample_bytes(config) / 1e9
    out = {"wall_s": wall, "samples_per_s": samples / wall,
           "busy": step_wall / wall, "next_cpu_ms": 1e3 * next_cpu / config["steps"],
           "next_wait_ms": 1e3 * next_wall / config["steps"],
           "cpu_s_per_gb": loader_cpu / gb, "cores": loader_cpu / wall,
           "workers_cpu_s": workers_cpu, "setup": setup}
    if config["kind"] == "tokens":
        out["tokens_per_s"] = samples * config["seq"] / wall
    if isinstance(trainer, StandIn):
        out["ops_per_ms"] = (trainer.ops - ops0) / (1e3 * step_wall)
    return out


def _measured(config_path: str, name: str, rep: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.gpu", "--measure", config_path, name],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(f"{name} failed: {out.stderr[-3000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r.update(loader=name, rep=rep)
    print(f"rep {rep} {name:18} {r['samples_per_s']:8.0f} samples/s  busy {r['busy']:.3f}  "
          f"next() {r['next_cpu_ms']:6.2f} CPU-ms {r['next_wait_ms']:6.2f} ms  "
          f"{r['cpu_s_per_gb']:6.2f} CPU-s/GB  {r['cores']:.2f} cores", flush=True)
    return r


# -- the run -------------------------------------------------------------------------------

def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown")
    out: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)), "cpu": model,
                           "torch": torch.__version__, "python": sys.version.split()[0],
                           "jpeg_decoder": images.DECODER}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def _slow_s3(config: dict[str, Any], pool: Any, delay_ms: float, by: str) -> list[Any]:
    """A copy of the stream on SeaweedFS on 127.0.0.1, written directly, each GET of it
    taking ``delay_ms`` more: held by the tests' fault proxy (``by="proxy"``: a Python
    process copying every byte, on the cores the trainer uses), or by a request hook of the
    reading process (``"hook"``: a sleep after each GET, in the thread that sent it).
    Returns what to stop after the run (the proxy, then the server)."""
    from tests.s3server import start_s3

    server = start_s3("bench")
    config["uri_s3"] = f"s3://bench/gpu-{os.getpid()}"
    write_stream(config["uri_s3"], config, pool, options=server.options())
    config["s3_get_delay_ms"], config["s3_delay_by"] = delay_ms, by
    if by == "hook":
        config["s3_options"] = server.options()
        return [server]
    from tests.faultproxy import FaultProxy

    proxy = FaultProxy(server.url, lambda r: "slow" if r.method == "GET" else None,
                       slow_s=delay_ms / 1e3)
    config["s3_options"] = proxy.options(server.options())
    return [proxy, server]


def data_dir(config: dict[str, Any]) -> str | None:
    """/dev/shm where it is writable and has room for the four copies of the data (and
    the loaders' shared memory), else the temp dir."""
    need = 5 * config["batches"] * config["batch"] * sample_bytes(config)
    if os.access("/dev/shm", os.W_OK) and shutil.disk_usage("/dev/shm").free > need:
        return "/dev/shm"
    return None


def peers_available(mode: str) -> tuple[bool, str | None]:
    if mode == "off":
        return False, "mosaic-streaming: off (--peers off)"
    try:
        import streaming  # noqa: F401
    except Exception as e:  # noqa: BLE001 - whatever stops it importing, it is skipped
        if mode == "on":
            raise
        return False, (f"mosaic-streaming: skipped, the streaming package does not import "
                       f"in {sys.executable} ({type(e).__name__}: {e}); run with .venv-bench")
    return True, None


def public(config: dict[str, Any]) -> dict[str, Any]:
    """The run's settings as reported (without its paths)."""
    return {k: v for k, v in config.items()
            if k not in ("uri", "files", "mds", "uri_s3", "s3_options", "uri_batch")}


PEERS = ("colocated-samples", "colocated-batches", "mosaic-streaming")


def ratios(runs: list[dict[str, Any]], reps: int) -> dict[str, dict[str, float]]:
    """Lakestream's rates (in process, and in DataLoader workers) over each peer's, and over
    the best peer's of the same repetition, summarised over the repetitions."""
    def of(name: str, k: int) -> float:
        return next(r["samples_per_s"] for r in runs if r["loader"] == name and r["rep"] == k)

    present = {r["loader"] for r in runs}
    peers = [p for p in PEERS if p in present]
    out = {}
    if {"lakestream", "lakestream-batch"} <= present:
        out["lakestream-batch / lakestream"] = spread(
            [of("lakestream-batch", k) / of("lakestream", k) for k in range(reps)])
    for ours in ("lakestream", "lakestream-loader"):
        if ours not in present:
            continue
        for peer in peers:
            out[f"{ours} / {peer}"] = spread([of(ours, k) / of(peer, k) for k in range(reps)])
        if len(peers) > 1:
            out[f"{ours} / best peer"] = spread(
                [of(ours, k) / max(of(p, k) for p in peers) for k in range(reps)])
    return out


METRICS = ("of_synthetic", "samples_per_s", "next_cpu_ms", "next_wait_ms", "cpu_s_per_gb",
           "cores", "dispatch_of_synthetic")


def summary(runs: list[dict[str, Any]], names: list[str]) -> dict[str, dict[str, Any]]:
    """Each loader's median and min-max of every figure over the repetitions."""
    return {name: {m: spread([r[m] for r in runs if r["loader"] == name])
                   for m in METRICS if all(m in r for r in runs if r["loader"] == name)}
            for name in names}


def table(result: dict[str, Any]) -> str:
    unit = "tok/s" if result["config"]["kind"] == "tokens" else "img/s"
    lines = [f"{'loader':18} {'of synthetic':>19} {unit:>20} {'next() CPU ms':>14} "
             f"{'CPU-s/GB':>16} {'cores':>6} {'dispatch':>9}"]
    per = result["config"]["seq"] if result["config"]["kind"] == "tokens" else 1
    for name, s in result["spreads"].items():
        o, v, c = s["of_synthetic"], s["samples_per_s"], s["cpu_s_per_gb"]
        lines.append(
            f"{name:18} {o['median']:6.3f} ({o['min']:.3f}-{o['max']:.3f}) "
            f"{v['median'] * per:8.0f} ({v['min'] * per:.0f}-{v['max'] * per:.0f}) "
            f"{s['next_cpu_ms']['median']:14.2f} "
            f"{c['median']:6.2f} ({c['min']:.2f}-{c['max']:.2f}) "
            f"{s['cores']['median']:6.2f} "
            + (f"{s['dispatch_of_synthetic']['median']:9.3f}" if "dispatch_of_synthetic" in s
               else ""))
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("no matplotlib here: no plot", flush=True)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["spreads"])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4))
    for a, metric, label in ((ax, "of_synthetic", "fraction of the synthetic rate"),
                             (bx, "cpu_s_per_gb", "loader CPU-s per GB delivered")):
        s = [result["spreads"][n][metric] for n in names]
        mid = [x["median"] for x in s]
        a.bar(range(len(names)), mid, yerr=[[m - x["min"] for m, x in zip(mid, s, strict=True)],
                                            [x["max"] - m for m, x in zip(mid, s, strict=True)]])
        a.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
        a.set_ylabel(f"{label} (median, min-max)")
        a.grid(axis="y", alpha=0.3)
    c, m = result["config"], result["machine"]
    trainer = ("null trainer, " if c.get("trainer") == "null" else "") + (
        "CPU stand-in" if c["stand_in"] else m.get("gpu", "CUDA"))
    ax.set_title(f"{c['kind']} batches of {c['batch']}, {trainer}, {m['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stand-in", action="store_true", help="the CPU stand-in trainer")
    p.add_argument("--jpeg", action="store_true", help="JPEG quality 90, decoded by loaders")
    p.add_argument("--lm", action="store_true", help="2,048-token sequences, GPT-2 small")
    p.add_argument("--batch", type=int, help="default: 64 stand-in, 256 CUDA, 16 --lm")
    p.add_argument("--seq", type=int, default=2048, help="tokens per sequence (--lm)")
    p.add_argument("--steps", type=int, default=96)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--step-ms", type=float, default=32.0, help="stand-in step time")
    p.add_argument("--step-kind", choices=("time", "work"), default="time",
                   help="stand-in step: fixed wall time, or fixed ops (slowed by contention)")
    p.add_argument("--trainer", choices=("model", "null"), default="model",
                   help="null: copy each batch to the GPU and reduce it, nothing else")
    p.add_argument("--model", default="vit_small_patch16_224",
                   help="the timm vision model the CUDA trainer trains")
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers")
    p.add_argument("--read-threads", type=int,
                   help="in-process Lakestream's read threads (default: its own default)")
    p.add_argument("--device-copy", action="store_true",
                   help="CUDA: in-process Lakestream copies to the GPU in its read threads")
    p.add_argument("--peers", choices=("auto", "on", "off"), default="auto",
                   help="MosaicML Streaming: if it imports / required / never")
    p.add_argument("--loaders", help="a comma-separated subset (default: each that applies)")
    p.add_argument("--root", help="where the data goes (default /dev/shm, else the temp dir)")
    p.add_argument("--s3-get-delay-ms", type=float, default=50.0,
                   help="lakestream-s3: how much longer each GET takes (default 50)")
    p.add_argument("--s3-delay-by", choices=("proxy", "hook"), default="proxy",
                   help="lakestream-s3: the tests' fault proxy holds each GET (a process "
                        "copying every byte), or a request hook sleeps after it")
    p.add_argument("--measure", nargs=2, metavar=("CONFIG", "LOADER"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        saved = json.loads(Path(args.measure[0]).read_text())
        print(json.dumps(measure(saved, args.measure[1])), flush=True)
        return
    if args.jpeg and args.lm:
        p.error("--jpeg and --lm are two different runs")
    if not args.stand_in and not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device here (torch.cuda.is_available() is False); "
              "run it on a GPU machine, or pass --stand-in for the CPU stand-in trainer")
        return
    nvjpeg = args.jpeg and not args.stand_in
    names = [n.strip() for n in args.loaders.split(",") if n.strip()] if args.loaders else \
        [n for n in LOADERS if (nvjpeg or n != "lakestream-nvjpeg")
         and n not in ("lakestream-batch", "lakestream-s3")]
    if "synthetic" not in names or any(n.partition("@")[0] not in LOADERS for n in names):
        p.error(f"--loaders must name synthetic and only these: {', '.join(LOADERS)}")
    if "lakestream-nvjpeg" in names and (args.stand_in or not args.jpeg):
        p.error("lakestream-nvjpeg decodes JPEGs on the GPU: it needs --jpeg on CUDA")
    notes = []
    if "mosaic-streaming" in names:
        ok, note = peers_available(args.peers)
        if not ok:
            names.remove("mosaic-streaming")
            notes.append(note)
            print(note, flush=True)
    kind = "tokens" if args.lm else "jpeg" if args.jpeg else "raw"
    batch = args.batch or (16 if args.lm else 64 if args.stand_in else 256)
    config: dict[str, Any] = {
        "stand_in": args.stand_in, "kind": kind, "batch": batch, "seq": args.seq,
        "steps": args.steps, "warmup": args.warmup, "batches": args.steps + args.warmup,
        "workers": args.workers, "device_copy": args.device_copy, "step_ms": args.step_ms,
        "step_kind": args.step_kind, "trainer": args.trainer, "model": args.model,
        "read_threads": args.read_threads,
        "step_iters": calibrate(args.step_ms) if args.stand_in else 0}
    stem = ("gpu_standin" if args.stand_in else "gpu") + (
        "_null" if args.trainer == "null" else "" if args.stand_in or args.lm
        or args.model == "vit_small_patch16_224" else f"_{args.model}") + (
        f"_t{args.read_threads}" if args.read_threads else "") + {
        "raw": "", "jpeg": "_jpeg", "tokens": "_lm"}[kind] + (
        "_batch" if "lakestream-batch" in names else "") + (
        "_s3" + ("_hook" if args.s3_delay_by == "hook" else "")
         if "lakestream-s3" in names else "")
    partial = RESULTS / f"{stem}.partial.json"
    root = tempfile.mkdtemp(prefix="lakestream-gpu-", dir=args.root or data_dir(config))
    result: dict[str, Any] = {"command": command("gpu"),
                              "machine": machine(), "config": config, "notes": notes}
    print(json.dumps(result["machine"]), flush=True)
    servers: list[Any] = []
    try:
        pool = make_pool(config)
        config["uri"] = f"{root}/stream"
        result["producer"] = write_stream(config["uri"], config, pool)
        print(f"producer: {result['producer']['cpu_s_per_raw_gb']:.2f} CPU-s per GB of raw "
              f"samples ({result['producer']['cores']:.2f} cores)", flush=True)
        if "lakestream-s3" in names:
            servers = _slow_s3(config, pool, args.s3_get_delay_ms, args.s3_delay_by)
        if "lakestream-batch" in names:
            config["uri_batch"] = f"{root}/stream-batch"
            config["batches"] -= config["batches"] % READ_TIME_FACTOR  # whole own steps
            write_stream(config["uri_batch"], config, pool, READ_TIME_FACTOR)
        if kind == "jpeg":
            result["jpeg_kb_per_image"] = np.mean([len(b) for b in pool]) / 1e3
        config["files"] = write_parquet(root, config, pool)
        if "mosaic-streaming" in names:
            config["mds"] = write_mds(root, config, pool)
        del pool
        path = f"{root}/config.json"
        Path(path).write_text(json.dumps(config))
        runs = []
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[:rep % len(names)]
            mine = {}
            for name in order:
                mine[name] = _measured(path, name, rep)
                # What is measured so far, kept should the run be cut short (a GPU host
                # lent for minutes): the final write below replaces it.
                save(partial.name, {**result, "config": public(config),
                                    "runs": runs + list(mine.values())})
            base = mine["synthetic"]
            for r in mine.values():
                r["of_synthetic"] = r["samples_per_s"] / base["samples_per_s"]
                if "ops_per_ms" in r:
                    r["dispatch_of_synthetic"] = r["ops_per_ms"] / base["ops_per_ms"]
            runs += [mine[n] for n in names]
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    result["config"] = public(config)
    result["runs"] = runs
    result["loaders"] = summarise(runs, lambda r: r["loader"], by="of_synthetic")
    result["spreads"] = summary(runs, names)
    result["ratios"] = ratios(runs, args.reps)
    print(table(result))
    for key, s in result["ratios"].items():
        print(f"{key}: {s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})")
    for n in notes:
        print("note:", n)
    save(f"{stem}.json", result)
    partial.unlink(missing_ok=True)
    plot(result, RESULTS / f"{stem}.png")
    print(f"wrote bench/results/{stem}.json and .png", flush=True)


if __name__ == "__main__":
    main()
