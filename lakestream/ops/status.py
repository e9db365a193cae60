"""What ``lakestream status`` and ``lakestream group`` show: the stream, and every consumer
group with its markers, registration, progress, lag and the data it holds; and how the
commands write for a person (escaped names, sizes in KiB/MiB, plurals)."""

from __future__ import annotations

import json
import time
from typing import Any

from lakestream.errors import LakestreamError, NotFoundError
from lakestream.log.entries import RemoveGroup, log_key
from lakestream.log.inventory import unreferenced
from lakestream.log.opening import read_hint
from lakestream.log.progress import Progress, list_progress
from lakestream.log.retention import group_holds, retention_point
from lakestream.stream import Stream


def status(stream: Stream, keep_last: int = 2) -> dict[str, Any]:
    """What ``lakestream status`` shows, as a dict."""
    s = stream.state
    hint = read_hint(stream.store)
    orphans = list(unreferenced(stream.store, s))
    point = stream.retention_point(keep_last)
    reclaimed = _reclaimed_step(stream)
    return {
        "uri": stream.uri,
        "version": s.version,
        "num_samples": s.next_offset,
        "num_steps": s.num_steps,
        "sealed_at": s.sealed_at,
        "global_batch_size": stream.global_batch_size,
        "group_size": stream.group_size,
        "schema": {f.name: str(f.type) for f in stream.schema},
        "fragments": s.index.count(),
        "snapshot_version": hint,
        "reclaimed_below_offset": s.reclaimed_below,
        "reclaimed_below_step": reclaimed,
        "retention": {"keep_last": keep_last, "step": max(point.step, reclaimed),
                      "below_offset": point.below_offset,
                      "reclaimable_fragments": len(point.fragments),
                      "reclaimable_bytes": point.bytes},
        "unreferenced_files": len(orphans),
        "unreferenced_bytes": sum(m.size for m in orphans),
        "producers": {p: {"epoch": st.epoch, "seq": st.seq, "state": st.state}
                      for p, st in sorted(s.producers.items())},
        "groups": groups(stream, keep_last),
    }


def groups(stream: Stream, keep_last: int = 2) -> dict[str, dict[str, Any]]:
    """Every consumer group: those the log knows (markers, registration) and those that only
    published progress. For each: its markers (``reclaimed``: retention has removed the
    data it resumes at), registration step, progress, lag in steps and in seconds (how long
    ago the oldest step it has not read became visible), and the step from which it holds
    data under ``retain(keep_last)``, never below what the log has reclaimed (None: it
    holds nothing)."""
    s = stream.state
    progress = list_progress(stream.store)
    reclaimed = _reclaimed_step(stream)
    holds = {g: max(h, reclaimed) for g, h in group_holds(s, keep_last).items()}
    out = {}
    for g in sorted(set(s.groups) | set(progress)):
        markers = s.markers.get(g, [])
        p = progress.get(g)
        position = p.step if p is not None else (markers[-1].step if markers else None)
        out[g] = {
            "markers": [{"step": m.step, "checkpoint_id": m.checkpoint_id, "version": m.version,
                         "reclaimed": m.step < reclaimed} for m in markers],
            "registered_step": s.registered.get(g),
            "progress": None if p is None else _progress(p),
            "lag_steps": None if position is None else max(0, s.num_steps - position),
            "lag_seconds": None if position is None else _lag_seconds(stream, position),
            "holds_from_step": holds.get(g),
        }
    return out


