"""The ``lakestream`` command: create, status, tail, retain, gc, demo."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

import pyarrow as pa

from lakestream.errors import LakestreamError
from lakestream.inventory import unreferenced
from lakestream.progress import read_progress
from lakestream.snapshot import read_hint
from lakestream.store import open_store
from lakestream.stream import Stream
from lakestream.verify import verify

_SCALARS = {
    "bool": pa.bool_(), "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(),
    "int64": pa.int64(), "float32": pa.float32(), "float": pa.float32(),
    "float64": pa.float64(), "double": pa.float64(), "string": pa.string(),
    "binary": pa.binary(),
}


def parse_type(text: str) -> pa.DataType:
    """``int64``, ``float32``, ``string``, ``list<int32>``, ... as an Arrow type.

    Raises:
        ValueError: the type is not one of those.
    """
    text = text.strip()
    m = re.fullmatch(r"list<(.+)>", text)
    if m:
        return pa.list_(parse_type(m.group(1)))
    if text in _SCALARS:
        return _SCALARS[text]
    raise ValueError(f"unknown column type {text!r}; use one of {sorted(_SCALARS)} or list<T>")


def parse_schema(text: str) -> pa.Schema:
    """``name:type,name:type!`` (``!`` = not nullable) as an Arrow schema.

    Raises:
        ValueError: a column is not ``name:type``.
    """
    fields = []
    for part in re.split(r",(?![^<]*>)", text):
        name, sep, typ = part.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"column {part!r} is not name:type")
        nullable = not typ.strip().endswith("!")
        fields.append(pa.field(name.strip(), parse_type(typ.strip().rstrip("!")), nullable))
    return pa.schema(fields)


def parse_duration(text: str) -> float:
    """``90``, ``30s``, ``10m``, ``1h``, ``2d`` as seconds.

    Raises:
        argparse.ArgumentTypeError: not a duration.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 30s, 10m, 1h)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _options(args: argparse.Namespace) -> dict[str, str] | None:
    return dict(kv.split("=", 1) for kv in args.option) if args.option else None


def status(stream: Stream, keep_last: int = 2) -> dict[str, Any]:
    """What ``lakestream status`` shows, as a dict."""
    s = stream.state
    hint = read_hint(stream.store)
    orphans = list(unreferenced(stream.store, s))
    point = stream.retention_point(keep_last)
    return {
        "uri": stream.uri,
        "version": s.version,
        "num_samples": s.next_offset,
        "num_steps": s.num_steps,
        "global_batch_size": stream.global_batch_size,
        "group_size": stream.group_size,
        "schema": {f.name: str(f.type) for f in stream.schema},
        "fragments": s.index.count(),
        "snapshot_version": hint,
        "reclaimed_below_offset": s.reclaimed_below,
        "retention": {"keep_last": keep_last, "step": point.step,
                      "below_offset": point.below_offset,
                      "reclaimable_fragments": len(point.fragments),
                      "reclaimable_bytes": point.bytes},
        "unreferenced_files": len(orphans),
        "unreferenced_bytes": sum(m.size for m in orphans),
        "producers": {p: {"epoch": st.epoch, "seq": st.seq, "state": st.state}
                      for p, st in sorted(s.producers.items())},
        "groups": {g: [{"step": m.step, "checkpoint_id": m.checkpoint_id, "version": m.version}
                       for m in ms] for g, ms in sorted(s.markers.items())},
    }


def _print_status(info: dict[str, Any]) -> None:
    print(f"stream      {info['uri']}")
    print(f"version     {info['version']} (snapshot {info['snapshot_version']})")
    print(f"samples     {info['num_samples']}  steps {info['num_steps']}  "
          f"(B={info['global_batch_size']}, G={info['group_size']})")
    print(f"fragments   {info['fragments']}  reclaimed below offset "
          f"{info['reclaimed_below_offset']}")
    r = info["retention"]
    print(f"retention   keep_last={r['keep_last']}: reclaimable below step {r['step']}, "
          f"{r['reclaimable_fragments']} fragments, {r['reclaimable_bytes']} bytes")
    print(f"unreferenced {info['unreferenced_files']} files, {info['unreferenced_bytes']} bytes "
          "(uploads never committed, or reclaimed, awaiting gc)")
    print(f"producers   {len(info['producers'])}")
    for p, st in info["producers"].items():
        print(f"  {p:<24} epoch {st['epoch']:<4} seq {st['seq']:<8} state {st['state']}")
    print(f"groups      {len(info['groups'])}")
    for g, ms in info["groups"].items():
        steps = ", ".join(str(m["step"]) for m in ms[-5:])
        print(f"  {g:<24} {len(ms)} markers, last resume steps: {steps}")


