"""A simulation of DAC (``lakestream.producers.policy``, ``Committer``): producers sharing one
log in simulated time, each a real ``IntervalController`` pacing commits against a store whose
requests take a given latency. The policy tests assert its behaviour; ``main`` sizes a commit
shared by a host's producers (``ProducerOptions(share_commits="host")``) against a commit per
producer, against a commit per producer taken in turns under a lock per host, and against
hosts whose commits carry each other's runs, pooled through the store
(``share_commits="store"``).

Usage: .venv/bin/python -m bench.dac [--hosts 2 8 32] [--per-host 8] [--latency 0.045]
       [--write-every 0.1] [--windows 4000] [--out dac.json]
Writes bench/results/dac.json (or ``--out``, a file name there).

A host's producers committing as one are modelled as one committer writing their fragments
together (a fragment every ``write_every / per_host``) with their in-flight budgets summed;
each fragment's latency runs from its write to the landing of the commit that holds it.
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from bench.output import command, save
from lakestream.producers import IntervalController, ProducerOptions
from lakestream.producers.committer import GAP_WINDOWS


@dataclass
class Run:
    """What a simulated run saw: every commit attempt, and who wrote each log version."""

    attempts: list[tuple[float, bool]] = field(default_factory=list)  # (time, lost a race)
    versions: list[int] = field(default_factory=list)  # the producer of versions 1, 2, ...
    fragments: list[int] = field(default_factory=list)  # committed, per producer
    landings: list[tuple[float, int]] = field(default_factory=list)  # (time, producer)
    latencies: list[float] = field(default_factory=list)
    """From each committed fragment's write to its commit landing (seconds)."""

    def conflict_ratio(self, after: float = 0.0) -> float:
        lost = [conflicted for t, conflicted in self.attempts if t >= after]
        return sum(lost) / len(lost)

    def longest_run(self) -> int:
        """The most consecutive log versions one producer wrote."""
        best = run = 0
        for k, producer in enumerate(self.versions):
            run = run + 1 if k and producer == self.versions[k - 1] else 1
            best = max(best, run)
        return best


