"""The main job: an asynchronous RL pipeline on a local stream, with faults, verified.

Three rollout producer processes write GRPO groups (4 responses per prompt) with a prompt
cursor as their committed state, admitted within ``max_lag_steps``; a trainer of two gloo
ranks trains a tiny policy with DDP over ``StreamDataset``, which drops groups staler than
``max_lag_steps`` (refilling the step), skips groups whose rewards are all equal (DAPO) and
deals each step's groups to ranks by tokens; it saves a distributed checkpoint every few
steps (marker + retention keep_last=2). Midway one producer and then the whole trainer are
SIGKILLed and restarted. When training is over the producers stop. At the end the job
verifies what it promises and prints a summary.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lakestream
from lakestream.demo.rollout import SCHEMA, G
from lakestream.log.progress import read_progress


@dataclass(frozen=True)
class DemoConfig:
    steps: int = 1500
    global_batch_size: int = 16
    producers: int = 3
    ranks: int = 2
    checkpoint_every: int = 25
    max_lag_steps: int = 4
    kill_producer_at_step: int = 300
    kill_trainer_at_step: int = 820

    @property
    def prompts(self) -> int:
        """What the producers may generate: the steps' worth, and room for the groups the
        trainer skips."""
        return self.steps * self.global_batch_size // G * 8 // 5


class _Stop:
    """SIGINT and SIGTERM under ``main``: each raises KeyboardInterrupt, except while a child
    is being started and recorded, when it waits for the record (a child started but not
    recorded would outlive the job). A blocked signal mask would do it more simply, but
    children inherit the mask across exec."""

    recording = False
    pending: int | None = None

    @classmethod
    def handle(cls, signum: int, frame: object) -> None:
        if cls.recording:
            cls.pending = signum
            return
        for n in (signal.SIGINT, signal.SIGTERM):  # a second one must not stop the cleanup
            signal.signal(n, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(signum).name)


def _spawn(children: list[subprocess.Popen[bytes]], cwd: Path, module: str,
           *args: Any) -> subprocess.Popen[bytes]:
    """Starts ``python -m module args`` in ``cwd`` (the demo's own fresh folder: ``-m`` puts
    the working directory first on ``sys.path``, so a ``lakestream/`` folder where the demo
    was launched would be imported in place of the installed package) and records it in
    ``children`` before a stopping signal can interrupt (``_Stop``)."""
    _Stop.recording = True
    try:
        child = subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=cwd,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        children.append(child)
    finally:
        _Stop.recording = False
    if _Stop.pending is not None:
        _Stop.handle(_Stop.pending, None)
    return child


def stop_children(children: list[subprocess.Popen[bytes]], grace_s: float = 5.0) -> int:
    """Stops every child still running, by its PID: SIGTERM, then SIGKILL after ``grace_s``.
    Returns how many were running."""
    running = [c for c in children if c.poll() is None]
    for c in running:
        c.terminate()
    deadline = time.monotonic() + grace_s
    for c in running:
        try:
            c.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.kill()
            c.communicate()
    return len(running)


class Pipeline:
    def __init__(self, root: str, cfg: DemoConfig) -> None:
        self.root, self.cfg = Path(root), cfg
        self.uri = str(self.root / "rollouts")
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True)
        self.done = self.logs / "training-done"
        """Created when the trainer has finished: producers stop generating."""
        self.stream = lakestream.create(self.uri, SCHEMA, global_batch_size=cfg.global_batch_size,
                                        group_size=G)
        self.producers: dict[int, subprocess.Popen[bytes]] = {}
        self.children: list[subprocess.Popen[bytes]] = []
        """Every process this pipeline started, killed or not (``stop_children``)."""
        self.trainer: list[subprocess.Popen[bytes]] = []
        self.timeline: list[dict[str, float]] = []
        self.t0 = time.time()
        self.trainer_runs = 0
        self.faults: list[tuple[float, str]] = []

    def start_producer(self, i: int) -> None:
        per = -(-self.cfg.prompts // self.cfg.producers)
        prompts = min(per, max(0, (self.cfg.prompts - i + self.cfg.producers - 1)
                               // self.cfg.producers))
        self.producers[i] = _spawn(self.children, self.root, "lakestream.demo.rollout",
                                   self.uri, i, self.cfg.producers, prompts,
                                   self.cfg.max_lag_steps, self.logs / "producers.jsonl",
                                   self.done)

    def start_trainer(self) -> None:
        self.trainer_runs += 1
        init = self.logs / f"init-{self.trainer_runs}"
        self.trainer = [_spawn(self.children, self.root, "lakestream.demo.trainer", self.uri,
                               r, self.cfg.ranks, init, self.cfg.steps,
                               self.cfg.checkpoint_every, self.logs, self.cfg.max_lag_steps)
                        for r in range(self.cfg.ranks)]

    def trainer_step(self) -> int:
        """Steps trained so far: the policy version the trainer publishes (its progress step
        counts the stream's steps it has read past, skipped groups included)."""
        progress = read_progress(self.stream.store, "train")
        return progress.policy_version or 0 if progress else 0

    def tick(self) -> None:
        self.stream.refresh()
        self.timeline.append({"t": time.time() - self.t0, "samples": self.stream.num_samples,
                              "steps": self.stream.num_steps, "trained": self.trainer_step()})

    def run(self) -> None:
        cfg = self.cfg
        for i in range(cfg.producers):
            self.start_producer(i)
        self.start_trainer()
        producer_killed = trainer_killed = False
        last_print = 0.0
        while True:
            time.sleep(0.2)
            self.tick()
            trained = self.timeline[-1]["trained"]
            if not producer_killed and trained >= cfg.kill_producer_at_step:
                os.kill(self.producers[1].pid, signal.SIGKILL)
                self.producers[1].wait()
                print(f"  fault: rollout-1 SIGKILLed at trainer step {trained}; restarting it")
                self.faults.append((time.time() - self.t0, "producer killed"))
                self.start_producer(1)
                producer_killed = True
            if not trainer_killed and trained >= cfg.kill_trainer_at_step:
                for p in self.trainer:
                    os.kill(p.pid, signal.SIGKILL)
                for p in self.trainer:
                    p.wait()
                marker = self.stream.checkpoints("train")[-1]
                print(f"  fault: trainer SIGKILLed at step {trained}; restarting from its "
                      f"last checkpoint, {Path(marker.checkpoint_id or '?').name} (its marker "
                      f"holds the stream from step {marker.step})")
                self.faults.append((time.time() - self.t0, "trainer killed"))
                self.start_trainer()
                trainer_killed = True
            now = time.time() - self.t0
            if now - last_print >= 3:
                last_print = now
                tl = self.timeline[-1]
                print(f"  t={now:5.1f}s  committed steps {int(tl['steps']):4d}  trained "
                      f"{int(tl['trained']):4d}/{cfg.steps}  log version {self.stream.version}",
                      flush=True)
            if all(p.poll() is not None for p in self.trainer):
                self.done.touch()
                break
        for p in [*self.producers.values(), *self.trainer]:
            _, err = p.communicate(timeout=120)
            if p.returncode:
                raise RuntimeError(f"a demo process failed ({p.returncode}): "
                                   f"{err.decode()[-2000:]}")
        self.tick()


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def verify(pipe: Pipeline) -> tuple[dict[str, bool], dict[str, Any]]:
    cfg, s = pipe.cfg, pipe.stream
    s.refresh()
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(pipe.logs.glob("rank*.jsonl")):
        runs[path.name] = _read_jsonl(path)
    by_rank_step: dict[tuple[int, int], list[list[list[int]]]] = {}
    for name, rows in runs.items():
        rank = int(name.split("-")[0][4:])
        for r in rows:
            by_rank_step.setdefault((rank, r["step"]), []).append(r["ids"])
    # The steps read twice (after the trainer restart) must be identical on each rank.
    reread = {k: v for k, v in by_rank_step.items() if len(v) > 1}
    same_after_restart = all(all(x == v[0] for x in v) for v in reread.values())
    trained: Counter[tuple[int, int]] = Counter()
    for (_rank, _step), reads in by_rank_step.items():
        for pid, resp in reads[0]:
            trained[(pid, resp)] += 1
    # What the producers committed: producer i's prompts cursor * producers + i below the
    # cursor its committed state holds.
    committed = {(c * cfg.producers + int(pid.rsplit("-", 1)[1]), r)
                 for pid, (_, _, state) in s.producers.items() if state
                 for c in range(state["cursor"]) for r in range(G)}
    every_step = {k[1] for k in by_rank_step} == set(range(cfg.steps))
    # Every step's policy counts, from its first read (every rank agrees).
    first: dict[int, dict[str, Any]] = {}
    for rows in runs.values():
        for r in rows:
            first.setdefault(r["step"], r)
    dropped = sum(r["read_policy"]["stale_dropped"] for r in first.values())
    filtered = sum(r["read_policy"]["filtered"] for r in first.values())
    cursor = max(r["cursor"] for p in pipe.logs.glob("reads-rank*.json")
                 for r in _read_jsonl(p))
    # Below the trainer's final cursor, each committed sample was trained or skipped.
    exactly_once = (set(trained) <= committed and set(trained.values()) == {1}
                    and s.num_samples == len(committed) and every_step
                    and len(trained) + dropped + filtered == cursor)
    groups: dict[tuple[int, int], list[float]] = {}
    for rows in runs.values():
        for r in rows:
            for (pid, _), reward in zip(r["ids"], r["rewards"], strict=True):
                groups.setdefault((r["step"], pid), []).append(reward)
    no_flat_group = all(min(g) != max(g) for g in groups.values())
    staleness: Counter[int] = Counter()
    by_step: dict[int, list[int]] = {}
    for rows in runs.values():
        for r in rows:
            for v in r["versions"]:
                staleness[r["step"] - v] += 1
                by_step.setdefault(r["step"], []).append(r["step"] - v)
    # Admission keeps most samples within max_lag_steps; the read-time policy drops the
    # rest (other producers' groups landing first, progress published late), so what is
    # trained holds the bound exactly.
    bound = cfg.max_lag_steps
    staleness_held = max(staleness) <= bound
    kept = [m.step for m in s.checkpoints("train")[-2:]]
    reclaim_ok = s.state.reclaimed_below <= min(kept) * cfg.global_batch_size
    from deltalake import DeltaTable, QueryBuilder

    q = QueryBuilder().register("t", DeltaTable(pipe.uri))
    delta_rows = q.execute("select count(*) as n from t").read_all()
    import pyarrow as pa

    delta_count = int(pa.table(delta_rows).column("n")[0].as_py())
    delta_ok = delta_count == s.num_samples - s.state.reclaimed_below
    # The samples retention kept, each once and each one the producers wrote (the reclaimed
    # ones are gone: the count above and the trained ones speak for them).
    live = pa.table(q.execute("select prompt_id, response from t").read_all())
    remaining = list(zip(live.column("prompt_id").to_pylist(),
                         live.column("response").to_pylist(), strict=True))
    exactly_once = exactly_once and len(set(remaining)) == len(remaining) \
        and set(remaining) <= committed
    checks = {
        "every produced sample committed exactly once, and trained once or skipped by the "
        "read policy": exactly_once,
        f"the {len({k[1] for k in reread})} steps re-read after the trainer restart equal the "
        "first reads, rank by rank": same_after_restart,
        f"staleness bound held (max {max(staleness)} <= {bound} steps; {dropped} stale samples "
        "dropped)": staleness_held,
        f"no trained group has all-equal rewards ({filtered} samples skipped)": no_flat_group,
        f"reclaimed only below the oldest retained checkpoint (step {min(kept)})": reclaim_ok,
        f"deltalake reads the {delta_count} remaining samples": delta_ok,
    }
    return checks, {"staleness": dict(sorted(staleness.items())), "reread_steps": len(reread),
                    "stale_dropped": dropped, "filtered": filtered,
                    "staleness_by_step": {k: (sum(v) / len(v), max(v))
                                          for k, v in sorted(by_step.items())}}


def summary(pipe: Pipeline, facts: dict[str, Any]) -> list[str]:
    s = pipe.stream
    prod = _read_jsonl(pipe.logs / "producers.jsonl")
    reads = [r for p in pipe.logs.glob("reads-rank*.json") for r in _read_jsonl(p)]
    lat = sorted(x for r in reads for x in r["latencies_s"]) or [0.0]
    wall = pipe.timeline[-1]["t"]
    live = sum(int(cols.size.sum()) for cols in s.state.index.columns())
    mb = (live + _reclaimed_bytes(s)) / 1e6
    commits = sum(p["commits"] for p in prod)
    attempts = sum(p["attempts"] for p in prod)
    reclaimed = _reclaimed_bytes(s)
    rows = [
        ("producer samples/s", f"{s.num_samples / wall:.0f}"),
        ("producer MB/s (Parquet, zstd)", f"{mb / wall:.2f}"),
        ("commits / conflicts", f"{commits} / {sum(p['conflicts'] for p in prod)} "
                                f"in {attempts} attempts (instances that finished)"),
        ("fragments per commit", f"{sum(p['fragments'] for p in prod) / max(1, commits):.2f}"),
        ("step read latency p50 / p99", f"{1000 * lat[len(lat) // 2]:.1f} / "
                                        f"{1000 * lat[int(0.99 * (len(lat) - 1))]:.1f} ms"),
        ("trainer time waiting for data", f"{sum(r['wait_s'] for r in reads):.1f} s "
                                          f"(over ranks, last run)"),
        ("staleness histogram (steps: samples)",
         ", ".join(f"{k}: {v}" for k, v in facts["staleness"].items())),
        ("skipped by the read policy", f"{facts['stale_dropped']} stale, {facts['filtered']} "
                                       "with all-equal rewards (samples)"),
        ("bytes reclaimed", f"{reclaimed}"),
        ("log versions", f"{s.version}"),
    ]
    width = max(len(k) for k, _ in rows)
    return [f"  {k:<{width}}  {v}" for k, v in rows]


def _reclaimed_bytes(s: lakestream.Stream) -> int:
    from lakestream.log.entries import Reclaim
    from lakestream.log.tail import read_entry

    total = 0
    for v in s.state.reclaim_versions:
        entry = read_entry(s.store, v)
        if isinstance(entry, Reclaim):
            total += sum(f.size for f in entry.removed)
    return total


def plot(pipe: Pipeline, facts: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = pipe.timeline
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4))
    t = [x["t"] for x in tl]
    a.plot(t, [x["samples"] for x in tl], label="committed samples")
    a.plot(t, [x["trained"] * pipe.cfg.global_batch_size for x in tl], label="trained samples")
    for at, what in pipe.faults:
        a.axvline(at, color="red", lw=0.8, ls="--")
        a.annotate(what, (at, 0), rotation=90, fontsize=7, va="bottom", ha="right")
    a.set_xlabel("seconds")
    a.legend()
    a.set_title("throughput (dashed: faults)")
    # When each step was first trained: the first tick whose trainer progress passed it.
    steps = facts["staleness_by_step"]
    first_seen: dict[int, float] = {}
    for x in tl:
        for k in range(len(first_seen), min(int(x["trained"]), len(steps))):
            first_seen[k] = x["t"]
    when = [first_seen.get(k, t[-1]) for k in steps]
    b.plot(when, [m for m, _ in steps.values()], ".", ms=2, label="mean over the step")
    b.plot(when, [x for _, x in steps.values()], ".", ms=2, label="max over the step")
    b.axhline(pipe.cfg.max_lag_steps, color="grey", lw=0.8, ls=":",
              label="max_lag_steps = max_staleness")
    b.set_xlabel("seconds")
    b.set_title("staleness over time (trained step - policy version)")
    b.legend()
    hist = facts["staleness"]
    c.bar(list(hist), list(hist.values()))
    c.set_xlabel("staleness (steps)")
    c.set_title(f"staleness histogram, max_lag_steps = max_staleness = "
                f"{pipe.cfg.max_lag_steps}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def run(root: str, cfg: DemoConfig | None = None, plot_path: Path | None = None) -> bool:
    cfg = cfg or DemoConfig()
    pipe = Pipeline(root, cfg)
    print(f"stream: {pipe.uri}")
    print(f"{cfg.producers} rollout producers, a trainer of {cfg.ranks} gloo ranks, "
          f"{cfg.steps} steps of {cfg.global_batch_size} samples")
    try:
        pipe.run()
    finally:  # interrupted or failed: no child outlives the job
        stop_children(pipe.children)
    checks, facts = verify(pipe)
    for line in summary(pipe, facts):
        print(line)
    if plot_path is not None:
        plot(pipe, facts, plot_path)
        print(f"plot: {plot_path}")
    for text, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {text}")
    return all(checks.values())


def main() -> int:
    """Runs the job in a fresh temporary folder, which it leaves for inspection (the stream,
    the logs, the plot). SIGTERM (what ``timeout``, CI cancellation and schedulers send) stops
    it as Ctrl-C does: every child is stopped by its PID and the folder is removed."""
    previous = {n: signal.signal(n, _Stop.handle) for n in (signal.SIGINT, signal.SIGTERM)}
    root = tempfile.mkdtemp(prefix="lakestream-demo-")
    try:
        ok = run(root, plot_path=Path(root) / "demo.png")
    except KeyboardInterrupt as e:
        shutil.rmtree(root, ignore_errors=True)
        name = str(e) if str(e) in ("SIGINT", "SIGTERM") else "SIGINT"
        print(f"\n{name}: stopped the demo's processes, removed {root}", file=sys.stderr)
        return 128 + signal.Signals[name].value
    finally:
        for n, handler in previous.items():
            signal.signal(n, handler)
    print("verifications passed" if ok else "VERIFICATION FAILED")
    return 0 if ok else 1
