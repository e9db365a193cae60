"""The in-process loader's own ceiling on the CPU: a null consumer reading a stream at the
defaults and at 1, 2, 4, 8 and 15 read threads, and how long its threads hold the GIL.

Usage: .venv/bin/python -m bench.ceiling [--reps 3] [--batches 160] [--kind raw|tokens|jpeg]
Writes bench/results/ceiling-<kind>.json and .png.

``raw``: batches of 64 raw 224x224x3 ``uint8`` images in a tensor column; ``tokens``: batches
of 64 RL rollouts of 1-3k ``int32`` tokens, beside a colocated per-batch Parquet DataLoader at
equal cores (its worker reads and collates a file a batch; ``bench/gpu.py``'s); ``jpeg``:
batches of 64 JPEG q90 images in a binary column, decoded by ``transform=``
(``bench/images.py``; ``--decoders`` names which: ``pil`` and ``cv2``, OpenCV's
libjpeg-turbo decode, by default, each at every thread count), figures per GB of decoded
pixels. The stream is
on tmpfs (``/dev/shm``). Each setting runs in a fresh process, repetition r of every setting
before repetition r + 1 of any; each figure is the median repetition with its min-max.

Per setting: GB/s delivered, CPU-s per GB (the process's own CPU), and, in one more pass
under ``py-spy record --gil`` (which samples a thread only while it holds the GIL), the
seconds per GB during which the process's threads held the GIL, and the in-process ceiling
that implies (1 / those seconds: no number of threads can deliver more bytes a second than
the GIL lets through). py-spy takes CPU of its own on 2 cores, so throughput comes from the
passes without it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.output import ROOT, save
from bench.reps import median

THREADS = (1, 2, 4, 8, 15)
SAMPLE_HZ = 250

CHILD = r'''
import json, os, signal, subprocess, sys, time
import torch
from lakestream.loaders import StreamDataset
kind, uri, threads, gil = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
bytes_per_batch = float(sys.argv[5])
if kind == "colocated":
    from bench import ceiling
    loader = torch.utils.data.DataLoader(ceiling.PaddedBatches(json.loads(sys.argv[6])),
                                         batch_size=None, num_workers=1,
                                         multiprocessing_context="spawn")
else:
    kw = {} if threads == "default" else {"read_threads": int(threads)}
    if json.loads(sys.argv[6])["kind"] == "jpeg":
        from bench import images
        kw["transform"] = images.DecodeJpeg(decoder=sys.argv[9])
    loader = StreamDataset(uri, group=None, timeout=60.0, max_steps=int(sys.argv[8]), **kw)
it = iter(loader)
next(it)  # warm: threads started, footers cached, the pool made
spy = None
if gil != "-":
    spy = subprocess.Popen(["py-spy", "record", "--gil", "--threads", "--format", "raw",
                            "--rate", sys.argv[7], "--nonblocking", "--pid", str(os.getpid()),
                            "-o", gil], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached
cpu0, t0 = time.process_time(), time.perf_counter()
batches = 0
for batch in it:
    batches += 1
dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
if spy is not None:
    spy.send_signal(signal.SIGINT)
    spy.wait(timeout=60)
gb = batches * bytes_per_batch / 1e9
print(json.dumps({"batches": batches, "seconds": dt, "gb": gb, "gb_per_s": gb / dt,
                  "cpu_s_per_gb": cpu / gb}))
'''


def _gil_seconds(path: str, seconds: float) -> dict[str, float]:
    """Seconds the GIL was held in a py-spy ``--gil --threads`` raw profile, by the
    read threads and in all (each sample is ``1 / SAMPLE_HZ`` s). With ``--gil`` py-spy
    records a sample only for the thread that holds the GIL, so samples over the rate and
    the window are the share of time it was held."""
    held = readers = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        held += n
        if "lakestream-read" in stack.split(";", 1)[0]:  # "thread (tid): name;frames..."
            readers += n
    return {"gil_s": held / SAMPLE_HZ, "gil_s_readers": readers / SAMPLE_HZ,
            "gil_share": held / SAMPLE_HZ / seconds}


def _run(kind: str, uri: str, threads: str, gil: str | None, bytes_per_batch: float,
         config: dict[str, Any], decoder: str = "-") -> dict[str, Any]:
    args = [sys.executable, "-c", CHILD, kind, uri, threads, gil or "-", str(bytes_per_batch),
            json.dumps(config), str(SAMPLE_HZ), str(config["batches"]), decoder]
    # From the repository's root, as ``python -m bench.ceiling`` runs: ``-c`` puts the
    # working directory first on the search path, where ``bench`` is found.
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} {threads}: {out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if gil is not None:
        result |= _gil_seconds(gil, result["seconds"])
        result["gil_s_per_gb"] = result["gil_s"] / result["gb"]
        result["ceiling_gb_per_s"] = 1 / result["gil_s_per_gb"] if result["gil_s"] else None
    return result


class PaddedBatches:
    """The colocated loader for token sequences: one Parquet file per batch (encoded as
    Lakestream encodes fragments: zstd level 1), read whole and padded into ``tokens``
    ``[n, longest]`` and ``tokens_lengths``, vectorised, as a PyTorch user writes it."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.files = config["files"]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import numpy as np
        import pyarrow.parquet as pq
        import torch

        arr = pq.read_table(self.files[i]).column("tokens").combine_chunks()
        offsets = arr.offsets.to_numpy()
        values = arr.values.to_numpy()
        lengths = np.diff(offsets)
        out = np.zeros((len(arr), int(lengths.max())), np.int32)
        out[np.arange(out.shape[1])[None, :] < lengths[:, None]] = \
            values[offsets[0]:offsets[-1]]
        return {"tokens": torch.from_numpy(out), "tokens_lengths": torch.from_numpy(lengths)}