def _reclaimed_step(stream: Stream) -> int:
    """The first step whose data retention has not reclaimed, as the log says."""
    return -(-stream.state.reclaimed_below // stream.global_batch_size)


def _progress(p: Progress) -> dict[str, Any]:
    return {"step": p.step, "policy_version": p.policy_version, "updated": p.updated,
            "job": p.job}


def _lag_seconds(stream: Stream, step: int) -> float | None:
    """Seconds since ``step`` (the first step not read) became visible: the age of the
    commit that completed it; 0 when it is not visible yet; None if that entry is gone."""
    s = stream.state
    b = stream.global_batch_size
    if step >= s.num_steps:
        return 0.0
    last = (step + 1) * b - 1
    if last < s.reclaimed_below:
        return None
    try:
        fragments = s.fragments_between(last, last + 1)
        if not fragments:
            return None
        first_line = stream.store.get(log_key(fragments[0].version)).split(b"\n", 1)[0]
        committed_ms = json.loads(first_line)["commitInfo"]["timestamp"]
    except (NotFoundError, LakestreamError, ValueError, KeyError, TypeError):
        return None
    return max(0.0, time.time() - committed_ms / 1000)


def removal_effect(stream: Stream, group: str, keep_last: int = 2) -> dict[str, Any]:
    """What removing ``group`` would release under ``retain(keep_last)``: the retention
    point before and after, and the fragments and bytes that become reclaimable."""
    before = retention_point(stream.state, keep_last)
    after_state = stream.state.copy()
    after_state.apply(after_state.version + 1, RemoveGroup(group))
    after = retention_point(after_state, keep_last)
    gained = {f.path for f in after.fragments} - {f.path for f in before.fragments}
    reclaimed = _reclaimed_step(stream)
    held = group_holds(stream.state, keep_last).get(group)
    return {"held_from_step": None if held is None else max(held, reclaimed),
            "retention_step_before": max(before.step, reclaimed),
            "retention_step_after": max(after.step, reclaimed),
            "released_fragments": len(gained),
            "released_bytes": sum(f.size for f in after.fragments if f.path in gained)}


def print_status(info: dict[str, Any]) -> None:
    """Prints ``status(...)`` for a person: names from the store escaped, sizes in units."""
    print(f"stream      {printable(info['uri'])}")
    print(f"version     {info['version']} (snapshot {info['snapshot_version']})")
    sealed = "" if info["sealed_at"] is None else \
        f"  sealed at {info['sealed_at']} samples (no more appends)"
    print(f"samples     {info['num_samples']}  steps {info['num_steps']}  "
          f"(B={info['global_batch_size']}, G={info['group_size']}){sealed}")
    reclaimed = "nothing reclaimed" if not info["reclaimed_below_offset"] else \
        f"reclaimed below step {info['reclaimed_below_step']} " \
        f"(offset {info['reclaimed_below_offset']})"
    print(f"fragments   {info['fragments']}  {reclaimed}")
    r = info["retention"]
    if r["reclaimable_fragments"] or r["below_offset"] > info["reclaimed_below_offset"]:
        what = f"reclaimable below step {r['step']}, " \
            f"{plural(r['reclaimable_fragments'], 'fragment')}, " \
            f"{human_bytes(r['reclaimable_bytes'])}"
    else:
        what = f"nothing more to reclaim (below step {r['step']})"
    print(f"retention   keep_last={r['keep_last']}: {what}")
    print(f"unreferenced {plural(info['unreferenced_files'], 'file')}, "
          f"{human_bytes(info['unreferenced_bytes'])} "
          "(uploads never committed, or reclaimed, awaiting gc)")
    print(f"producers   {len(info['producers'])}")
    for p, st in info["producers"].items():
        print(f"  {printable(p):<24} epoch {st['epoch']:<4} seq {st['seq']:<8} "
              f"state {printable(st['state'])}")
    print(f"groups      {len(info['groups'])}")
    print_groups(info["groups"], indent="  ")


def print_groups(info: dict[str, dict[str, Any]], indent: str = "") -> None:
    """Prints ``groups(...)`` for a person, a line per group."""
    for g, x in info.items():
        steps = ", ".join(str(m["step"]) + (" (reclaimed)" if m.get("reclaimed") else "")
                          for m in x["markers"][-5:]) or "-"
        progress = x["progress"]
        at = "-" if progress is None else \
            f"step {progress['step']} (job {printable(progress['job'])})"
        lag = "-" if x["lag_steps"] is None else plural(x["lag_steps"], "step") + (
            "" if x["lag_seconds"] is None else f", {x['lag_seconds']:.0f} s")
        holds = "holds nothing" if x["holds_from_step"] is None else \
            f"holds from step {x['holds_from_step']}"
        registered = "" if x["registered_step"] is None else \
            f", registered at step {x['registered_step']}"
        print(f"{indent}{printable(g):<24} {plural(len(x['markers']), 'marker')} "
              f"(last resume steps {steps}){registered}; progress {at}; lag {lag}; {holds}")


def printable(value: object) -> str:
    """``str(value)`` with each character a terminal would act on (ESC, other controls,
    bidirectional overrides: whatever ``str.isprintable`` refuses) written as its Python
    escape (``\\x1b``), so that names and states from the store cannot drive the
    operator's terminal."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def human_bytes(n: int) -> str:
    """``n`` bytes for a person: ``512 B``, ``1.2 MiB`` (JSON output keeps the exact count)."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    return f"{value:.1f} {unit}"


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 marker``, ``2 markers`` (``words``: an irregular plural)."""
    return f"{n} {word if n == 1 else words or word + 's'}"