def simulate(producers: int, latency: float, *, write_every: float, windows: int = 4000,
              inflight: int = ProducerOptions().max_inflight_fragments,
              max_s: float = ProducerOptions().max_interval_s,
              gap_windows: float = GAP_WINDOWS, seed: int = 1,
              others_stop_at: float | None = None, host_lock: int = 0,
              pooled: bool = False) -> Run:
    """``producers`` committers sharing one log for ``windows`` commit latencies, in
    simulated time. Each models ``Committer.run`` and ``Committer._take``: a real
    ``IntervalController`` fed each commit's window and the distinct producers whose entries
    it folded in since its previous commit; the wait it returns, cut short once half the in-flight
    budget (in fragments) is uploaded, but never shorter than ``gap_windows`` commit windows.
    A commit follows ``lakestream.log.transaction``: catch up first after a wait or a lost race
    and before the first commit;
    a put lands if no one took its version first; a loser reads the winner, backs off as
    the default ``CommitOptions`` say, reads the tail and puts again. Each writer makes a
    fragment every ``write_every`` seconds and blocks while ``inflight`` are uncommitted.
    A request takes ``latency`` (±50%, half each way) and takes effect at the store
    half-way. With ``others_stop_at``, every producer but the first stops then.

    With ``host_lock`` = n, producers k and k' with k // n == k' // n share a host whose
    lock a commit holds from its catch-up read to its landing (lost races included): the
    host's producers never race each other, and, counting only rivals of other hosts, do not
    pace themselves against each other; each still commits its own fragments.

    With ``pooled``, every committer's commit also carries every other committer's
    fragments that were in the store as runs when it listed them: as
    ``share_commits="store"`` does, it lists and reads them (two requests, the reads in
    parallel) in the last stretch of its wait, so that the commit waits for neither, and a
    fragment is in the store a request (its host's put) after its write: a commit carries
    the others' fragments written three requests before its wait ended."""
    rng = random.Random(seed)
    retry = ProducerOptions().commit
    run = Run(fragments=[0] * producers)
    head = 0  # the log's latest version
    held: dict[int, int | None] = {}  # host -> the producer holding its lock
    queued: dict[int, deque[int]] = {}  # host -> producers waiting for it, in order
    done = [0] * producers  # fragments committed, per committer
    waiting_runs: list[deque[float]] = [deque() for _ in range(producers)]
    """When each fragment of each committer not yet committed was written."""

    def leg() -> float:  # one way of a request
        return latency / 2 * rng.uniform(0.5, 1.5)

    produced = [0.0] * producers  # each writer's output so far, in fragments
    last = [0.0] * producers  # when it was counted

    def write(k: int, now: float) -> float:  # writer k's output up to now, at the budget
        return min(done[k] + inflight, produced[k] + (now - last[k]) / write_every)

    def advance(k: int, now: float) -> None:  # writer k's output up to now, each noted
        if now < last[k]:
            return  # counted past it already
        out = write(k, now)
        for n in range(int(produced[k] + 1e-9) + 1, int(out + 1e-9) + 1):
            waiting_runs[k].append(min(now, last[k] + (n - produced[k]) * write_every))
        produced[k], last[k] = out, now

    def committer(k: int) -> Generator[float, float, None]:
        nonlocal head
        controller = IntervalController(max_s=max_s, rng=random.Random(k))
        produced[k], last[k] = rng.random(), 0.0  # the writer, at a random phase
        seen = 0  # the version this producer has read
        wait_s = gap_s = 0.0
        contended = False
        written = waiting_runs[k]

        landed: float | None = None
        now = yield rng.uniform(0, latency)
        while others_stop_at is None or k == 0 or now < others_stop_at:
            # _take: the next fragment once wait_s is over, or once half the budget is
            # uploaded, but not before gap_s.
            advance(k, now)
            short = done[k] - produced[k]  # n fragments are uploaded at now + (short + n) * ...
            first = now + max(0.0, short + 1) * write_every
            half = now + max(0.0, short + max(1, inflight // 2)) * write_every
            now = yield max(first, min(now + max(wait_s, gap_s), max(now + gap_s, half)))
            if host_lock:  # the host's lock, first come first served
                host = k // host_lock
                waiting = queued.setdefault(host, deque())
                waiting.append(k)
                while held.get(host) is not None or waiting[0] != k:
                    now = yield now + latency / 20
                waiting.popleft()
                held[host] = k
            advance(k, now)
            batch, taken_before = int(produced[k] + 1e-9) - done[k], done[k]
            before, conflicts = seen, 0
            # Pooled: the others' runs it carries, listed and read in the last two requests
            # of its wait, each in the store a request (its host's put) after its write.
            listed = now - 3 * latency
            if wait_s > 0 or contended or landed is None or host_lock:  # catch up
                now = yield now + leg()
                seen = head
                now = yield now + leg()
            while True:
                t_attempt = now
                now = yield now + leg()
                won = head == seen
                if won:
                    head = seen = head + 1
                    run.versions.append(k)
                now = yield now + leg()
                run.attempts.append((now, not won))
                if won:
                    break
                conflicts += 1
                now = yield now + 2 * leg()  # read the winner
                seen += 1
                cap = min(retry.backoff_cap_s, retry.backoff_base_s * 2 ** min(conflicts, 20))
                now = yield now + rng.uniform(0, cap)
                now = yield now + leg()  # read the tail
                seen = head
                now = yield now + leg()
            window = now - t_attempt
            contended = conflicts > 0
            # The producers whose entries it folded in: those between its previous commit
            # and this one (``Transaction`` counts them as it catches up and loses races).
            rivals = len(set(run.versions[before:seen - 1]) - {k})
            if host_lock:
                held[k // host_lock] = None
                rivals = len({r for r in run.versions[before:seen - 1]
                              if r // host_lock != k // host_lock})
            landed = now
            wait_s = controller.observe(window, rivals)
            gap_s = gap_windows * window
            advance(k, now)
            batch = max(0, batch - (done[k] - taken_before))  # another's pooled commit took some
            done[k] += batch
            run.latencies += [now - written.popleft() for _ in range(batch)]
            run.fragments[k] += batch
            run.landings.append((now, k))
            for j in range(producers) if pooled else ():
                if j != k:
                    advance(j, listed)
                while j != k and waiting_runs[j] and waiting_runs[j][0] <= listed:
                    run.latencies.append(now - waiting_runs[j].popleft())
                    done[j] += 1
                    run.fragments[j] += 1

    procs = [committer(k) for k in range(producers)]
    queue = [(next(p), k) for k, p in enumerate(procs)]
    heapq.heapify(queue)
    while queue and queue[0][0] < windows * latency:
        t, k = heapq.heappop(queue)
        try:
            heapq.heappush(queue, (procs[k].send(t), k))
        except StopIteration:
            pass
    return run


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1)))]


def compare(hosts: int, per_host: int, latency: float, write_every: float, windows: int,
            seed: int = 1) -> dict[str, Any]:
    """Latency from write to commit, the second half of a run, with a committer per
    producer (``hosts * per_host`` of them), the same taking turns under a lock per host,
    one committer per host, and one per host whose commits carry every host's runs."""
    inflight = ProducerOptions().max_inflight_fragments
    out: dict[str, Any] = {"hosts": hosts, "per_host": per_host, "latency_s": latency,
                           "write_every_s": write_every}
    for name, committers, every, budget, lock, pooled in (
            ("per producer", hosts * per_host, write_every, inflight, 0, False),
            ("per producer, a lock per host", hosts * per_host, write_every, inflight,
             per_host, False),
            ("per host", hosts, write_every / per_host, inflight * per_host, 0, False),
            ("per host, runs pooled through the store", hosts, write_every / per_host,
             inflight * per_host, 0, True)):
        run = simulate(committers, latency, write_every=every, windows=windows,
                       inflight=budget, seed=seed, host_lock=lock, pooled=pooled)
        late = run.latencies[len(run.latencies) // 2:]
        out[name] = {"p50_s": percentile(late, 0.5), "p99_s": percentile(late, 0.99),
                     "commits_per_s": len(run.landings) / (windows * latency),
                     "conflict_ratio": run.conflict_ratio(after=windows * latency / 2)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 8, 32])
    ap.add_argument("--per-host", type=int, default=8)
    ap.add_argument("--latency", type=float, default=0.045,
                    help="seconds a request takes (S3 Standard conditional PUT: 30-60 ms)")
    ap.add_argument("--write-every", type=float, default=0.1,
                    help="seconds between one producer's writes")
    ap.add_argument("--windows", type=int, default=4000, help="the run, in request latencies")
    ap.add_argument("--out", default="dac.json", help="a file name in bench/results")
    args = ap.parse_args()
    rows = [compare(h, args.per_host, args.latency, args.write_every, args.windows)
            for h in args.hosts]
    for r in rows:
        print(f"{r['hosts']:3} hosts x {r['per_host']}, p50 / p99 write -> commit:", "; ".join(
            f"{name} {v['p50_s']:.3f} / {v['p99_s']:.3f} s ({v['commits_per_s']:.1f} "
            f"commits/s, {v['conflict_ratio']:.0%} lost)"
            for name, v in r.items() if isinstance(v, dict)), flush=True)
    save(args.out, {"command": command("dac"), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
