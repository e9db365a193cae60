"""A trainer killed while its DataLoader workers wait for a step leaves no worker behind:
each looks for its parent while it waits (torch's watchdog looks only between batches)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lakestream
from lakestream.producers import Producer
from tests.helpers import SCHEMA, child_pids, rows

_TRAINER = r"""
import sys
import torch
from lakestream.loaders import StreamDataset
ds = StreamDataset(sys.argv[1], group=None)  # no timeout: waits for ever for step 1
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                     multiprocessing_context=sys.argv[2])
it = iter(loader)
print("got", int(next(it)["step"]), flush=True)
next(it)  # never comes
"""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_killing_the_trainer_leaves_no_worker_waiting(tmp_path: Path, context: str) -> None:
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    with Producer(uri, "p") as p:
        p.write(rows(0, 4))  # step 0 only
    trainer = subprocess.Popen([sys.executable, "-c", _TRAINER, uri, context],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parents[2])
    workers: set[int] = set()
    try:
        assert trainer.stdout is not None and trainer.stdout.readline() == "got 0\n"
        workers = child_pids(trainer.pid)
        assert workers, "the DataLoader started no worker"
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(30)
        deadline = time.monotonic() + 20
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [w for w in workers if _alive(w)]
        names = [_cmdline(w) for w in left]
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        for w in workers:  # whatever the outcome, nothing outlives the test
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    assert left == [], f"workers {left} outlived the trainer: {names}"
