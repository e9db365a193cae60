"""Token balance across ranks: the step's groups split by today's contiguous equal-count
slices vs ``lakestream.plan.balance.balance_groups``, at W=8, over many steps.

For each (B, G) setting and length distribution, every step's group costs (tokens per group
of G responses) are split both ways; the figure is the slowest rank's tokens over the mean
rank's (1.0 is perfect), averaged over the steps, with the worst step beside it. Lengths
are those of ``payload.rollouts`` (uniform 1,024-3,072 tokens) or, since real RL responses
vary about tenfold, log-uniform 256-8,192 tokens (heavy-tailed). Beside them: the same
method without its final swaps (``kk-only``), a lower bound no equal-count split can beat
(exact at two groups a rank; see ``_lower_bound``), and the planning time of
``balance_groups`` per step (median and 99th percentile, in microseconds).

Usage: .venv/bin/python -m bench.balance [--steps 200]
Writes bench/results/balance.json and bench/results/balance.png.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from bench import payload
from bench.output import RESULTS, command, save
from bench.reps import median
from lakestream.plan.balance import balance_groups, largest_differencing
from lakestream.plan.balance import spread as max_over_mean
from lakestream.plan.slices import equal_count

WORLD = 8
SETTINGS = [(256, 16), (512, 8), (1024, 16)]  # (B, G)
DISTRIBUTIONS = ("uniform", "log-uniform")
TARGET = 1.05


def lengths(distribution: str, b: int, g: int, step: int) -> np.ndarray:
    """Response lengths of one step of ``b`` samples."""
    if distribution == "uniform":  # the shared payload's own samples
        t = payload.rollouts(b, g, seed=step, first_prompt=step * b // g)
        return pc.list_value_length(t.column("tokens")).to_numpy().astype(np.int64)
    rng = np.random.default_rng([step, b, g])
    return np.exp(rng.uniform(math.log(256), math.log(8192), size=b)).astype(np.int64)


def _kk_only(costs: np.ndarray) -> float:
    ranked = np.sort(costs)[::-1].tolist()
    loads = [s for s, _ in largest_differencing(ranked, WORLD)]
    return max(loads) / (sum(loads) / WORLD)


def _lower_bound(costs: np.ndarray) -> float:
    """No equal-count split does better: with two groups a rank, pairing the i-th largest
    with the i-th smallest is optimal (an exchange argument); otherwise the largest group
    plus the smallest others that must share its rank, or the mean."""
    per_rank = costs.size // WORLD
    mean = costs.sum() / WORLD
    ranked = np.sort(costs)
    if per_rank == 2:
        return float((ranked + ranked[::-1]).max() / mean)
    return float(max(mean, ranked[-1] + ranked[:per_rank - 1].sum()) / mean)


def run(distribution: str, b: int, g: int, steps: int) -> dict[str, Any]:
    contiguous, balanced, kk, bound, plan_us = [], [], [], [], []
    # Every step's costs first, so that the planning is timed apart from making payloads.
    steps_costs = [lengths(distribution, b, g, step).reshape(-1, g).sum(axis=1)
                   for step in range(steps)]
    for costs in steps_costs:
        t0 = time.perf_counter_ns()
        assignment = balance_groups(costs, WORLD)
        plan_us.append((time.perf_counter_ns() - t0) / 1e3)
        balanced.append(max_over_mean(costs, assignment))
        contiguous.append(max_over_mean(costs, equal_count(costs.size, WORLD)))
        kk.append(_kk_only(costs))
        bound.append(_lower_bound(costs))

    def stats(xs: list[float]) -> dict[str, float]:
        return {"mean": float(np.mean(xs)), "max": float(np.max(xs))}

    return {"distribution": distribution, "global_batch_size": b, "group_size": g,
            "groups": b // g, "groups_per_rank": b // g // WORLD,
            "contiguous": stats(contiguous), "balanced": stats(balanced),
            "kk_only": stats(kk), "lower_bound": stats(bound),
            "plan_us": {"median": median(plan_us), "mean": float(np.mean(plan_us)),
                        "p99": float(np.percentile(plan_us, 99))}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    result: dict[str, Any] = {"command": command("balance"),
                              "world_size": WORLD, "steps": args.steps, "target": TARGET,
                              "runs": []}
    print(f"W={WORLD}, {args.steps} steps each; slowest rank's tokens / mean (mean over steps, "
          "worst step)")
    print(f"{'lengths':11} {'B':>5} {'G':>3} {'groups/rank':>11} | {'contiguous':>15} | "
          f"{'balanced':>15} | {'kk-only':>7} | {'bound':>6} | {'plan us p50/p99':>15}")
    for distribution in DISTRIBUTIONS:
        for b, g in SETTINGS:
            r = run(distribution, b, g, args.steps)
            result["runs"].append(r)
            c, z = r["contiguous"], r["balanced"]
            print(f"{distribution:11} {b:5} {g:3} {r['groups_per_rank']:11} | "
                  f"{c['mean']:.4f} ({c['max']:.3f}) | {z['mean']:.4f} ({z['max']:.3f}) | "
                  f"{r['kk_only']['mean']:.4f} | {r['lower_bound']['mean']:.4f} | "
                  f"{r['plan_us']['median']:7.0f}/{r['plan_us']['p99']:.0f}", flush=True)
    met = [r["balanced"]["mean"] <= TARGET for r in result["runs"]]
    result["target_met"] = {f"{r['distribution']} B={r['global_batch_size']} "
                            f"G={r['group_size']}": ok
                            for r, ok in zip(result["runs"], met, strict=True)}
    print(f"target: balanced <= {TARGET} (mean over steps): "
          + ", ".join(f"{k} {'met' if ok else 'MISSED'}"
                      for k, ok in result["target_met"].items()))
    save("balance.json", result)
    plot(result, RESULTS / "balance.png")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    labels = [f"{r['distribution']}\nB={r['global_batch_size']} G={r['group_size']}\n"
              f"({r['groups_per_rank']} groups/rank)" for r in runs]
    x = np.arange(len(runs))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for k, (key, name) in enumerate((("contiguous", "contiguous (today)"),
                                     ("balanced", "balance_groups"))):
        means = [r[key]["mean"] for r in runs]
        ax.bar(x + (k - 0.5) * 0.38, means, 0.38, label=name)
        for i, m in enumerate(means):
            ax.text(x[i] + (k - 0.5) * 0.38, m, f"{m:.3f}", ha="center", va="bottom",
                    fontsize=7)
    ax.scatter(x + 0.19, [r["lower_bound"]["mean"] for r in runs], marker="_", s=300,
               color="black", label="lower bound (equal counts)", zorder=3)
    ax.axhline(result["target"], color="red", linestyle="--", linewidth=1,
               label=f"target {result['target']}")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylim(0.98, max(r["contiguous"]["mean"] for r in runs) * 1.04)
    ax.set_ylabel("slowest rank's tokens / mean (mean over steps)")
    ax.set_title(f"Token balance across W={result['world_size']} ranks, "
                 f"{result['steps']} steps per setting")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
