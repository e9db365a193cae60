"""A history of what clients did and saw, and a checker of it against the stream afterwards.

Writes carry sample ids; each write ends ``ok`` (acknowledged: a flush returned after it),
``failed`` (definitely not committed) or ``unknown`` (the client cannot tell). Reads record
which ids a rank saw for a step. ``check`` then reads the stream from the store and lists
every violation; an empty list means the history is consistent.
"""

from __future__ import annotations

import io
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import pyarrow.parquet as pq

import lakestream
from lakestream.errors import NotFoundError
from lakestream.log.entries import Append, Compacted
from lakestream.log.keys import log_key
from lakestream.log.tail import read_entry

Outcome = Literal["pending", "ok", "failed", "unknown"]


@dataclass
class Write:
    producer: str
    ids: tuple[int, ...]
    outcome: Outcome = "pending"


@dataclass
class Read:
    reader: str
    step: int
    rank: int
    world_size: int
    ids: tuple[int, ...]


@dataclass
class History:
    writes: list[Write] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def invoke(self, producer: str, ids: list[int]) -> Write:
        w = Write(producer, tuple(ids))
        with self._lock:
            self.writes.append(w)
        return w

    def settle(self, producer: str, outcome: Outcome) -> None:
        """Marks every pending write of ``producer`` (a flush returned, or failed)."""
        with self._lock:
            for w in self.writes:
                if w.producer == producer and w.outcome == "pending":
                    w.outcome = outcome

    def read(self, reader: str, step: int, rank: int, world_size: int, ids: list[int]) -> None:
        with self._lock:
            self.reads.append(Read(reader, step, rank, world_size, tuple(ids)))


@dataclass
class Verdict:
    violations: list[str]
    committed: int
    acknowledged: int
    unknown: int
    lost: int
    duplicated: int


def _stream_ids(stream: lakestream.Stream) -> list[int]:
    """Every committed id in offset order, read from the fragment files themselves (not
    through the readers under test); offsets must be contiguous from the first live one."""
    out: list[int] = []
    for f in stream.state.all_fragments():
        table = pq.read_table(io.BytesIO(stream.store.get(f.path)), columns=["id"])
        if table.num_rows != f.rows:
            raise AssertionError(f"{f.path} holds {table.num_rows} rows, the log says {f.rows}")
        out += table.column("id").to_pylist()
    return out


def check(history: History, uri: str, options: dict[str, str] | None = None) -> Verdict:
    """Checks ``history`` against the stream at ``uri``. Where gc compacted the log, the
    seqs of each producer are checked from its first retained entry on, and what was
    committed before it by the samples the stream holds (gc alone reclaims none)."""
    s = lakestream.open(uri, storage_options=options)
    bad: list[str] = []
    # Versions are gapless: every entry from 0 to the head exists and parses.
    producers_seen: dict[str, list[tuple[int, int]]] = {}
    compacted = 0
    for v in range(s.version + 1):
        try:
            entry = read_entry(s.store, v)
        except NotFoundError:
            bad.append(f"version {v} is missing below the head {s.version}")
            continue
        if isinstance(entry, Compacted):
            compacted += 1  # gc's tombstone: the version stays taken, its entry is gone
            if producers_seen:
                bad.append(f"version {v} is compacted above retained entries")
            continue
        if isinstance(entry, Append) and entry.producer is not None:
            producers_seen.setdefault(entry.producer, []).append(
                (entry.first_seq, entry.last_seq))
    try:
        s.store.head(log_key(s.version + 1))
        bad.append(f"version {s.version + 1} exists past the head")
    except NotFoundError:
        pass
    # Per producer, the applied appends' seqs run 0, 1, 2, ... without gaps or inversions.
    applied = {p: ps.seq for p, ps in s.state.producers.items()}
    for p, ranges in producers_seen.items():
        # Seqs before the retained log were checked by the samples alone (below).
        expect, ok = ranges[0][0] if compacted else 0, True
        for first, last in ranges:
            if first == expect:
                expect = last + 1
            elif last >= expect:
                ok = False  # a gap
        if not ok or expect - 1 != applied.get(p, -1):
            bad.append(f"producer {p}: seqs {ranges[:5]}... have a gap or inversion")
    ids = _stream_ids(s)
    counts = Counter(i for i in ids if i is not None)
    duplicated = sum(n - 1 for n in counts.values() if n > 1)
    if duplicated:
        bad.append(f"{duplicated} samples committed more than once: "
                   f"{[i for i, n in counts.items() if n > 1][:10]}")
    committed = set(counts)
    lost = 0
    for w in history.writes:
        present = [i in committed for i in w.ids]
        if w.outcome == "ok" and not all(present):
            lost += sum(1 for x in present if not x)
            bad.append(f"acknowledged write of {w.producer} lost ids {w.ids[:4]}...")
        if w.outcome == "failed" and any(present):
            bad.append(f"failed write of {w.producer} appears: {w.ids[:4]}...")
        if w.outcome == "unknown" and any(present) and not all(present):
            bad.append(f"unknown write of {w.producer} appears in part: {w.ids[:4]}...")
    known = {i for w in history.writes for i in w.ids}
    if committed - known:
        bad.append(f"{len(committed - known)} committed ids nobody wrote")
    if s.state.all_fragments() and s.state.all_fragments()[0].offset != s.state.reclaimed_below:
        bad.append("the first live fragment does not start at the retention point")
    # Readers: every read of a step slice equals the stream's slice; no reader goes back.
    base = s.state.reclaimed_below
    last_step: dict[str, int] = {}
    b = s.global_batch_size
    for r in history.reads:
        lo = r.step * b + r.rank * (b // r.world_size) - base
        want = tuple(ids[lo:lo + b // r.world_size])
        if r.ids != want:
            bad.append(f"{r.reader} read step {r.step} rank {r.rank}/{r.world_size} as "
                       f"{r.ids[:4]}..., the stream has {want[:4]}...")
        if r.step < last_step.get(r.reader, -1):
            bad.append(f"{r.reader} went back from step {last_step[r.reader]} to {r.step}")
        last_step[r.reader] = r.step
    return Verdict(bad, len(committed), sum(w.outcome == "ok" for w in history.writes),
                   sum(w.outcome == "unknown" for w in history.writes), lost, duplicated)
