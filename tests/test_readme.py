"""The README's examples run as printed, each twice in a row, as scripts launched the way
their first line says: the stream example makes the stream, the producer example writes
1,000 groups into it (and, run again, resumes with nothing left to write), the trainer
example reads 500 steps of it on one gloo rank with two DataLoader workers,
checkpointing as it goes (and, run again, resumes at its last checkpoint), the count example
reads what other readers see, and the SFT example prepares two sources on rank 0 of two,
mixes them and resumes from a checkpoint. Nothing is faked between them (no progress is
published for the producer).

Each block is saved as a file and run with ``python file.py``, so that DataLoader workers,
which start with ``spawn``, import it as they would a user's script. Two things in the code
are replaced (the paths are relative, and each runs in the test's temporary folder): the
trainers' rendezvous, which becomes file-based, with the rank and world size a launcher
gives (torchrun's env:// starts a TCP store that listens on every interface), and the
trainer's loader, given ``num_workers=2`` as the README advises where decoding needs more
cores. A ``torchrun --nproc_per_node N`` line starts N processes with torchrun's
environment. The calls the README shows inline are run too."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads

import lakestream
from lakestream.producers import Producer

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
EXAMPLES = ("## A stream in 20 lines", "## A producer in 20 lines", "## A trainer in 20 lines",
            "## Images, audio and tensors", "## SFT in 20 lines", "## Other readers")
RENDEZVOUS = 'dist.init_process_group("gloo")'
LAUNCH = re.compile(r"# (?:python|torchrun --nproc_per_node (\d+)) (\w+\.py)\b")


def _example(heading: str) -> str:
    section = README[README.index(heading):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, f"no python block under {heading!r}"
    return match.group(1)


def _run(code: str, cwd: Path, uri: str) -> list[str]:
    """Runs the example as its launch line says; returns each process's stdout."""
    launch = LAUNCH.match(code)
    assert launch is not None, f"no launch line: {code.splitlines()[0]!r}"
    world = int(launch.group(1) or 1)
    assert uri == str(cwd / "rollouts"), "the examples keep their streams in their folder"
    code = code.replace(
        RENDEZVOUS,
        f'dist.init_process_group("gloo", init_method="file://{cwd}/rdv-{uuid.uuid4().hex}", '
        'rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))')
    script = cwd / launch.group(2)
    script.write_text("import os\n" + code)
    procs = [subprocess.Popen(
        [sys.executable, str(script)], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r),
                        "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)})
        for r in range(world)]
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            outs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outs


def test_every_python_block_is_an_example_run_here() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks == [_example(h) for h in EXAMPLES]
    for block in blocks:  # safe under spawn: imports and definitions, then the guard
        *defs, guard = ast.parse(block).body
        assert all(isinstance(d, (ast.Import, ast.ImportFrom, ast.FunctionDef)) for d in defs)
        assert ast.unparse(guard).startswith("if __name__ == '__main__':"), block


def test_the_readme_examples_run_as_printed_twice(tmp_path: Path) -> None:
    uri = str(tmp_path / "rollouts")
    for _ in range(2):
        [out] = _run(_example(EXAMPLES[0]), tmp_path, uri)
        lines = out.splitlines()
        assert lines[0] == "4 16 2" and "16" in lines[-2]
        assert len(re.findall(r"^ +3,?$", out, re.M)) == 4  # prompt_id [3, 3, 3, 3]
    for run in range(2):
        [out] = _run(_example(EXAMPLES[1]), tmp_path, uri)
        assert out.startswith("0 commits," if run else "") and "commits," in out
        stream = lakestream.open(uri)
        assert stream.num_samples == 16 + 4 * 1_000
        assert stream.producers["rollout-0"][2] == {"next_prompt": 1_000}

    trainer = _example(EXAMPLES[2])
    assert trainer.count(RENDEZVOUS) == 1 and trainer.count("StreamLoader(ds)") == 1
    trainer = trainer.replace("StreamLoader(ds)", "StreamLoader(ds, num_workers=2)")
    for _ in range(2):
        _run(trainer, tmp_path, uri)
        stream.refresh()
        assert [m.step for m in stream.checkpoints("train")] == [100, 200, 300, 400, 500]
        assert (tmp_path / "ckpt" / "500").is_dir()

    for _ in range(2):
        [out] = _run(_example(EXAMPLES[5]), tmp_path, uri)
        live, folder = map(int, out.split())
        assert (live, folder) == (816, 4000)
    # What the log holds is what Lakestream reads: steps 400 to 501, where retention cut.
    assert live == sum(stream.read_step(k).num_rows for k in range(400, stream.num_steps))
    assert pads.dataset(str(tmp_path / "rollouts" / "data")).count_rows() == folder

    [out] = _run(_example(EXAMPLES[3]), tmp_path, uri)  # starts ./images afresh itself
    assert out.splitlines() == ["torch.Size([64, 3, 224, 224]) torch.Size([128]) [0, 2, 4]"]

    sft = _example(EXAMPLES[4])
    assert sft.count(RENDEZVOUS) == 1
    for _ in range(2):
        outs = _run(sft, tmp_path, uri)
        assert [out.splitlines()[-1] for out in outs] == ["[60, 61, 62]"] * 2
    code = lakestream.open(str(tmp_path / "sft" / "code"))
    assert code.sealed_at == 700 and code.num_samples == 700

    # The calls shown inline, with the names they use bound to this stream.
    inline = [s for s in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", README, flags=re.S))
              if re.match(r"(lakestream\.\w+|Producer)\(", s)]
    assert len(inline) == 2, inline
    for call in inline:
        made = eval(call, {"lakestream": lakestream, "Producer": Producer},
                    {"uri": uri, "options": None})
        if isinstance(made, Producer):
            made.close()
    assert isinstance(stream.schema, pa.Schema)
