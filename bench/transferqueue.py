"""Lakestream beside TransferQueue (PyPI ``transferqueue``), the in-memory RL data bus on
Ray, with the same rollout samples, in one run.

TransferQueue's SimpleStorage keeps samples in Ray actors and moves them over ZeroMQ. Ray
binds listeners to every interface even when told 127.0.0.1, so this benchmark re-runs itself
inside a network namespace with only loopback up (``unshare -n``; ``-r`` maps root when not
run as root), and Lakestream runs in that same namespace. Ray gets 8 logical CPUs: with 2,
TransferQueue's actors wait on each other forever.

Measured, as in ``bench/brokers.py``: ingest for 1 and 4 producer processes (samples/s, MB
of sample payload per s, CPU-s per GB over producers and the Ray processes), the time to
fetch one rank's slice (32 of a global batch of 256) and how fast one consumer drains 40
global batches in order (``kv_batch_get`` of a global batch at a time).

Run: bench/setup-env && .venv-bench/bin/python -m bench.transferqueue
Writes bench/results/transferqueue.json and transferqueue.png.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench import brokers, payload, reps
from bench.output import RESULTS, command, save

GROUP, B, WORLD = brokers.GROUP, brokers.B, brokers.WORLD
PUT_BATCHES = (128, 512)  # samples per kv_batch_put; larger is faster for TransferQueue
_IN_NETNS = "LAKESTREAM_BENCH_NETNS"


def _reexec_in_netns() -> None:
    os.environ[_IN_NETNS] = "1"
    argv = ["unshare", "-n", *(["-r"] if os.geteuid() else []), "sh", "-c",
            'ip link set lo up && exec "$0" "$@"', sys.executable, "-m",
            "bench.transferqueue", *sys.argv[1:]]
    os.execvp("unshare", argv)


def tensordict(table: pa.Table) -> Any:
    """The rollout table as TransferQueue takes it: a TensorDict with jagged tensors."""
    import torch
    from tensordict import TensorDict

    def jagged(column: str) -> Any:
        arr = table.column(column).combine_chunks()
        values = torch.from_numpy(arr.values.to_numpy().copy())
        offsets = torch.from_numpy(arr.offsets.to_numpy().astype("int64"))
        return torch.nested.nested_tensor_from_jagged(values, offsets)

    def flat(column: str) -> Any:
        return torch.from_numpy(table.column(column).to_numpy().copy())

    return TensorDict({"prompt_id": flat("prompt_id"), "tokens": jagged("tokens"),
                       "logprobs": jagged("logprobs"), "reward": flat("reward"),
                       "policy_version": flat("policy_version")}, batch_size=table.num_rows)


def _payload_bytes(table: pa.Table) -> int:
    return sum(len(m) for m in brokers.encode(table))


def _quiet() -> None:
    logging.disable(logging.WARNING)


def _tq_producer(gcs: str, k: int, put_batch: int, start_at: float, duration: float,
                 out: Any) -> None:
    _quiet()
    import ray
    import transfer_queue as tq

    ray.init(address=gcs, log_to_driver=False)
    tq.init()  # attaches to the running controller
    tables = [payload.rollouts(put_batch, GROUP, seed=100 * k + s) for s in range(4)]
    batches = [tensordict(t) for t in tables]
    nbytes_of = [_payload_bytes(t) for t in tables]
    time.sleep(max(0.0, start_at - time.time()))
    cpu0, n, nbytes = time.process_time(), 0, 0
    while time.time() < start_at + duration:
        tq.kv_batch_put(keys=[f"p{k}-{n}-{i}" for i in range(put_batch)],
                        partition_id=f"ingest-{start_at}", fields=batches[n % len(batches)])
        nbytes += nbytes_of[n % len(batches)]
        n += 1
    out.put({"samples": n * put_batch, "bytes": nbytes, "cpu_s": time.process_time() - cpu0})
    ray.shutdown()  # not tq.close(): in any process it kills the shared controller


class RayCpu:
    """CPU seconds used by the Ray processes (the driver's descendants that are not
    producers) between ``start`` and ``stop``; processes started in between count from 0."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.before: dict[int, float] = {}

    def _now(self) -> dict[int, float]:
        import psutil

        out = {}
        for p in psutil.Process().children(recursive=True):
            if p.pid in self.exclude:
                continue
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return out

    def start(self) -> None:
        self.before = self._now()

    def stop(self) -> float:
        return sum(v - self.before.get(pid, 0.0) for pid, v in self._now().items())


