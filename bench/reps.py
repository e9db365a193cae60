"""Interleaved repetitions, summarised: every benchmark that compares runs the same way.

A benchmark runs repetition r of every configuration before repetition r + 1 of any, so
drift on a noisy machine hits all alike; a configuration is then reported as its median
repetition (by its headline figure), every repetition kept beside it, and a ratio as the
median of the per-repetition ratios with their min and max.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
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
