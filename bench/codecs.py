"""Which codec a producer should write with: compression ratio, encode and decode CPU per GB
for every codec Lakestream offers, on random and on Zipf-distributed tokens.

Each fragment is encoded exactly as a producer encodes it (``encode_fragment``: dictionary
and statistics for scalars only, row groups aligned to groups) and decoded as a reader
decodes it (``pq.read_table``). Payloads: RL rollouts (16 samples of 1,024-3,072 tokens with
their log-probs, ~267 KB) with uniform tokens and with Zipf tokens, and pretraining sequences
(16 x 4,096 Zipf tokens, no log-probs). Every (payload, codec) runs ``--reps`` times,
interleaved; the table gives medians with their min-max.

Usage: .venv/bin/python -m bench.codecs [--reps 3] [--seconds 0.6]
Writes bench/results/codecs.json and bench/results/codecs.png.
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench import payload
from bench.floor import cpu_per_gb
from bench.output import RESULTS, command, save
from lakestream.log.fragments import encode_fragment

CODECS: dict[str, tuple[str, int | None]] = {
    "none": ("none", None), "snappy": ("snappy", None), "lz4": ("lz4", None),
    "zstd-1": ("zstd", 1), "zstd-3": ("zstd", 3), "zstd-6": ("zstd", 6),
}


def payloads() -> dict[str, list[pa.Table]]:
    return {
        "rollouts, random tokens": [payload.rollouts(16, 16, seed=s) for s in range(8)],
        "rollouts, Zipf tokens": [payload.rollouts(16, 16, seed=s, tokens="zipf")
                                  for s in range(8)],
        "pretraining, Zipf tokens": [payload.pretrain(16, seed=s, tokens="zipf")
                                     for s in range(8)],
    }


def measure(tables: list[pa.Table], codec: str, seconds: float) -> dict[str, float]:
    compression, level = CODECS[codec]

    def encode(i: int) -> memoryview:
        return encode_fragment(tables[i], 16, compression=compression, compression_level=level)

    bodies = [encode(i) for i in range(len(tables))]
    return {
        "ratio": sum(t.nbytes for t in tables) / sum(len(b) for b in bodies),
        "encode_cpu_s_per_gb": cpu_per_gb(encode, tables, seconds),
        "decode_cpu_s_per_gb": cpu_per_gb(
            lambda i: pq.read_table(pa.BufferReader(bodies[i]), use_threads=False),
            tables, seconds),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result["payloads"]), figsize=(15, 4.2), sharey=True)
    for ax, name in zip(axes, result["payloads"], strict=True):
        rows = [r for r in result["rows"] if r["payload"] == name]
        for r in rows:
            ax.scatter(r["encode_cpu_s_per_gb"], r["ratio"], zorder=3)
            ax.annotate(r["codec"], (r["encode_cpu_s_per_gb"], r["ratio"]), fontsize=8,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("encode CPU-s per GB (median)")
    axes[0].set_ylabel("compression ratio (Arrow bytes / file bytes)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.6,
                        help="CPU seconds of each encode and decode measurement")
    args = parser.parse_args()
    data = payloads()
    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _rep in range(args.reps):
        for name, tables in data.items():
            for codec in CODECS:
                samples.setdefault((name, codec), []).append(
                    measure(tables, codec, args.seconds))
    rows = []
    for (name, codec), runs in samples.items():
        row: dict[str, Any] = {"payload": name, "codec": codec}
        for k in runs[0]:
            values = [r[k] for r in runs]
            row |= {k: float(np.median(values)), f"{k}_min": min(values),
                    f"{k}_max": max(values)}
        rows.append(row)
        print(f"{name:26} {codec:7} ratio {row['ratio']:5.2f}  encode "
              f"{row['encode_cpu_s_per_gb']:5.2f}  decode {row['decode_cpu_s_per_gb']:5.2f} "
              "CPU-s/GB", flush=True)
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "platform": platform.platform(), "pyarrow": pa.__version__},
              "command": command("codecs"), "reps": args.reps,
              "payloads": list(data), "rows": rows}
    save("codecs.json", result)
    plot(result, RESULTS / "codecs.png")


if __name__ == "__main__":
    main()
