"""The README's examples run as written, in order: the stream example creates the stream,
the producer example writes 1,000 groups into it, and the trainer example reads 500 steps
of it on one gloo rank, checkpointing as it goes. Two things are changed: the stream's path,
and the trainer's rendezvous (file-based here: the default env:// starts a TCP store that
listens on every interface)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import lakestream
from lakestream.progress import publish_progress

ROOT = Path(__file__).resolve().parents[1]


def _example(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, f"no python block under {heading!r}"
    return match.group(1)


def _run(code: str, cwd: Path, uri: str) -> str:
    code = code.replace("/tmp/rollouts", uri).replace(
        'dist.init_process_group("gloo")',
        f'dist.init_process_group("gloo", init_method="file://{cwd}/rendezvous", rank=0, '
        'world_size=1)')
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_readme_examples_run_as_written(tmp_path) -> None:
    uri = str(tmp_path / "rollouts")
    out = _run(_example("## A stream in 20 lines"), tmp_path, uri)
    assert out.startswith("4 16 2\n") and "16" in out.splitlines()[-2]
    stream = lakestream.open(uri)
    # A trainer far ahead, so the producer's max_lag_steps does not hold it back here.
    publish_progress(stream.store, "train", step=10_000)
    out = _run(_example("## A producer in 20 lines"), tmp_path, uri)
    assert "commits," in out
    stream.refresh()
    assert stream.num_samples == 16 + 4 * 1_000 and stream.producers["rollout-0"][2] == {
        "next_prompt": 1_000}
    trainer = _example("## A trainer in 20 lines")
    assert 'dist.init_process_group("gloo")' in trainer
    _run(trainer, tmp_path, uri)
    stream.refresh()
    markers = stream.checkpoints("train")
    assert [m.step for m in markers][-5:] == [100, 200, 300, 400, 500]
    assert (tmp_path / "ckpt" / "500").is_dir()