def _stream(root: str, kind: str, batches: int) -> tuple[str, float, dict[str, Any]]:
    """The stream under ``root`` (and, for tokens, the colocated loader's Parquet files),
    the bytes of a batch as delivered (the pixels, or the tokens before padding), and the
    configuration of the colocated loader."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench import gpu

    config: dict[str, Any] = {"kind": kind, "batch": 64, "batches": batches, "seq": 3072,
                              "uri": f"{root}/stream", "stand_in": True}
    pool = gpu.make_pool(config)
    if kind in ("raw", "jpeg"):
        gpu.write_stream(config["uri"], config, pool)
        return config["uri"], float(64 * 224 * 224 * 3), config
    lengths = np.random.default_rng(1).integers(1024, 3072, len(pool))
    pool = [row[:n] for row, n in zip(pool, lengths, strict=True)]
    gpu.write_stream(config["uri"], config, pool)
    os.makedirs(f"{root}/parquet")
    config["files"] = []
    for k in range(batches):
        rows = gpu.batch_rows(config, pool, k)["tokens"]
        path = f"{root}/parquet/{k:06d}.parquet"
        pq.write_table(pa.table({"tokens": pa.array(rows, pa.list_(pa.int32()))}), path,
                       compression="zstd", compression_level=1, use_dictionary=False)
        config["files"].append(path)
    per_batch = 4 * sum(len(gpu.batch_rows(config, pool, k)["tokens"][i])
                        for k in range(batches) for i in range(64)) / batches
    return config["uri"], float(per_batch), config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", type=int, default=160)
    ap.add_argument("--kind", choices=("raw", "tokens", "jpeg"), default="raw")
    ap.add_argument("--threads", nargs="+", default=["default", *map(str, THREADS)])
    ap.add_argument("--decoders", nargs="+", default=["pil", "cv2"],
                    help="for --kind jpeg: the decoders of bench/images.py to compare")
    args = ap.parse_args()
    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        sys.exit("py-spy is needed for the GIL figures: pip install py-spy")
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    root = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        uri, per_batch, config = _stream(root, args.kind, args.batches)
        decoders = args.decoders if args.kind == "jpeg" else ["-"]
        settings = [("lakestream", t, d) for d in decoders for t in args.threads]
        if args.kind == "tokens":
            settings.append(("colocated", "1 worker", "-"))
        runs: dict[str, list[dict[str, Any]]] = {_name(*s): [] for s in settings}
        for rep in range(args.reps):
            for k, t, d in settings:
                runs[_name(k, t, d)].append(_run(k, uri, t, None, per_batch, config, d))
                print(rep, _name(k, t, d), runs[_name(k, t, d)][-1], flush=True)
        gil = {}
        for k, t, d in settings:
            if k == "lakestream":
                gil[_name(k, t, d)] = _run(k, uri, t, f"{root}/gil-{t}-{d}.txt", per_batch,
                                           config, d)
                print("gil", _name(k, t, d), gil[_name(k, t, d)], flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = _summary(runs, gil, args)
    out = save(f"ceiling-{args.kind}.json",
               {"kind": args.kind, "batches": args.batches, "reps": args.reps,
                "cores": len(os.sched_getaffinity(0)), "rows": rows, "runs": runs, "gil": gil,
                "time": time.ctime()})
    _plot(rows, out.with_suffix(".png"), args.kind)
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "reps"}))


def _name(kind: str, threads: str, decoder: str) -> str:
    """A setting's name: ``lakestream 4``, or ``lakestream 4 cv2`` where a decoder is named."""
    return f"{kind} {threads}" + (f" {decoder}" if decoder != "-" else "")


