"""`lakestream demo` stopped by SIGTERM (what `timeout`, CI cancellation and schedulers send)
stops every process it started and removes its temporary folder, as Ctrl-C does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import child_pids


def _alive(pid: int) -> bool:
    """Whether ``pid`` is still a demo process (not a zombie, not a reused PID)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return state != "Z" and b"lakestream.demo" in cmdline


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_demo_leaves_no_process_and_no_folder(tmp_path: Path, sig: int) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    demo = subprocess.Popen([sys.executable, "-m", "lakestream.ops.cli", "demo"],
                            env={**os.environ, "TMPDIR": str(temp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(children) < 5 and time.monotonic() < deadline:  # 3 rollouts, 2 ranks
            children = {c for c in child_pids(demo.pid) if _alive(c)}
            time.sleep(0.05)
        assert len(children) == 5, children
        assert [p.name for p in temp.iterdir()][0].startswith("lakestream-demo-")
        demo.send_signal(sig)
        _, err = demo.communicate(timeout=60)
        left = [pid for pid in children if _alive(pid)]
    finally:
        if demo.poll() is None:  # whatever the outcome, nothing outlives the test
            demo.kill()
        demo.wait()
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert demo.returncode == 128 + sig, err[-2000:]
    assert f"{signal.Signals(sig).name}: stopped the demo's processes" in err
    assert left == []
    assert list(temp.iterdir()) == []
