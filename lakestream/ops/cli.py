"""The ``lakestream`` command: create, status, group, tail, lineage, verify, retain, gc,
demo."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import pyarrow as pa

from lakestream import __version__
from lakestream.errors import LakestreamError
from lakestream.log.entries import check_group
from lakestream.log.progress import delete_progress, progress_exists, read_progress
from lakestream.ops.status import (
    groups,
    human_bytes,
    plural,
    print_groups,
    print_status,
    printable,
    removal_effect,
    status,
)
from lakestream.ops.verify import verify
from lakestream.read.lineage import SampleLineage, StepLineage
from lakestream.store import open_store
from lakestream.store.s3_options import is_secret, setting
from lakestream.stream import Stream

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
    """``90`` (seconds), ``30s``, ``10m``, ``1h``, ``2d`` as seconds.

    Raises:
        argparse.ArgumentTypeError: not a duration.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (seconds, or e.g. 30s, 10m, 1h, 2d)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def parse_interval(text: str) -> float:
    """A positive duration (``parse_duration``) as seconds.

    Raises:
        argparse.ArgumentTypeError: not a positive duration.
    """
    try:
        value = parse_duration(text)
    except argparse.ArgumentTypeError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(
            f"not a positive number of seconds: {text!r} (seconds, or e.g. 0.5, 2s, 1m)")
    return value


