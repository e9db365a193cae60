"""A short asynchronous-RL style run on a local stream.

Two rollout producer processes write GRPO groups (4 responses per prompt) with a prompt
cursor as their committed state and a staleness bound; a trainer process reads every step
through ``StreamDataset`` and publishes its progress. One producer is SIGKILLed midway and
restarted: it resumes from its committed cursor. At the end the job checks that every
prompt's group was committed exactly once and that the trainer read every step once, in
order, each step matching ``read_step``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

import lakestream
from lakestream.producers import Producer

G, B = 4, 16
SCHEMA = pa.schema([
    ("prompt_id", pa.int64()),
    ("tokens", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),
    ("reward", pa.float32()),
    ("policy_version", pa.int64()),
])


def group(prompt: int, policy_version: int) -> pa.Table:
    """G synthetic responses to one prompt; generation time grows with length."""
    rng = np.random.default_rng(prompt)
    lengths = rng.integers(16, 256, size=G)
    time.sleep(float(lengths.sum()) * 2e-6)
    return pa.table({
        "prompt_id": pa.array([prompt] * G, pa.int64()),
        "tokens": pa.array([rng.integers(0, 32000, n).astype(np.int32) for n in lengths],
                           pa.list_(pa.int32())),
        "logprobs": pa.array([-rng.exponential(1.0, n).astype(np.float32) for n in lengths],
                             pa.list_(pa.float32())),
        "reward": pa.array(rng.random(G).astype(np.float32)),
        "policy_version": pa.array([policy_version] * G, pa.int64()),
    }, schema=SCHEMA)


def producer(uri: str, index: int, prompts: int) -> None:
    """Writes prompts index, index+2, ... resuming from the committed cursor."""
    from lakestream.progress import read_progress

    with Producer(uri, f"rollout-{index}", max_lag_steps=4) as p:
        k = p.state["next"] if p.state else 0
        while k < prompts:
            progress = read_progress(p.stream.store, "train")
            version = progress.policy_version if progress and progress.policy_version else 0
            p.write(group(2 * k + index, version), state={"next": k + 1})
            k += 1


def trainer(uri: str, steps: int, out: Any) -> None:
    from lakestream.loaders import StreamDataset

    ds = StreamDataset(uri, rank=0, world_size=1, max_steps=steps, timeout=120,
                       progress_interval_s=0.1)
    seen, waits = [], []
    t = time.perf_counter()
    for batch in ds:
        waits.append(time.perf_counter() - t)
        ds.policy_version = int(batch["step"]) + 1  # one optimizer step per batch
        seen.append((int(batch["step"]), [int(x) for x in batch["prompt_id"]]))
        time.sleep(0.02)  # the "training" step
        t = time.perf_counter()
    reader = ds.last_reader
    lat = sorted(reader.read_latencies_s) if reader else [0.0]
    out.put({"seen": seen, "wait_s": sum(waits),
             "p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(len(lat) * 0.99)]})


def run(root: str, prompts: int = 400) -> bool:
    uri = f"{root}/rollouts"
    s = lakestream.create(uri, SCHEMA, global_batch_size=B, group_size=G)
    print(f"stream: {uri}")
    steps = prompts * G // B
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    t0 = time.time()
    train = ctx.Process(target=trainer, args=(uri, steps, out))
    producers = [ctx.Process(target=producer, args=(uri, i, prompts // 2)) for i in range(2)]
    for p in (train, *producers):
        p.start()
    time.sleep(2.0)
    os.kill(producers[0].pid or 0, signal.SIGKILL)
    producers[0].join()
    print("fault: rollout-0 SIGKILLed; restarting it from its committed cursor")
    producers[0] = ctx.Process(target=producer, args=(uri, 0, prompts // 2))
    producers[0].start()
    result = out.get(timeout=600)
    for p in (train, *producers):
        p.join(timeout=120)
    wall = time.time() - t0
    s.refresh()
    counts = Counter(pid for step in range(s.num_steps)
                     for pid in s.read_step(step, columns=["prompt_id"])["prompt_id"].to_pylist())
    exactly_once = sorted(counts) == list(range(prompts)) and set(counts.values()) == {G}
    in_order = [step for step, _ in result["seen"]] == list(range(steps))
    same = all(ids == s.read_step(step, columns=["prompt_id"])["prompt_id"].to_pylist()
               for step, ids in result["seen"])
    print(f"{'samples committed':<28}{s.num_samples:>10}")
    print(f"{'producer samples/s':<28}{s.num_samples / wall:>10.0f}")
    print(f"{'log versions':<28}{s.version:>10}")
    print(f"{'step read p50 / p99 (ms)':<28}{result['p50_ms']:>5.1f} / {result['p99_ms']:.1f}")
    print(f"{'trainer waited for data (s)':<28}{result['wait_s']:>10.2f}")
    print(f"every prompt committed exactly once: {'yes' if exactly_once else 'NO'}")
    print(f"trainer read every step once, in order, as committed: "
          f"{'yes' if in_order and same else 'NO'}")
    return exactly_once and in_order and same


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="lakestream-demo-") as root:
        ok = run(root)
    print("verifications passed" if ok else "VERIFICATION FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