def _summary(runs: dict[str, list[dict[str, Any]]], gil: dict[str, dict[str, Any]],
             args: argparse.Namespace) -> list[dict[str, Any]]:
    """A row per setting: median GB/s and CPU-s per GB with their min-max; the GIL figures of
    its py-spy pass; CPU per GB over that of 1 thread (of the same decoder), per repetition,
    as a median ratio."""
    rows = []
    for name, reps in runs.items():
        words = name.split(" ")
        one = runs.get(" ".join(["lakestream", "1", *words[2:]]))
        speeds = [r["gb_per_s"] for r in reps]
        cpus = [r["cpu_s_per_gb"] for r in reps]
        row: dict[str, Any] = {"setting": name, "gb_per_s": median(speeds),
                               "gb_per_s_min": min(speeds), "gb_per_s_max": max(speeds),
                               "cpu_s_per_gb": median(cpus), "cpu_s_per_gb_min": min(cpus),
                               "cpu_s_per_gb_max": max(cpus), "reps": reps}
        if one:
            ratios = [r["cpu_s_per_gb"] / o["cpu_s_per_gb"] for r, o in zip(reps, one,
                                                                               strict=True)]
            row |= {"cpu_vs_1_thread": median(ratios), "cpu_vs_1_thread_min": min(ratios),
                    "cpu_vs_1_thread_max": max(ratios)}
            speed = [r["gb_per_s"] / o["gb_per_s"] for r, o in zip(reps, one, strict=True)]
            row |= {"speed_vs_1_thread": median(speed)}
        if name in gil:
            row |= {k: gil[name][k] for k in ("gil_s_per_gb", "ceiling_gb_per_s",
                                              "gil_share")}
        rows.append(row)
    return rows


def _plot(rows: list[dict[str, Any]], path: Path, kind: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["setting"].replace("lakestream ", "") for r in rows]
    ax.bar(names, [r["gb_per_s"] for r in rows],
           yerr=[[r["gb_per_s"] - r["gb_per_s_min"] for r in rows],
                 [r["gb_per_s_max"] - r["gb_per_s"] for r in rows]], capsize=4)
    for k, r in enumerate(rows):
        ax.text(k, r["gb_per_s"], f"{r['cpu_s_per_gb']:.2f}", ha="center", va="bottom",
                fontsize=8)
    ax.set_ylabel("GB/s delivered (CPU-s/GB above)")
    ax.set_title(f"null consumer, {kind}, by read threads", fontsize=9)
    gil_rows = [r for r in rows if "gil_s_per_gb" in r]
    ax2.bar([r["setting"].replace("lakestream ", "") for r in gil_rows],
            [r["gil_s_per_gb"] for r in gil_rows])
    ax2.set_ylabel("GIL held, s per GB (py-spy --gil)")
    ax2.set_title("GIL held per GB delivered", fontsize=9)
    for a in (ax, ax2):
        a.grid(axis="y", alpha=0.3)
        a.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
