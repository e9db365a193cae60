"""Before and after: the same measurements on two checkouts of Lakestream, interleaved.

Usage: .venv/bin/python -m bench.versions --before /path/to/checkout [--after /path] [--reps 5]
Writes bench/results/versions.json.

Each checkout runs the measurements with its own ``.venv/bin/python`` (an editable install of
that checkout), in a fresh process per measurement, alternating before and after within
every repetition, on tmpfs; each figure is the median repetition with its min-max, and the
ratio after/before the median of the per-repetition ratios with its min-max. What is
measured is CPU time, the process's own (``time.process_time``), over:

- ``write``: one producer writing 3,000 one-group fragments (16 samples, ~16 KB) flat out,
  then flushing: CPU-ms per fragment (encoding, validation, uploads, commits);
- ``read``: one rank reading 400 steps of 64 samples through ``StepReader`` in log order
  (fragments of 16 samples, so four a step): CPU-us per step, from fetching to the tensors;
- ``open``: ``lakestream.open`` of a stream of 2,000 versions with its snapshots: CPU-us.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.output import RESULTS, ROOT
from bench.reps import median

KINDS = ("write", "read", "open")
PAYLOAD = Path(__file__).resolve().with_name("payload.py")

LOAD_PAYLOAD = r'''
import importlib.util, sys
_spec = importlib.util.spec_from_file_location("payload", sys.argv[-1])
payload = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(payload)
'''
"""The children's first lines: ``bench/payload.py`` (numpy and pyarrow only) loaded from
its path, their last argument, rather than by the search path: nothing of this checkout
comes before the ``lakestream`` their own checkout's venv installs."""

MEASURE = LOAD_PAYLOAD + r'''
import json, time, tempfile
import lakestream
kind, root = sys.argv[1], sys.argv[2]
groups = [payload.rollouts(16, 16, seed=k, min_tokens=64, max_tokens=192) for k in range(8)]
if kind == "write":
    from lakestream.producers import Producer
    uri = tempfile.mkdtemp(dir=root) + "/s"
    lakestream.create(uri, payload.ROLLOUT_SCHEMA, global_batch_size=64, group_size=16)
    with Producer(uri, "p") as p:
        c0 = time.process_time()
        for n in range(3000):
            p.write(groups[n % 8])
        p.flush()
        cpu = time.process_time() - c0
    print(json.dumps({"value": 1e3 * cpu / 3000, "unit": "CPU-ms per fragment"}))
elif kind == "read":
    from lakestream.loaders.collate import collate_table
    from lakestream.loaders.reader import StepReader
    uri = root + "/read"
    s = lakestream.open(uri)
    reader = StepReader(s, 0, 1, threads=1, prefetch=0)
    c0 = time.process_time()
    for step, table in reader.read(range(400)):
        collate_table(table)
    cpu = time.process_time() - c0
    print(json.dumps({"value": 1e6 * cpu / 400, "unit": "CPU-us per step"}))
else:
    uri = root + "/open"
    best = min((lambda c0: (lakestream.open(uri), time.process_time() - c0)[1])(
        time.process_time()) for _ in range(20))
    print(json.dumps({"value": 1e6 * best, "unit": "CPU-us per open (best of 20)"}))
'''

PREPARE = LOAD_PAYLOAD + r'''
import lakestream
from lakestream.log import Fence
root = sys.argv[1]
s = lakestream.create(root + "/read", payload.ROLLOUT_SCHEMA, global_batch_size=64,
                      group_size=16)
for n in range(1600):
    s.append(payload.rollouts(16, 16, seed=n % 8, min_tokens=64, max_tokens=192))
o = lakestream.create(root + "/open", payload.ROLLOUT_SCHEMA, global_batch_size=64,
                      group_size=16)
for e in range(1, 2000):
    o.commit(lambda _s, cid, e=e: Fence("p", e, cid))
'''


def _run(python: str, code: str, *args: str) -> dict[str, Any]:
    # From a neutral folder: ``-c`` puts the working directory first on the path, and this
    # checkout's ``lakestream/`` would shadow the one measured.
    out = subprocess.run([python, "-c", code, *args], capture_output=True, text=True,
                         timeout=600, cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise RuntimeError(f"{python} {args}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="a checkout with its own .venv")
    ap.add_argument("--after", default=str(ROOT), help="a checkout with its own .venv "
                    "(default: this one)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS))
    ap.add_argument("--out", default=str(RESULTS / "versions.json"))
    args = ap.parse_args()
    trees = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    pythons = {k: str(t / ".venv" / "bin" / "python") for k, t in trees.items()}
    runs: list[dict[str, Any]] = []
    tmp_root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
        # One stream for both: the log format is the same, and reading is what is measured.
        subprocess.run([pythons["before"], "-c", PREPARE, tmp, str(PAYLOAD)], check=True,
                       cwd=tmp, timeout=600)
        for rep in range(args.reps):
            for kind in args.kinds:
                for who in ("before", "after") if rep % 2 == 0 else ("after", "before"):
                    r = _run(pythons[who], MEASURE, kind, tmp, str(PAYLOAD))
                    runs.append({"rep": rep, "kind": kind, "who": who, **r})
                    print(f"rep {rep} {kind:5} {who:6} {r['value']:9.1f} {r['unit']}",
                          flush=True)
    summary = {}
    for kind in args.kinds:
        mine = [r for r in runs if r["kind"] == kind]
        by = {w: [r["value"] for r in mine if r["who"] == w] for w in ("before", "after")}
        ratios = [a / b for a, b in zip(by["after"], by["before"], strict=True)]
        summary[kind] = {"unit": mine[0]["unit"],
                         **{w: {"median": median(v), "min": min(v), "max": max(v)}
                            for w, v in by.items()},
                         "ratio": {"median": median(ratios), "min": min(ratios),
                                   "max": max(ratios)}}
        print(f"{kind}: after/before {summary[kind]['ratio']['median']:.3f} "
              f"({summary[kind]['ratio']['min']:.3f}-{summary[kind]['ratio']['max']:.3f})")
    result = {"before": str(trees["before"]), "machine": os.uname().nodename,
              "time": time.strftime("%Y-%m-%d %H:%M"), "summary": summary, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
