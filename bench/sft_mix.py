"""SFT mix benchmark: a shuffled mix of single-sample groups against the same samples in log
order, one rank, in one run:

(a) ``log-order``: one stream holding a's samples then b's, read in log order (steps of 60);
(b) ``shuffled-mix``: ``StreamDataset([Source(a, 45), Source(b, 15)], shuffle_window=10,
    group=None)``.

Every stream is written with ``group_size=1`` in fragments of 64 samples (a producer flushing
every 64), so a fragment holds more than a step takes of it: a step of (a) spans one or two
fragments, and a step of (b) draws on every fragment of its window. Both produce the same
padded tensors at ``num_workers=0`` (the process's CPU time is the loader's). Repetitions are
interleaved; each ratio is the median of the per-repetition ratios with its min-max, and
CPU-s per GB read stands beside MB/s. A last, untimed pass of each counts the fragment GETs
and the Parquet row groups decoded, per fragment read: 1.0 when each is fetched and decoded
once however many steps draw on it.

Usage: .venv/bin/python -m bench.sft_mix [--reps 5] [--steps 160]
Writes bench/results/sft_mix.json (and sft_mix.png where matplotlib is installed).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lakestream
from bench import payload
from bench.output import RESULTS, command, save
from bench.reps import drain, plot_bars, spread, summarise
from lakestream.loaders import Source, StreamDataset
from lakestream.store import Request, add_request_hook

TAKE_A, TAKE_B, WINDOW, FRAGMENT = 45, 15, 10, 64


def _build(root: str, steps: int, tokens: tuple[int, int]
           ) -> tuple[lakestream.Stream, lakestream.Stream, lakestream.Stream, float]:
    """Sources a and b, one stream ``plain`` holding the same samples (a's, then b's), and
    the mean bytes of a sample."""
    streams = [lakestream.create(f"{root}/{name}", payload.ROLLOUT_SCHEMA,
                                 global_batch_size=take, group_size=1)
               for name, take in (("a", TAKE_A), ("b", TAKE_B), ("plain", TAKE_A + TAKE_B))]
    a, b, plain = streams
    seed, nbytes = 0, 0
    for stream, take in ((a, TAKE_A), (b, TAKE_B)):
        for lo in range(0, steps * take, FRAGMENT):
            n = min(FRAGMENT, steps * take - lo)
            t = payload.rollouts(n, 1, seed=seed, first_prompt=seed * FRAGMENT,
                                 min_tokens=tokens[0], max_tokens=tokens[1])
            stream.append(t)
            plain.append(t)
            nbytes += t.nbytes
            seed += 1
    for stream in streams:
        stream.seal()
    return a, b, plain, nbytes / (steps * (TAKE_A + TAKE_B))


def _reads(dataset: StreamDataset) -> dict[str, float]:
    """Per fragment read, its GETs (whole, into a buffer, or opened to read by range), in one
    pass of ``dataset``, as the stores' request hook sees them. That each row group is
    decoded once is asserted by tests/loaders/test_mixing.py, not measured here."""
    dataset.mix  # noqa: B018 - opens the streams before counting
    gets: Counter[str] = Counter()

    def count(request: Request) -> None:
        if request.op in ("get", "get_buffer", "open_input") and request.key.startswith("data/"):
            gets[request.key] += 1

    remove = add_request_hook(count)
    try:
        for _ in dataset:
            pass
    finally:
        remove()
    return {"fragments": len(gets), "gets_per_fragment": sum(gets.values()) / len(gets),
            "max_gets_of_a_fragment": max(gets.values())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=160, help="steps a pass (16 windows)")
    parser.add_argument("--tokens", type=int, nargs=2, default=[1024, 3072],
                        metavar=("MIN", "MAX"), help="tokens a sample")
    args = parser.parse_args()
    result: dict[str, Any] = {"command": command("sft_mix"),
                              "takes": [TAKE_A, TAKE_B], "shuffle_window": WINDOW,
                              "fragment_samples": FRAGMENT, "group_size": 1,
                              "steps": args.steps, "tokens": args.tokens, "num_workers": 0,
                              "runs": []}
    with tempfile.TemporaryDirectory() as root:
        a, b, plain, sample_bytes = _build(root, args.steps, tuple(args.tokens))
        result["sample_bytes"] = sample_bytes
        result["mb_a_pass"] = args.steps * (TAKE_A + TAKE_B) * sample_bytes / 1e6
        runs: dict[str, Callable[[int], StreamDataset]] = {
            "log-order": lambda rep: StreamDataset(
                plain.uri, group=None, rank=0, world_size=1, progress_interval_s=0),
            "shuffled-mix": lambda rep: StreamDataset(
                [Source(a.uri, TAKE_A), Source(b.uri, TAKE_B)], group=None, rank=0,
                world_size=1, shuffle_window=WINDOW, seed=rep, progress_interval_s=0),
        }
        for rep in range(args.reps):
            for name, make in runs.items():
                dataset = make(rep)
                dataset.mix  # noqa: B018 - opening the streams is not what is measured
                r = drain(dataset, sample_bytes)
                r.update(system=name, rep=rep)
                result["runs"].append(r)
                print(f"rep {rep} {name:12} {r['mb_per_s']:7.1f} MB/s "
                      f"{r['cpu_s_per_gb']:5.2f} CPU-s/GB", flush=True)
        result["reads"] = {name: _reads(make(0)) for name, make in runs.items()}
        print("reads:", json.dumps(result["reads"]), flush=True)
    rows = summarise(result["runs"], lambda r: r["system"])
    result["systems"] = [{k: v for k, v in row.items() if k != "reps"} for row in rows]
    by = {(r["system"], r["rep"]): r["samples_per_s"] for r in result["runs"]}
    result["ratios"] = {"shuffled_mix_vs_log_order": spread(
        [by[("shuffled-mix", k)] / by[("log-order", k)] for k in range(args.reps)])}
    print("ratios (median, min-max):", json.dumps(result["ratios"]))
    save("sft_mix.json", result)
    try:
        plot(result, RESULTS / "sft_mix.png")
    except ImportError:
        print("matplotlib is not installed: no plot")


def plot(result: dict[str, Any], path: Path) -> None:
    ratio = result["ratios"]["shuffled_mix_vs_log_order"]
    plot_bars(result["systems"], path, "45+15 mix, windows of 10, single-sample groups: "
              f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f}) of log order",
              figsize=(6, 4))


if __name__ == "__main__":
    main()