def tq_ingest(gcs: str, producers: int, put_batch: int, duration: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 8.0 + 1.0 * producers
    procs = [ctx.Process(target=_tq_producer, args=(gcs, k, put_batch, start_at, duration, out))
             for k in range(producers)]
    for p in procs:
        p.start()
    ray_cpu = RayCpu({p.pid for p in procs if p.pid is not None})
    time.sleep(max(0.0, start_at - time.time()))
    ray_cpu.start()
    results = [out.get(timeout=duration + 180) for _ in procs]
    server_cpu = ray_cpu.stop()
    for p in procs:
        p.join()
    nbytes = sum(r["bytes"] for r in results)
    cpu = sum(r["cpu_s"] for r in results) + server_cpu
    return {"system": "transferqueue", "producers": producers, "put_batch": put_batch,
            "samples_per_s": sum(r["samples"] for r in results) / duration,
            "mb_per_s": nbytes / duration / 1e6, "cpu_s_per_gb": cpu / max(nbytes / 1e9, 1e-9),
            "server_cpu_s": server_cpu}


def tq_consume() -> dict[str, Any]:
    """The same 40 global batches as ``brokers.consume``; rank 3 of 8's slice of 20 steps,
    then every step in order, a global batch per ``kv_batch_get``."""
    import transfer_queue as tq

    tables = [payload.rollouts(B, GROUP, seed=1000 + k) for k in range(brokers.STEPS)]
    nbytes = sum(_payload_bytes(t) for t in tables)
    for step, t in enumerate(tables):
        tq.kv_batch_put(keys=[f"s{step}-{i}" for i in range(B)], partition_id="consume",
                        fields=tensordict(t))
    picks = [(k * 7) % brokers.STEPS for k in range(20)]
    slice_s = []
    lo = 3 * (B // WORLD)
    for step in picks:
        t0 = time.perf_counter()
        got = tq.kv_batch_get(keys=[f"s{step}-{i}" for i in range(lo, lo + B // WORLD)],
                              partition_id="consume")
        slice_s.append(time.perf_counter() - t0)
        assert got.batch_size[0] == B // WORLD
    t0 = time.perf_counter()
    for step in range(brokers.STEPS):
        got = tq.kv_batch_get(keys=[f"s{step}-{i}" for i in range(B)], partition_id="consume")
        assert got.batch_size[0] == B
    drain = time.perf_counter() - t0
    slice_s.sort()
    return {"system": "transferqueue", "slice_p50_ms": 1000 * slice_s[len(slice_s) // 2],
            "slice_p90_ms": 1000 * slice_s[int(0.9 * (len(slice_s) - 1))],
            "drain_mb_per_s": nbytes / drain / 1e6,
            "drain_samples_per_s": brokers.STEPS * B / drain}


def _label(run: dict[str, Any]) -> str:
    return run["system"] + (f" ({run['put_batch']}/put)" if "put_batch" in run else "")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    brokers.plot_ingest(axes[0], result["ingest"], _label, rotation=20)
    brokers.plot_consume(axes[1], result["consume"], "drain_mb_per_s",
                         "one consumer drains 40 global batches, MB/s")
    brokers.plot_consume(axes[2], result["consume"], "slice_p50_ms",
                         "one rank's slice (32 of 256), p50 ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def ratios(result: dict[str, Any]) -> dict[str, Any]:
    """Ingest: per repetition, Lakestream over TransferQueue's best put size of that
    repetition, then the median with min-max; the rest from the single consume runs."""
    runs = [x for row in result["ingest"] for x in row["reps"]]

    def mb(system: str, n: int, rep: int) -> float:
        """The system's best configuration at ``n`` producers in repetition ``rep``."""
        return max(r["mb_per_s"] for r in runs
                   if r["system"] == system and r["producers"] == n and r["rep"] == rep)

    each = range(result["reps"])
    con = {r["system"]: r for r in result["consume"]}
    return {
        "ingest_lakestream_over_tq_4p": reps.spread(
            [mb("lakestream", 4, k) / mb("transferqueue", 4, k) for k in each]),
        "ingest_lakestream_over_tq_1p": reps.spread(
            [mb("lakestream", 1, k) / mb("transferqueue", 1, k) for k in each]),
        "drain_lakestream_over_tq_get": con["lakestream"]["drain_mb_per_s"]
        / con["transferqueue"]["drain_mb_per_s"],
        "slice_fetch_lakestream_over_tq": con["lakestream"]["slice_p50_ms"]
        / con["transferqueue"]["slice_p50_ms"],
    }


def main() -> None:
    args = brokers.arguments()
    if os.environ.get(_IN_NETNS) != "1":
        _reexec_in_netns()
    _quiet()
    import ray
    import transfer_queue as tq

    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "versions": {"transferqueue": version("transferqueue"), "ray": version("ray")},
        "command": command("transferqueue"), "ingest": [], "consume": []}
    with tempfile.TemporaryDirectory() as tmp:
        result["consume"].append(brokers.consume("lakestream", tmp))
    t0 = time.perf_counter()
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    tq.init()
    result["tq_init_s"] = time.perf_counter() - t0
    gcs = ray.get_runtime_context().gcs_address
    runs: list[dict[str, Any]] = []
    result["reps"] = args.reps
    try:
        # Interleaved, with the Ray cluster up throughout: both systems run beside it.
        for rep in range(args.reps):
            for n in (1, 4):
                with tempfile.TemporaryDirectory() as tmp:
                    runs.append(brokers.ingest("lakestream", n, args.duration, tmp, None)
                                | {"rep": rep})
                runs += [tq_ingest(gcs, n, put_batch, args.duration) | {"rep": rep}
                         for put_batch in PUT_BATCHES]
        result["consume"].append(tq_consume())
    finally:
        tq.close()
        ray.shutdown()
    result["ingest"] = reps.summarise(runs, brokers.config)
    for r in result["ingest"]:
        print(f"ingest {_label(r):26} {r['producers']} producers {r['samples_per_s']:8.0f} "
              f"samples/s {r['mb_per_s']:7.1f} MB/s {r['cpu_s_per_gb']:6.1f} CPU-s/GB")
    for r in result["consume"]:
        print(f"consume {r['system']:14} slice p50 {r['slice_p50_ms']:6.2f} ms  drain "
              f"{r['drain_mb_per_s']:7.1f} MB/s")
    result["ratios"] = ratios(result)
    print(json.dumps(result["ratios"], indent=1))
    save("transferqueue.json", result)
    plot(result, RESULTS / "transferqueue.png")


if __name__ == "__main__":
    main()
