"""Interleaved repetitions, summarised: every benchmark that compares runs the same way.

A benchmark runs repetition r of every configuration before repetition r + 1 of any, so
drift on a noisy machine hits all alike; a configuration is then reported as its median
repetition (by its headline figure), every repetition kept beside it, and a ratio as the
median of the per-repetition ratios with their min and max.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any


def median(xs: list[float]) -> float:
    """The middle value (the upper middle of an even count: always a measured value)."""
    return sorted(xs)[len(xs) // 2]


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": median(xs), "min": min(xs), "max": max(xs)}


def summarise(runs: list[dict[str, Any]], config: Callable[[dict[str, Any]], Hashable],
              by: str = "samples_per_s") -> list[dict[str, Any]]:
    """One row per configuration, in first-run order: its median repetition by ``by``, with
    ``reps`` (every repetition) and the min-max of ``mb_per_s`` where runs have it."""
    rows = []
    for key in dict.fromkeys(config(r) for r in runs):
        mine = [r for r in runs if config(r) == key]
        row = {**sorted(mine, key=lambda r: r[by])[len(mine) // 2], "reps": mine}
        if "mb_per_s" in row:
            row |= {"mb_per_s_min": min(r["mb_per_s"] for r in mine),
                    "mb_per_s_max": max(r["mb_per_s"] for r in mine)}
        rows.append(row)
    return rows


def drain(batches: Iterable[dict[str, Any]], sample_bytes: float) -> dict[str, float]:
    """Iterates a loader's ``batches`` (each with a ``tokens`` tensor, a row a sample): its
    samples and MB a second, and the process's CPU seconds per GB, at ``sample_bytes`` a
    sample."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    samples = steps = 0
    for batch in batches:
        samples += int(batch["tokens"].shape[0])
        steps += 1
    dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    gb = samples * sample_bytes / 1e9
    return {"samples_per_s": samples / dt, "mb_per_s": samples * sample_bytes / dt / 1e6,
            "cpu_s_per_gb": cpu / gb, "steps": steps, "seconds": dt}


def plot_bars(rows: list[dict[str, Any]], path: Path, title: str,
              figsize: tuple[float, float] = (8, 4),
              ylabel: str = "MB/s into padded tensors (one rank, median of reps)") -> None:
    """Each configuration's median MB/s (rows from ``summarise``) with its min-max, and its
    CPU-s per GB above it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    mids = [r["mb_per_s"] for r in rows]
    lows = [r["mb_per_s"] - r["mb_per_s_min"] for r in rows]
    highs = [r["mb_per_s_max"] - r["mb_per_s"] for r in rows]
    ax.bar([r["system"] for r in rows], mids, yerr=[lows, highs], capsize=4)
    for k, r in enumerate(rows):
        ax.text(k, r["mb_per_s"], f"{r['cpu_s_per_gb']:.1f} CPU-s/GB", ha="center",
                va="bottom", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
