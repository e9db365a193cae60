"""The ``lakestream`` command: create, status, group, tail, lineage, verify, retain, gc,
demo."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from lakestream import __version__
from lakestream.errors import LakestreamError
from lakestream.log.keys import check_group
from lakestream.log.progress import delete_progress, progress_exists
from lakestream.ops.args import (
    SCALAR_NAMES,
    TYPE_FORMS,
    parse_duration,
    parse_group,
    parse_interval,
    parse_mapping,
    parse_option,
    parse_schema,
)
from lakestream.ops.status import groups, removal_effect, status
from lakestream.ops.tail import tail
from lakestream.ops.text import (
    human_bytes,
    lineage_text,
    plural,
    print_groups,
    print_status,
    printable,
)
from lakestream.ops.verify import verify
from lakestream.store import open_store
from lakestream.stream import Stream


def _options(args: argparse.Namespace) -> dict[str, str] | None:
    return dict(args.option) if args.option else None


DESCRIPTION = """The lakestream command: create a stream, show its state and its consumer
groups, follow it live, trace a step to the producers and checkpoints behind it, verify it,
reclaim and delete what no checkpoint needs, import a dataset, run the demo. Every command
that prints results takes --json."""

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
    _add_create(sub)
    _add_upkeep(sub)
    _add_inspection(sub)
    _add_import(sub)
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


_Verbs = argparse._SubParsersAction  # the parser of verbs (argparse names no public type)


def _add_create(sub: _Verbs) -> None:
    p = sub.add_parser("create", help="create a stream")
    p.add_argument("uri", help="a local path, file://... or s3://bucket/prefix")
    p.add_argument("--schema", required=True,
                   help="name:type columns, comma-separated, a trailing ! for not nullable, "
                        "e.g. 'id:int64!,tokens:list<int32>,reward:float32'; types: "
                        + ", ".join(sorted(SCALAR_NAMES)) + "; " + "; ".join(TYPE_FORMS))
    p.add_argument("--global-batch-size", type=int, required=True,
                   help="B, the samples of each step (global batch), which W ranks read "
                        "together, B/W each: W must divide B, and B/W be a multiple of G")
    p.add_argument("--group-size", type=int, default=1,
                   help="G, samples that stay together in one fragment, step and rank (the "
                        "responses to one prompt); G divides B. Default: %(default)s")
    p.add_argument("--snapshot-interval", type=int, default=100,
                   help="a snapshot every K versions, so that opening reads at most about K "
                        "log entries. Default: %(default)s")


def _add_upkeep(sub: _Verbs) -> None:
    """status, group, retain and gc: a stream's consumer groups and what they hold."""
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


def _add_inspection(sub: _Verbs) -> None:
    """tail, lineage and verify: following and checking a stream."""
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


def _add_import(sub: _Verbs) -> None:
    p = sub.add_parser("import", help="bring an existing dataset into a stream, exactly once: "
                       "run again, it resumes where it stopped")
    p.add_argument("uri")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="Parquet files, folders or globs; WebDataset .tar shards; or the "
                   "folder of a Hugging Face dataset saved with save_to_disk")
    p.add_argument("--format", choices=["parquet", "hf", "webdataset"],
                   help="what PATH holds (default: told by the files)")
    p.add_argument("--split", help="the split of a saved Hugging Face DatasetDict")
    p.add_argument("--map", action="append", default=[], type=parse_mapping,
                   metavar="COLUMN=FIELD", help="fill the stream's COLUMN from the dataset's "
                   "FIELD (default: the field of the column's name); WebDataset fields are "
                   "the extensions and __key__")
    p.add_argument("--producer-id", default="import",
                   help="the producer identity whose committed state tracks this import "
                   "(default: %(default)s); another dataset needs another one")
    p.add_argument("--global-batch-size", type=int,
                   help="create the stream, with the dataset's fields as its columns, if it "
                   "does not exist")
    p.add_argument("--group-size", type=int, default=1,
                   help="G, for a stream it creates (default: %(default)s)")


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
             f"reclaimed below step {stream.state.first_retained_step} "
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
        if args.command == "import":
            return _import(args)
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


def _import(args: argparse.Namespace) -> int:
    # A producer's work on top of the core, imported as the demo is.
    from lakestream.producers.importing import import_dataset

    r = import_dataset(args.uri, args.paths, producer_id=args.producer_id, kind=args.format,
                       split=args.split, columns=dict(args.map),
                       storage_options=_options(args),
                       global_batch_size=args.global_batch_size, group_size=args.group_size)
    resumed = f" after the {r.resumed_from:,} an earlier run committed" if r.resumed_from \
        else ""
    ignored = f"; fields no column takes: {', '.join(r.ignored_fields)}" \
        if r.ignored_fields else ""
    _out(args, {"uri": args.uri, **dataclasses.asdict(r)},
         f"imported {r.rows:,} rows{resumed} in {plural(r.writes, 'write')}, "
         f"{r.seconds:.1f} s ({r.rows / max(r.seconds, 1e-9):,.0f} rows/s){ignored}")
    return 0


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
