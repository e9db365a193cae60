"""How the commands write for a person: names and states from the store escaped, sizes in
KiB/MiB, plurals; ``status``, ``group list`` and ``lineage`` as text."""

from __future__ import annotations

import itertools
from typing import Any

from lakestream.read.lineage import SampleLineage, StepLineage


def print_status(info: dict[str, Any]) -> None:
    """Prints ``status(...)`` for a person: names from the store escaped, sizes in units."""
    print(f"stream      {printable(info['uri'])}")
    print(f"version     {info['version']} (snapshot {info['snapshot_version']})")
    sealed = "" if info["sealed_at"] is None else \
        f"  sealed at {info['sealed_at']} samples (no more appends)"
    print(f"samples     {info['num_samples']}  steps {info['num_steps']}  "
          f"(B={info['global_batch_size']}, G={info['group_size']}){sealed}")
    left = info["undelivered_samples"]
    if left:
        print(f"            the last {plural(left, 'sample')} fill no whole step: " + (
            "never delivered (sealed)" if info["sealed_at"] is not None else
            "delivered once the step fills"))
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
    print(f"retention   if retain(keep_last={r['keep_last']}) ran now: {what}")
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
        # A marker's step is where a run resuming from it reads this stream from: the next
        # step for a plain reader, the step a mix's position maps to for a mix (0 in an epoch
        # after the first, which reads every step again), so each names its checkpoint.
        steps = ", ".join(
            f"{printable(m['checkpoint_id'] or '-')} reads from step {m['step']}"
            + (" (reclaimed)" if m.get("reclaimed") else "")
            for m in x["markers"][-3:]) or "-"
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
              f"(newest: {steps}){registered}; progress {at}; lag {lag}; {holds}")


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


def _policy(samples: list[SampleLineage]) -> str:
    """The policy versions of ``samples``: one value, ``low..high``, or ``-`` if none."""
    values = [v for x in samples for v in (x.policy_version, x.policy_version_min,
                                           x.policy_version_max) if v is not None]
    if not values:
        return "-"
    try:
        low, high = min(values), max(values)
    except TypeError:  # values without an order (structs): list the distinct ones
        return ",".join(sorted({printable(v) for v in values}))
    return printable(low) if low == high else f"{printable(low)}..{printable(high)}"


def lineage_text(lin: StepLineage) -> str:
    """``lakestream lineage``'s table: a line per run of samples from one fragment, then the
    markers that replay the step. What the log holds (paths, producers, policy versions,
    groups, checkpoint ids) is escaped (``printable``)."""
    lo, hi = lin.offsets
    lines = [f"step {lin.step} of {printable(lin.uri)}: offsets [{lo}, {hi}), as of version "
             f"{lin.version}"]
    if lin.reclaimed:
        lines.append("reclaimed by retention: its samples are gone and no marker replays it")
        return "\n".join(lines)
    lines.append(f"  {'offsets':<17} {'samples':>7}  {'producer':<16} {'epoch':>5} {'seq':>6} "
                 f"{'version':>7}  {'policy':<9} fragment")
    for path, run in itertools.groupby(lin.samples, key=lambda x: x.path):
        xs = list(run)
        x = xs[0]
        span = f"[{x.offset}, {xs[-1].offset + 1})"
        producer = "(append)" if x.producer is None and x.epoch is not None else \
            printable(x.producer or "?")
        lines.append(f"  {span:<17} {len(xs):>7}  {producer:<16} {_dash(x.epoch):>5} "
                     f"{_dash(x.seq):>6} {x.version:>7}  {_policy(xs):<9} {printable(path)}")
    if lin.markers:
        lines.append(f"markers that replay it (resume at or before step {lin.step}):")
        lines += [f"  {printable(m.group):<16} step {m.step:<8} checkpoint "
                  f"{printable(m.checkpoint_id or '-')} (version {m.version})"
                  for m in lin.markers]
    else:
        lines.append(f"no checkpoint marker at or before step {lin.step}: no group can resume "
                     "from one and replay it")
    return "\n".join(lines)


def _dash(value: object) -> str:
    return "-" if value is None else str(value)