def parse_option(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (a storage option) as a pair. A secret (``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``) is refused: on a command line every user of the machine sees it
    in the process list, and the shell keeps it in its history. No message shows a value.

    Raises:
        argparse.ArgumentTypeError: there is no ``=`` or no key, or the key is a secret's.
    """
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        shown = re.sub(r"[^A-Za-z0-9_.-].*", "...", text, flags=re.DOTALL)  # never a value
        raise argparse.ArgumentTypeError(
            f"storage option {shown!r} is not KEY=VALUE (e.g. -o AWS_ENDPOINT_URL=http://...)")
    if is_secret(key):
        variable = "AWS_" + setting(key).upper()
        raise argparse.ArgumentTypeError(
            f"{printable(key)} is not taken on the command line, where every user of the "
            f"machine sees it in the process list and the shell keeps it in its history: "
            f"export {variable} in the environment instead, or name a profile of "
            "~/.aws/credentials with AWS_PROFILE (docs/deployment.md, Credentials)")
    return key, value


def parse_group(text: str) -> str:
    """A consumer group's name (``lakestream.log.check_group``).

    Raises:
        argparse.ArgumentTypeError: not a valid group name.
    """
    try:
        return check_group(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(printable(e)) from None


def _options(args: argparse.Namespace) -> dict[str, str] | None:
    return dict(args.option) if args.option else None


def tail(stream: Stream, interval: float, count: int, group: str, as_json: bool) -> None:
    """Prints a line every ``interval`` seconds: version, steps, rates, producers, lag.

    Ctrl-C (SIGINT) ends it between lines, as ``KeyboardInterrupt``: raised anywhere else, in
    the middle of a read with the shared thread pool, it could leave the pool's lock taken
    and the process hung at exit.

    Raises:
        ValueError: ``group`` is not a valid group name.
    """
    check_group(group)
    interrupted = threading.Event()
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    else:  # signals reach the main thread only; nothing to take over
        previous = None
    try:
        _tail(stream, interval, count, group, as_json, interrupted)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _tail(stream: Stream, interval: float, count: int, group: str, as_json: bool,
          interrupted: threading.Event) -> None:
    last_t, last_samples, n = time.monotonic(), stream.num_samples, 0
    while count <= 0 or n < count:
        if interrupted.wait(interval if n else 0):
            raise KeyboardInterrupt
        stream.refresh()
        now = time.monotonic()
        rate = (stream.num_samples - last_samples) / max(now - last_t, 1e-9)
        last_t, last_samples, n = now, stream.num_samples, n + 1
        progress = read_progress(stream.store, group)
        lag = None if progress is None else stream.num_steps - progress.step
        if as_json:
            print(json.dumps({"time": time.time(), "version": stream.version,
                              "steps": stream.num_steps, "samples": stream.num_samples,
                              "samples_per_s": rate, "group": group, "lag_steps": lag,
                              "producers": {p: {"epoch": e, "seq": q} for p, (e, q, _)
                                            in sorted(stream.producers.items())}}),
                  flush=True)
            continue
        producers = " ".join(f"{printable(p)}:{e}/{q}"
                             for p, (e, q, _) in sorted(stream.producers.items()))
        print(f"{time.strftime('%H:%M:%S')} version {stream.version} steps {stream.num_steps} "
              f"samples {stream.num_samples} ({rate:.0f}/s) {group} lag "
              f"{'-' if lag is None else lag} | {producers}", flush=True)


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


DESCRIPTION = """The lakestream command: create a stream, show its state and its consumer
groups, follow it live, trace a step to the producers and checkpoints behind it, verify it,
reclaim and delete what no checkpoint needs, run the demo. Every command that prints results
takes --json."""

EPILOG = """S3 credentials come from the environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), an AWS profile (AWS_PROFILE, or the default
profile of ~/.aws/credentials), or an instance or container role; -o takes the other
storage options (AWS_ENDPOINT_URL, AWS_REGION, AWS_ALLOW_HTTP, ...), never a secret."""


class _Parser(argparse.ArgumentParser):
    """argparse, whose messages never show the value of a ``KEY=VALUE`` argument: a
    mistyped ``-o`` (``-O AWS_...=...``, or the ``-o`` left out) would print it."""

    _given: Sequence[str] = ()

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        for given in sorted(set(self._given), key=len, reverse=True):
            key, sep, value = given.partition("=")
            if sep and value:
                message = message.replace(given, f"{key}=...")
        super().error(message)


_KEEP_LAST = "how many of each group's last checkpoint markers retention keeps " \
    "(default: %(default)s)"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lakestream", description=DESCRIPTION, epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"lakestream {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("create", help="create a stream")
    p.add_argument("uri")
    p.add_argument("--schema", required=True, help="e.g. 'id:int64,tokens:list<int32>'")
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--group-size", type=int, default=1, help="default: %(default)s")
    p.add_argument("--snapshot-interval", type=int, default=100, help="default: %(default)s")
    p = sub.add_parser("status", help="show a stream's state and every consumer group")
    p.add_argument("uri")
    p.add_argument("--keep-last", type=int, default=2, help=_KEEP_LAST + ", for the "
                   "retention point shown")
    p = sub.add_parser("group", help="list consumer groups, or remove one")
    p.add_argument("action", choices=["list", "rm"])
    p.add_argument("uri")
    p.add_argument("group", nargs="?", type=parse_group, help="the group to remove (rm)")
    p.add_argument("--keep-last", type=int, default=2, help=_KEEP_LAST + ", for the "
                   "retention shown")
    p = sub.add_parser("retain", help="reclaim data no retained checkpoint needs")
    p.add_argument("uri")
    p.add_argument("--keep-last", type=int, default=2, help=_KEEP_LAST)
    p = sub.add_parser("gc", help="delete reclaimed and orphaned files after a grace period")
    p.add_argument("uri")
    p.add_argument("--grace", type=parse_duration, default=3600.0,
                   help="how long after it was reclaimed or written a file is kept: seconds, "
                   "or e.g. 30s, 10m, 1h, 2d (default: 1h)")
    p = sub.add_parser("tail", help="follow a stream live: new steps, producers, lag")
    p.add_argument("uri")
    p.add_argument("--interval", type=parse_interval, default=1.0,
                   help="time between lines: seconds, or e.g. 2s, 1m (default: 1 s)")
    p.add_argument("--count", type=int, default=0,
                   help="stop after this many lines (default: 0, never)")
    p.add_argument("--group", default="train", type=parse_group,
                   help="the consumer group whose lag is shown (default: %(default)s)")
    p = sub.add_parser("lineage", help="which producers, fragments, policy versions and "
                       "checkpoint markers are behind a step")
    p.add_argument("uri")
    p.add_argument("--step", type=int, required=True, help="the global batch to trace")
    p = sub.add_parser("verify", help="read and check every log entry, snapshot and fragment")
    p.add_argument("uri")
    sub.add_parser("demo", help="run producers and a trainer on a local stream of its own "
                   "(needs torch); takes no options")
    for name, p in sub.choices.items():
        if name == "demo":
            continue
        p.add_argument("-o", "--option", action="append", default=[], type=parse_option,
                       help="storage option KEY=VALUE (e.g. AWS_ENDPOINT_URL=...); never a "
                       "secret: credentials come from the environment or an AWS profile")
        p.add_argument("--json", action="store_true", help="print JSON for scripts")
    return parser


def _out(args: argparse.Namespace, info: dict[str, Any], text: str) -> None:
    print(json.dumps(info, indent=2, default=str) if args.json else text)


def _run(args: argparse.Namespace) -> int:
    def opened() -> Stream:
        return Stream.open(args.uri, storage_options=_options(args))

    if args.command == "create":
        s = Stream.create(args.uri, parse_schema(args.schema),
                          global_batch_size=args.global_batch_size, group_size=args.group_size,
                          snapshot_interval=args.snapshot_interval,
                          storage_options=_options(args))
        _out(args, {"uri": s.uri, "global_batch_size": s.global_batch_size,
                    "group_size": s.group_size, "version": s.version},
             f"created {printable(s.uri)} (B={s.global_batch_size}, G={s.group_size})")
    elif args.command == "retain":
        stream = opened()
        version = stream.retain(keep_last=args.keep_last)
        _out(args, {"version": version, "reclaimed_below_offset": stream.state.reclaimed_below},
             "nothing to reclaim" if version is None else
             f"reclaimed below step {stream.state.reclaimed_below // stream.global_batch_size} "
             f"(offset {stream.state.reclaimed_below}) at version {version}")
    elif args.command == "gc":
        report = opened().gc(grace_seconds=args.grace)
        _out(args, dataclasses.asdict(report),
             f"deleted {plural(report.data_files, 'data file')} "
             f"({human_bytes(report.data_bytes)}), "
             f"{plural(report.log_entries, 'log entry', 'log entries')}, "
             f"{plural(report.delta_checkpoints, 'Delta checkpoint')}, "
             f"{plural(report.snapshots, 'snapshot')} "
             f"({plural(report.index_segments, 'index segment')}), "
             f"{plural(report.temp_files, 'temp file')}; {report.kept_in_grace} kept for the "
             f"grace period ({args.grace:g} s)")
    elif args.command == "verify":
        checked = verify(open_store(args.uri, _options(args)))
        verdict = plural(len(checked.problems), "problem") if checked.problems else "sound"
        _out(args, {"entries": checked.entries, "snapshots": checked.snapshots,
                    "fragments": checked.fragments, "problems": checked.problems},
             "".join(f"damaged: {printable(line)}\n" for line in checked.problems)
             + f"checked {plural(checked.entries, 'log entry', 'log entries')}, "
             f"{plural(checked.snapshots, 'snapshot')}, "
             f"{plural(checked.fragments, 'fragment')}: {verdict}")
        return 1 if checked.problems else 0
    elif args.command == "lineage":
        lin = opened().lineage(args.step)
        _out(args, lin.to_json(), lineage_text(lin))
    elif args.command == "tail":
        tail(opened(), args.interval, args.count, args.group, args.json)
    elif args.command == "status":
        info = status(opened(), args.keep_last)
        if args.json:
            _out(args, info, "")
        else:
            print_status(info)
    elif args.command == "group":
        return _group(args, opened())
    return 0


def _group(args: argparse.Namespace, stream: Stream) -> int:
    if args.action == "list":
        if args.group is not None:
            raise ValueError(f"group list takes no group (got {args.group!r}): it lists them all")
        info = groups(stream, args.keep_last)
        if args.json:
            _out(args, info, "")
        elif info:
            print_groups(info)
        else:
            print("no consumer groups")
        return 0
    if args.group is None:
        raise ValueError("group rm needs the group to remove: lakestream group rm URI GROUP")
    group = check_group(args.group)
    stream.refresh()
    effect = removal_effect(stream, group, args.keep_last)
    if group not in stream.groups:
        if not progress_exists(stream.store, group):
            stream.remove_group(group)  # raises, naming the groups there are
        delete_progress(stream.store, group)
        _out(args, {"group": group, "version": None, **effect},
             f"removed the progress of group {group!r}; the log held nothing of it")
        return 0
    version = stream.remove_group(group)
    delete_progress(stream.store, group)
    held = effect["held_from_step"]
    if held is None:
        text = "it held no data"
    elif not stream.groups:
        text = (f"it held data from step {held}; no group remains, so the stream holds "
                "everything again: retain reclaims nothing until a group commits a marker")
    else:
        text = (f"it held data from step {held}: retention (keep_last={args.keep_last}) "
                f"moves from step {effect['retention_step_before']} to "
                f"{effect['retention_step_after']}, "
                f"{plural(effect['released_fragments'], 'fragment')} "
                f"({human_bytes(effect['released_bytes'])}) become reclaimable by retain")
    text = f"removed group {group!r} at version {version}; {text}"
    _out(args, {"group": group, "version": version, **effect}, text)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Runs a command; returns its exit status: 0, 1 (verify found damage), 2 (an error,
    said on stderr in one line), 130 (interrupted), 141 (the reader of stdout went away,
    as ``lakestream ... | head`` does: quietly, as other Unix tools)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            # The demo is an application on top of every layer; the core never imports it.
            from lakestream.demo.job import main as demo

            return demo()
        code = _run(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _drop_stdout()
        return 141
    except (LakestreamError, ValueError) as e:
        print(f"lakestream {args.command}: {printable(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.command != "tail":  # Ctrl-C is how tail ends: quietly
            print(f"lakestream {args.command}: interrupted; a commit it was making may have "
                  "landed: see lakestream status", file=sys.stderr)
        return 130


def _drop_stdout() -> None:
    """Points stdout at /dev/null, so the interpreter's flush at exit does not fail on the
    closed pipe again and print a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file (captured in-process)
        pass


if __name__ == "__main__":
    sys.exit(main())
