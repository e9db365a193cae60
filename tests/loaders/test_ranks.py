"""Real trainer ranks (gloo, separate processes, DataLoader workers) agree on every step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lakestream
from tests.helpers import SCHEMA, ids, rows

ROOT = Path(__file__).resolve().parents[2]
STEPS, B = 6, 8


# On S3 alone: what it checks does not depend on the store, and S3 is the slower path to
# get right (the local store runs it in the crash tests); make test stays under 10 minutes.
@pytest.mark.parametrize("backend", ["s3"], indirect=True)
def test_two_gloo_ranks_with_two_workers_partition_every_step(backend, tmp_path) -> None:
    uri = backend.uri()
    s = lakestream.create(uri, SCHEMA, global_batch_size=B, group_size=2,
                          storage_options=backend.options)
    for k in range(STEPS * 2):
        s.append(rows(4 * k, 4))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.loaders.rank_worker", uri, str(r), "2",
                          str(tmp_path / "init"), str(tmp_path / f"rank{r}.json"), str(STEPS),
                          "2", json.dumps(backend.options or {})],
                         cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    errors = [p.communicate(timeout=180)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [step for step, _ in got[0]] == list(range(STEPS)) == [step for step, _ in got[1]]
    for step in range(STEPS):
        a, b = got[0][step][1], got[1][step][1]
        assert not set(a) & set(b)
        assert a + b == ids(s.read_step(step)) == list(range(B * step, B * step + B))
        assert a == ids(s.read_step(step, 0, 2)) and b == ids(s.read_step(step, 1, 2))
