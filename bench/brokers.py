"""Lakestream beside the brokers a user would pick instead: Redis Streams and NATS JetStream,
on this machine, with the same rollout samples, in one run.

Measured for 1 and 4 producer processes: ingest (samples/s, MB/s of sample payload, CPU-s
per GB over producers and server); produce -> visible latency at a fixed moderate rate; the
time to fetch one rank's slice (32 samples) of a global batch (256); and how fast a consumer
drains what was written. Lakestream runs on the local store (zstd fragments, and the
uncompressed fast path) and on a SeaweedFS S3 server on 127.0.0.1. Kafka cannot run here: no broker
distribution is reachable from these machines.

Run: bench/setup-peers && bench/setup-env && .venv-bench/bin/python -m bench.brokers
Writes bench/results/brokers.json and brokers.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench import payload, reps
from bench.output import RESULTS, command, save
from tests.s3server import start_s3

GROUP, B, WORLD = 16, 256, 8
_HEADER = struct.Struct("<dqqfq")  # sent_at, prompt_id, n_tokens, reward, policy_version


def encode(table: pa.Table, sent_at: float = 0.0) -> list[bytes]:
    """Each sample as a broker message: a small header, then tokens and log-probs as raw
    little-endian arrays (the cheapest honest encoding a broker user would choose)."""
    out = []
    tokens, logprobs = table.column("tokens").combine_chunks(), table.column(
        "logprobs").combine_chunks()
    tv = tokens.values.to_numpy()
    lv = logprobs.values.to_numpy()
    offs = tokens.offsets.to_numpy()
    for i in range(table.num_rows):
        a, b = offs[i], offs[i + 1]
        head = _HEADER.pack(sent_at, table.column("prompt_id")[i].as_py(), b - a,
                            table.column("reward")[i].as_py(),
                            table.column("policy_version")[i].as_py())
        out.append(head + tv[a:b].tobytes() + lv[a:b].tobytes())
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, argv: list[str], port: int) -> None:
        self.port = port
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{argv[0]} did not start")

    def cpu(self) -> float:
        return _cpu(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def redis_server(tmp: str) -> Server:
    port = _free_port()
    return Server(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                   "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                   "--dir", tmp], port)


def nats_server(tmp: str) -> Server:
    port = _free_port()
    return Server(["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", tmp], port)


# -- producers (one process each) ------------------------------------------------------


def _messages(k: int) -> list[bytes]:
    return [m for s in range(4) for m in encode(payload.rollouts(GROUP * 16, GROUP,
                                                                 seed=100 * k + s))]


def _redis_producer(port: int, k: int, start_at: float, duration: float, out: Any) -> None:
    import redis

    msgs = _messages(k)
    r = redis.Redis(port=port)
    time.sleep(max(0.0, start_at - time.time()))
    cpu0, n, nbytes = time.process_time(), 0, 0
    while time.time() < start_at + duration:
        pipe = r.pipeline(transaction=False)
        for _ in range(GROUP * 4):
            m = msgs[n % len(msgs)]
            pipe.xadd("s", {"d": m})
            n += 1
            nbytes += len(m)
        pipe.execute()
    out.put({"samples": n, "bytes": nbytes, "cpu_s": time.process_time() - cpu0})


def _nats_producer(port: int, k: int, start_at: float, duration: float, out: Any,
                   mode: str) -> None:
    import nats

    msgs = _messages(k)

    async def run() -> dict[str, Any]:
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        js = nc.jetstream(publish_async_max_pending=1024)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        cpu0, n, nbytes = time.process_time(), 0, 0
        while time.time() < start_at + duration:
            for _ in range(GROUP * 4):
                m = msgs[n % len(msgs)]
                if mode == "sync":
                    await js.publish("s", m)
                else:
                    await js.publish_async("s", m)
                n += 1
                nbytes += len(m)
        if mode == "async":
            await js.publish_async_completed()
        await nc.close()
        return {"samples": n, "bytes": nbytes, "cpu_s": time.process_time() - cpu0}

    out.put(asyncio.run(run()))


def _lakestream_producer(uri: str, options: dict[str, str] | None, turn: Any, k: int,
                         start_at: float, duration: float, out: Any, compression: str) -> None:
    from bench.floor import floors
    from lakestream.producers import Producer, ProducerOptions

    tables = [payload.rollouts(GROUP, GROUP, seed=100 * k + s) for s in range(16)]
    nbytes_of = [sum(len(m) for m in encode(t)) for t in tables]
    p = Producer(uri, f"p-{k}", storage_options=options,
                 options=ProducerOptions(compression=compression))
    time.sleep(max(0.0, start_at - time.time()))
    cpu0, n = time.process_time(), 0
    while time.time() < start_at + duration:
        p.write(tables[n % len(tables)])
        n += 1
    p.abort()  # what is not committed by the deadline does not count
    cpu = time.process_time() - cpu0
    done = p.stats.fragments_committed
    out.put({"samples": done * GROUP,
             "bytes": sum(nbytes_of[i % len(tables)] for i in range(done)),
             "arrow_bytes": sum(tables[i % len(tables)].nbytes for i in range(done)),
             "cpu_s": cpu})
    # The encode floor and the put alone, in the same process once every producer has
    # reported: the same tables with the producer's options, to the same store; one
    # producer at a time, so that they do not measure each other on 2 cores.
    with turn:
        alone = floors(tables, GROUP, compression, p.stream.store, f"bench-floor/{k}/",
                       FLOOR_CPU_S)
    out.put({"floor_cpu_s_per_gb": alone["encode"], "put_cpu_s_per_gb": alone["put"]})


FLOOR_CPU_S = 1.5
"""CPU seconds each Lakestream producer spends measuring its encode floor after its run."""


def ingest(system: str, producers: int, duration: float, tmp: str,
           s3: dict[str, str] | None, s3_pid: int = 0) -> dict[str, Any]:
    """``producers`` processes writing flat out for ``duration`` seconds. CPU counts the
    producers and the server (Redis, NATS, or the S3 server for Lakestream on S3); for
    Lakestream also against its encode floor (``floor_cpu_s_per_gb``, per GB of Arrow
    data, as ``producer_cpu_s_per_arrow_gb``) and what putting the encoded bodies to the
    same store costs alone (``put_cpu_s_per_gb``, the client's CPU: the producer's)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0 + 0.4 * producers
    server: Server | None = None
    server_pid = 0
    if system.startswith("redis"):
        server = redis_server(tmp)
        target, args = _redis_producer, (server.port,)
    elif system.startswith("nats"):
        server = nats_server(tmp)
        _nats_stream(server.port)
        target, args = _nats_producer, (server.port,)
    else:
        import lakestream

        on_s3 = system.endswith("-s3")
        uri = f"s3://bench/{system}-{producers}-{time.time_ns()}" if on_s3 else \
            f"{tmp}/{system}-{producers}"
        options = s3 if on_s3 else None
        server_pid = s3_pid if on_s3 else 0
        lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=B, group_size=GROUP,
                          storage_options=options)
        target, args = _lakestream_producer, (uri, options, ctx.Lock())
    if server is not None:
        server_pid = server.proc.pid
    extra: tuple[Any, ...] = ()
    if system.startswith("nats"):
        extra = (system.split("-")[1],)
    elif system.startswith("lakestream"):
        extra = (codec(system),)
    procs = [ctx.Process(target=target, args=(*args, k, start_at, duration, out, *extra))
             for k in range(producers)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    server_cpu0 = _cpu(server_pid) if server_pid else 0.0
    results = [out.get(timeout=duration + 120) for _ in procs]
    server_cpu = (_cpu(server_pid) - server_cpu0) if server_pid else 0.0
    floors = [out.get(timeout=60) for _ in procs] if system.startswith("lakestream") else []
    for p in procs:
        p.join()
    samples = sum(r["samples"] for r in results)
    nbytes = sum(r["bytes"] for r in results)
    producer_cpu = sum(r["cpu_s"] for r in results)
    cpu = producer_cpu + server_cpu
    if server is not None:
        server.stop()
    row = {"system": system, "producers": producers, "samples_per_s": samples / duration,
           "mb_per_s": nbytes / duration / 1e6, "cpu_s_per_gb": cpu / max(nbytes / 1e9, 1e-9),
           "server_cpu_s": server_cpu}
    if floors:
        arrow_gb = max(sum(r["arrow_bytes"] for r in results) / 1e9, 1e-9)
        row |= {"codec": extra[0],
                "floor_cpu_s_per_gb": float(np.median([f["floor_cpu_s_per_gb"] for f in floors])),
                "put_cpu_s_per_gb": float(np.median([f["put_cpu_s_per_gb"] for f in floors])),
                "producer_cpu_s_per_arrow_gb": producer_cpu / arrow_gb}
        row["over_floor"] = row["producer_cpu_s_per_arrow_gb"] / row["floor_cpu_s_per_gb"]
    return row


def codec(system: str) -> str:
    """The codec a Lakestream system of this benchmark writes with: ``-none`` says none,
    else the producer's default."""
    from lakestream.producers import ProducerOptions

    return "none" if "none" in system else ProducerOptions().compression


def _nats_stream(port: int) -> None:
    import nats
    from nats.js.api import StorageType, StreamConfig

    async def run() -> None:
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        await nc.jetstream().add_stream(StreamConfig(name="S", subjects=["s"],
                                                     storage=StorageType.FILE))
        await nc.close()

    asyncio.run(run())


# -- produce -> visible latency at a moderate rate ---------------------------------------

RATE_GROUPS_PER_S = 12.5  # 200 samples/s


def _paced_sender(system: str, where: Any, start_at: float, duration: float, out: Any) -> None:
    """One producer sending a group of 16 every 80 ms; reports when it sent each group."""
    table = payload.rollouts(GROUP, GROUP, seed=7)
    sent: list[float] = []
    time.sleep(max(0.0, start_at - time.time()))
    if system == "redis":
        import redis

        r = redis.Redis(port=where)
        for g in range(int(duration * RATE_GROUPS_PER_S)):
            time.sleep(max(0.0, start_at + g / RATE_GROUPS_PER_S - time.time()))
            pipe = r.pipeline(transaction=False)
            for m in encode(table, time.time()):
                pipe.xadd("s", {"d": m})
            pipe.execute()
    elif system == "nats":
        import nats

        async def run() -> None:
            nc = await nats.connect(f"nats://127.0.0.1:{where}")
            js = nc.jetstream()
            for g in range(int(duration * RATE_GROUPS_PER_S)):
                await asyncio.sleep(max(0.0, start_at + g / RATE_GROUPS_PER_S - time.time()))
                for m in encode(table, time.time()):
                    await js.publish_async("s", m)
                await js.publish_async_completed()
            await nc.close()

        asyncio.run(run())
    else:
        from lakestream.producers import Producer

        uri, options = where
        with Producer(uri, "paced", storage_options=options) as p:
            for g in range(int(duration * RATE_GROUPS_PER_S)):
                time.sleep(max(0.0, start_at + g / RATE_GROUPS_PER_S - time.time()))
                sent.append(time.time())
                p.write(table)
    out.put(sent)


def latency(system: str, tmp: str, s3: dict[str, str] | None, duration: float = 6.0) -> dict[
        str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0
    seen: list[float] = []  # latency of each sample (brokers) or group (lakestream)
    server: Server | None = None
    groups = int(duration * RATE_GROUPS_PER_S)
    if system == "redis":
        import redis

        server = redis_server(tmp)
        proc = ctx.Process(target=_paced_sender, args=(system, server.port, start_at, duration,
                                                       out))
        proc.start()
        r, last = redis.Redis(port=server.port), "0-0"
        while len(seen) < groups * GROUP:
            for _stream, entries in r.xread({"s": last}, block=1000, count=256) or []:
                now = time.time()
                for entry_id, fields in entries:
                    last = entry_id
                    seen.append(now - _HEADER.unpack_from(fields[b"d"])[0])
    elif system == "nats":
        import nats

        server = nats_server(tmp)
        _nats_stream(server.port)
        proc = ctx.Process(target=_paced_sender, args=(system, server.port, start_at, duration,
                                                       out))
        proc.start()

        async def consume() -> None:
            nc = await nats.connect(f"nats://127.0.0.1:{server.port}")  # type: ignore[union-attr]
            sub = await nc.jetstream().subscribe("s")
            while len(seen) < groups * GROUP:
                msg = await sub.next_msg(timeout=10)
                seen.append(time.time() - _HEADER.unpack_from(msg.data)[0])
                await msg.ack()
            await nc.close()

        asyncio.run(consume())
    else:
        import lakestream

        on_s3 = system.endswith("-s3")
        uri = f"s3://bench/lat-{time.time_ns()}" if on_s3 else f"{tmp}/lat"
        options = s3 if on_s3 else None
        s = lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=B,
                              group_size=GROUP, storage_options=options)
        proc = ctx.Process(target=_paced_sender, args=(system, (uri, options), start_at,
                                                       duration, out))
        proc.start()
        visible_at: list[float] = []
        while len(visible_at) < groups:
            time.sleep(0.005)  # the loader's shortest poll
            s.refresh()
            now = time.time()
            visible_at += [now] * (s.num_samples // GROUP - len(visible_at))
    sent = out.get(timeout=60)
    proc.join()
    if server is not None:
        server.stop()
    if sent:
        seen = [v - t for v, t in zip(visible_at, sent, strict=True)]
    seen.sort()
    return {"system": system, "p50_ms": 1000 * seen[len(seen) // 2],
            "p99_ms": 1000 * seen[int(0.99 * (len(seen) - 1))], "n": len(seen)}


# -- consuming: one rank's slice of a global batch, and draining everything -----------------

STEPS = 40


def consume(system: str, tmp: str) -> dict[str, Any]:
    """Writes STEPS global batches, then times fetching rank 3 of 8's slice of 20 steps and
    draining everything in order."""
    tables = [payload.rollouts(B, GROUP, seed=1000 + k) for k in range(STEPS)]
    msgs = [m for t in tables for m in encode(t)]
    nbytes = sum(len(m) for m in msgs)
    picks = [(k * 7) % STEPS for k in range(20)]
    slice_s: list[float] = []
    if system == "redis":
        import redis

        server = redis_server(tmp)
        r = redis.Redis(port=server.port)
        ids = []
        for i in range(0, len(msgs), 256):
            pipe = r.pipeline(transaction=False)
            for m in msgs[i:i + 256]:
                pipe.xadd("s", {"d": m})
            ids += pipe.execute()
        for step in picks:
            t0 = time.perf_counter()
            got = r.xrange("s", min=ids[step * B + 3 * (B // WORLD)], count=B // WORLD)
            slice_s.append(time.perf_counter() - t0)
            assert len(got) == B // WORLD
        t0, n, last = time.perf_counter(), 0, "-"
        while n < len(msgs):
            got = r.xrange("s", min=last, count=1024)
            got = got[1:] if last != "-" else got
            n += len(got)
            last = got[-1][0]
        drain = time.perf_counter() - t0
        server.stop()
    elif system == "nats":
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        server = nats_server(tmp)
        _nats_stream(server.port)

        async def run() -> float:
            nc = await nats.connect(f"nats://127.0.0.1:{server.port}")
            js = nc.jetstream(publish_async_max_pending=1024)
            for m in msgs:
                await js.publish_async("s", m)
            await js.publish_async_completed()
            for step in picks:
                t0 = time.perf_counter()
                sub = await js.pull_subscribe("s", config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE, ack_policy=AckPolicy.NONE,
                    opt_start_seq=1 + step * B + 3 * (B // WORLD)))
                got = []
                while len(got) < B // WORLD:
                    got += await sub.fetch(B // WORLD - len(got), timeout=5)
                slice_s.append(time.perf_counter() - t0)
                await sub.unsubscribe()
            t0, n = time.perf_counter(), 0
            # No acks: a consumer that tracks its own position, like a trainer rank (the
            # default explicit acks would stall at 1,000 unacknowledged messages).
            sub = await js.pull_subscribe("s", config=ConsumerConfig(
                deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE))
            while n < len(msgs):
                batch = await sub.fetch(256, timeout=5)
                n += len(batch)
            elapsed = time.perf_counter() - t0
            await nc.close()
            return elapsed

        drain = asyncio.run(run())
        server.stop()
    else:
        import lakestream

        uri = f"{tmp}/consume"
        s = lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=B,
                              group_size=GROUP)
        for t in tables:
            for g in range(0, B, 64):
                s.append(t.slice(g, 64))  # fragments of 64 samples, as producers write them
        for step in picks:
            reader = lakestream.open(uri)  # a fresh handle: no cached footers
            t0 = time.perf_counter()
            got = reader.read_step(step, rank=3, world_size=WORLD)
            slice_s.append(time.perf_counter() - t0)
            assert got.num_rows == B // WORLD
        from lakestream.loaders import StreamDataset

        t0 = time.perf_counter()
        n = sum(1 for _ in StreamDataset(uri, group=None, rank=0, world_size=1, max_steps=STEPS,
                                         collate=lambda t: t.num_rows))
        drain = time.perf_counter() - t0
        assert n == STEPS
    slice_s.sort()
    return {"system": system, "slice_p50_ms": 1000 * slice_s[len(slice_s) // 2],
            "slice_p90_ms": 1000 * slice_s[int(0.9 * (len(slice_s) - 1))],
            "drain_mb_per_s": nbytes / drain / 1e6, "drain_samples_per_s": len(msgs) / drain}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    plot_ingest(axes[0], result["ingest"], lambda r: r["system"], rotation=30)
    lat = result["latency"]
    axes[1].bar(range(len(lat)), [r["p50_ms"] for r in lat], label="p50")
    axes[1].scatter(range(len(lat)), [r["p99_ms"] for r in lat], color="black", label="p99",
                    zorder=3)
    axes[1].set_xticks(range(len(lat)), [r["system"] for r in lat], rotation=30, ha="right",
                       fontsize=8)
    axes[1].set_yscale("log")
    axes[1].set_title("produce -> visible, ms (200 samples/s)")
    axes[1].legend()
    plot_consume(axes[2], result["consume"], "drain_mb_per_s", "consumer drain, MB/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_ingest(ax: Any, runs: list[dict[str, Any]], label: Any, rotation: int = 0) -> None:
    """MB/s of each ingest configuration (median, min-max bars), 1 and 4 producers side by
    side."""
    for k, n in enumerate((1, 4)):
        rows = [r for r in runs if r["producers"] == n]
        mid = [r["mb_per_s"] for r in rows]
        err = [[m - r.get("mb_per_s_min", m) for m, r in zip(mid, rows, strict=True)],
               [r.get("mb_per_s_max", m) - m for m, r in zip(mid, rows, strict=True)]]
        ax.bar([x + 0.4 * k for x in range(len(rows))], mid, yerr=err, capsize=2,
               width=0.4, label=f"{n} producer{'s' if n > 1 else ''}")
        ax.set_xticks(range(len(rows)), [label(r) for r in rows], rotation=rotation,
                      ha="right" if rotation else "center", fontsize=8)
    ax.set_title("ingest, MB/s of sample payload (median, min-max)")
    ax.legend()


def plot_consume(ax: Any, runs: list[dict[str, Any]], field: str, title: str) -> None:
    ax.bar(range(len(runs)), [r[field] for r in runs])
    ax.set_xticks(range(len(runs)), [r["system"] for r in runs], fontsize=8)
    ax.set_title(title)


def arguments() -> argparse.Namespace:
    """The command line of an ingest comparison (this one, and ``bench/transferqueue.py``'s):
    seconds a run, and interleaved repetitions."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--reps", type=int, default=3,
                        help="interleaved repetitions of every ingest run")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    for tool in ("redis-server", "nats-server"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: run bench/setup-peers")
    server = start_s3("bench")
    s3 = server.options()
    versions = {"redis-server": subprocess.run(["redis-server", "--version"], capture_output=True,
                                               text=True).stdout.strip(),
                "nats-server": subprocess.run(["nats-server", "--version"], capture_output=True,
                                              text=True).stdout.strip()}
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "s3": "SeaweedFS 4.48 on 127.0.0.1"},
        "versions": versions, "command": command("brokers"),
        "sample_bytes": float(np.mean([len(m) for m in encode(payload.rollouts(256, GROUP))])),
        "ingest": [], "latency": [], "consume": []}
    systems = ["redis", "nats-sync", "nats-async", "lakestream", "lakestream-none",
               "lakestream-s3"]
    result["reps"] = args.reps
    runs: list[dict[str, Any]] = []
    try:
        for rep in range(args.reps):  # A B C ... A B C ...: drift hits every system alike
            for n in (1, 4):
                for system in systems:
                    with tempfile.TemporaryDirectory() as tmp:
                        r = ingest(system, n, args.duration, tmp, s3, server.pid) | {"rep": rep}
                    runs.append(r)
                    print(f"rep {rep} ingest {system:16} {n} producers "
                          f"{r['samples_per_s']:8.0f} samples/s {r['mb_per_s']:7.1f} MB/s "
                          f"{r['cpu_s_per_gb']:6.1f} CPU-s/GB"
                          + (f" ({r['over_floor']:.2f}x its encode floor)"
                             if "over_floor" in r else ""), flush=True)
        result["ingest"] = reps.summarise(runs, config)
        for system in ("redis", "nats", "lakestream", "lakestream-s3"):
            with tempfile.TemporaryDirectory() as tmp:
                r = latency(system, tmp, s3)
            result["latency"].append(r)
            print(f"latency {system:14} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms",
                  flush=True)
        for system in ("redis", "nats", "lakestream"):
            with tempfile.TemporaryDirectory() as tmp:
                r = consume(system, tmp)
            result["consume"].append(r)
            print(f"consume {system:10} slice p50 {r['slice_p50_ms']:6.2f} ms  drain "
                  f"{r['drain_mb_per_s']:7.1f} MB/s", flush=True)
    finally:
        server.stop()
    result["ratios"] = ratios(result)
    print(json.dumps(result["ratios"], indent=1))
    save("brokers.json", result)
    plot(result, RESULTS / "brokers.png")


def config(r: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two ingest runs repetitions of one configuration."""
    return r["system"], r["producers"], r.get("put_batch")


def ratios(result: dict[str, Any]) -> dict[str, Any]:
    """Ingest ratios at 4 producers: per repetition (systems of one repetition ran back to
    back), then their median with min-max; the rest from the single consume runs."""
    runs = [x for row in result["ingest"] for x in row["reps"]]

    def mb(system: str, rep: int) -> float:
        return next(r["mb_per_s"] for r in runs
                    if r["system"] == system and r["producers"] == 4 and r["rep"] == rep)

    each = range(result["reps"])
    nats_best = {k: max(mb("nats-sync", k), mb("nats-async", k)) for k in each}
    con = {r["system"]: r for r in result["consume"]}
    return {
        "ingest_lakestream_default_over_redis_4p":
            reps.spread([mb("lakestream", k) / mb("redis", k) for k in each]),
        "ingest_lakestream_none_over_redis_4p":
            reps.spread([mb("lakestream-none", k) / mb("redis", k) for k in each]),
        "ingest_lakestream_none_over_nats_best_4p":
            reps.spread([mb("lakestream-none", k) / nats_best[k] for k in each]),
        "over_floor": {f"{r['system']}_{r['producers']}p": r["over_floor"]
                       for r in result["ingest"] if "over_floor" in r},
        "drain_lakestream_over_nats": con["lakestream"]["drain_mb_per_s"]
        / con["nats"]["drain_mb_per_s"],
        "drain_lakestream_over_redis": con["lakestream"]["drain_mb_per_s"]
        / con["redis"]["drain_mb_per_s"],
        "slice_fetch_lakestream_over_nats": con["lakestream"]["slice_p50_ms"]
        / con["nats"]["slice_p50_ms"],
        "slice_fetch_lakestream_over_redis": con["lakestream"]["slice_p50_ms"]
        / con["redis"]["slice_p50_ms"],
    }


if __name__ == "__main__":
    main()