def tail(stream: Stream, interval: float, count: int, group: str) -> None:
    """Prints a line every ``interval`` seconds: version, steps, rates, producers, lag."""
    last_t, last_samples, n = time.monotonic(), stream.num_samples, 0
    while count <= 0 or n < count:
        time.sleep(interval if n else 0)
        stream.refresh()
        now = time.monotonic()
        rate = (stream.num_samples - last_samples) / max(now - last_t, 1e-9)
        last_t, last_samples, n = now, stream.num_samples, n + 1
        progress = read_progress(stream.store, group)
        lag = "-" if progress is None else str(stream.num_steps - progress.step)
        producers = " ".join(f"{p}:{e}/{s}" for p, (e, s, _) in sorted(stream.producers.items()))
        print(f"{time.strftime('%H:%M:%S')} version {stream.version} steps {stream.num_steps} "
              f"samples {stream.num_samples} ({rate:.0f}/s) {group} lag {lag} | {producers}",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lakestream", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("create", help="create a stream")
    p.add_argument("uri")
    p.add_argument("--schema", required=True, help="e.g. 'id:int64,tokens:list<int32>'")
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--group-size", type=int, default=1)
    p.add_argument("--snapshot-interval", type=int, default=100)
    p = sub.add_parser("status", help="show a stream's state")
    p.add_argument("uri")
    p.add_argument("--json", action="store_true")
    p.add_argument("--keep-last", type=int, default=2, help="for the retention point shown")
    p = sub.add_parser("retain", help="reclaim data no retained checkpoint needs")
    p.add_argument("uri")
    p.add_argument("--keep-last", type=int, default=2)
    p = sub.add_parser("gc", help="delete reclaimed and orphaned files after a grace period")
    p.add_argument("uri")
    p.add_argument("--grace", type=parse_duration, default=3600.0, help="e.g. 30s, 10m, 1h")
    p = sub.add_parser("tail", help="follow a stream live: new steps, producers, lag")
    p.add_argument("uri")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between lines")
    p.add_argument("--count", type=int, default=0, help="stop after this many lines (0: never)")
    p.add_argument("--group", default="train", help="the consumer group whose lag is shown")
    p = sub.add_parser("verify", help="read and check every log entry, snapshot and fragment")
    p.add_argument("uri")
    sub.add_parser("demo", help="run producers and a trainer on a local stream (needs torch)")
    for p in sub.choices.values():
        p.add_argument("-o", "--option", action="append", default=[],
                       help="storage option KEY=VALUE (e.g. AWS_ENDPOINT_URL=...)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        # The demo is an application on top of every layer; the core never imports it.
        from lakestream.demo.job import main as demo

        return demo()
    def opened() -> Stream:
        return Stream.open(args.uri, storage_options=_options(args))

    try:
        if args.command == "create":
            s = Stream.create(args.uri, parse_schema(args.schema),
                              global_batch_size=args.global_batch_size,
                              group_size=args.group_size,
                              snapshot_interval=args.snapshot_interval,
                              storage_options=_options(args))
            print(f"created {s.uri} (B={s.global_batch_size}, G={s.group_size})")
        elif args.command == "retain":
            stream = opened()
            version = stream.retain(keep_last=args.keep_last)
            print("nothing to reclaim" if version is None else
                  f"reclaimed below offset {stream.state.reclaimed_below} at version {version}")
        elif args.command == "gc":
            report = opened().gc(grace_seconds=args.grace)
            print(f"deleted {report.data_files} data files ({report.data_bytes} bytes), "
                  f"{report.log_entries} log entries, {report.delta_checkpoints} Delta "
                  f"checkpoints, {report.snapshots} snapshots "
                  f"({report.index_segments} index segments), "
                  f"{report.temp_files} temp files; {report.kept_in_grace} kept in grace")
        elif args.command == "verify":
            checked = verify(open_store(args.uri, _options(args)))
            for line in checked.problems:
                print(f"damaged: {line}")
            verdict = f"{len(checked.problems)} problems" if checked.problems else "sound"
            print(f"checked {checked.entries} log entries, {checked.snapshots} snapshots, "
                  f"{checked.fragments} fragments: {verdict}")
            return 1 if checked.problems else 0
        elif args.command == "tail":
            tail(opened(), args.interval, args.count, args.group)
        elif args.command == "status":
            info = status(opened(), args.keep_last)
            if args.json:
                print(json.dumps(info, indent=2, default=str))
            else:
                _print_status(info)
    except (LakestreamError, ValueError) as e:
        print(f"lakestream {args.command}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
