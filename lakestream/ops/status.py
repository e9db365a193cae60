"""What ``lakestream status`` and ``lakestream group`` show: the stream, and every consumer
group with its markers, registration, progress, lag and the data it holds (as dicts;
``lakestream.ops.text`` writes them for a person)."""

from __future__ import annotations

import json
import time
from typing import Any

from lakestream.errors import LakestreamError, NotFoundError
from lakestream.log.entries import RemoveGroup
from lakestream.log.inventory import unreferenced
from lakestream.log.keys import log_key
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
    reclaimed = stream.state.first_retained_step
    return {
        "uri": stream.uri,
        "version": s.version,
        "num_samples": s.next_offset,
        "num_steps": s.num_steps,
        "sealed_at": s.sealed_at,
        "undelivered_samples": stream.undelivered_samples,
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
    reclaimed = stream.state.first_retained_step
    holds = {g: max(h, reclaimed) for g, h in group_holds(s, keep_last).items()}
    out = {}
    for g in sorted(set(s.groups) | set(progress)):
        markers = s.markers.get(g, ())
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


def _progress(p: Progress) -> dict[str, Any]:
    return {"step": p.step, "policy_version": p.policy_version, "updated": p.updated,
            "job": p.job}


def _lag_seconds(stream: Stream, step: int) -> float | None:
    """Seconds since ``step`` (the first step not read) became visible: the age of the
    commit that completed it; 0 when it is not visible yet; None if that entry is gone."""
    s = stream.state
    if step >= s.num_steps:
        return 0.0
    last = s.stream_meta.offset(step + 1) - 1
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
    reclaimed = stream.state.first_retained_step
    held = group_holds(stream.state, keep_last).get(group)
    return {"held_from_step": None if held is None else max(held, reclaimed),
            "retention_step_before": max(before.step, reclaimed),
            "retention_step_after": max(after.step, reclaimed),
            "released_fragments": len(gained),
            "released_bytes": sum(f.size for f in after.fragments if f.path in gained)}
