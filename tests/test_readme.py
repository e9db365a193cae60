"""The README's examples run as printed, in order, each in a fresh interpreter: the stream
example creates the stream, the producer example writes 1,000 groups into it, and the trainer
example reads 500 steps of it on one gloo rank, checkpointing as it goes; the SFT example
writes two sources, mixes them and resumes from a checkpoint. Nothing is faked between them
(no progress is published for the producer).

Two things in the code are replaced: the streams' paths (`/tmp/rollouts` and `/tmp/sft`, by
ones under the test's temporary folder), and the trainers' rendezvous, which becomes
file-based with rank 0 of a world of 1, as a launcher would give it (the default env://
starts a TCP store that listens on every interface). The calls the README shows inline are
run too."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import lakestream
from lakestream.producers import Producer

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
EXAMPLES = ("## A stream in 20 lines", "## A producer in 20 lines", "## A trainer in 20 lines",
            "## SFT in 20 lines")
RENDEZVOUS = 'dist.init_process_group("gloo")'


def _example(heading: str) -> str:
    section = README[README.index(heading):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, f"no python block under {heading!r}"
    return match.group(1)


def _run(code: str, cwd: Path, uri: str) -> str:
    code = code.replace("/tmp/rollouts", uri).replace("/tmp/sft", str(cwd / "sft")).replace(
        RENDEZVOUS,
        f'dist.init_process_group("gloo", init_method="file://{cwd}/rendezvous", rank=0, '
        'world_size=1)')
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_every_python_block_is_an_example_run_here() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks == [_example(h) for h in EXAMPLES]


def test_the_readme_examples_run_as_printed(tmp_path: Path) -> None:
    uri = str(tmp_path / "rollouts")
    out = _run(_example(EXAMPLES[0]), tmp_path, uri)
    assert out.startswith("4 16 2\n") and "16" in out.splitlines()[-2]

    out = _run(_example(EXAMPLES[1]), tmp_path, uri)
    assert "commits," in out
    stream = lakestream.open(uri)
    assert stream.num_samples == 16 + 4 * 1_000
    assert stream.producers["rollout-0"][2] == {"next_prompt": 1_000}

    trainer = _example(EXAMPLES[2])
    assert trainer.count(RENDEZVOUS) == 1
    _run(trainer, tmp_path, uri)
    stream.refresh()
    assert [m.step for m in stream.checkpoints("train")][-5:] == [100, 200, 300, 400, 500]
    assert (tmp_path / "ckpt" / "500").is_dir()

    sft = _example(EXAMPLES[3])
    assert sft.count(RENDEZVOUS) == 1
    assert _run(sft, tmp_path, uri).splitlines()[-1] == "[60, 61, 62]"
    code = lakestream.open(str(tmp_path / "sft" / "code"))
    assert code.sealed_at == 700 and [m.step for m in code.checkpoints("train")] == [0]

    # The calls shown inline, with the names they use bound to this stream.
    inline = [s for s in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", README, flags=re.S))
              if re.match(r"(lakestream\.\w+|Producer)\(", s)]
    assert len(inline) == 2, inline
    for call in inline:
        made = eval(call, {"lakestream": lakestream, "Producer": Producer},
                    {"uri": uri, "options": None})
        if isinstance(made, Producer):
            made.close()
