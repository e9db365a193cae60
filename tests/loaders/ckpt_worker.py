"""One trainer rank that checkpoints: a real process, in a gloo group when the world has more
than one rank. Reads steps through StreamLoader, saves a DCP checkpoint (and its marker)
after each step listed in ``save_after``, under its checkpoint root ``ckpt``, and appends what
it read and saved to ``out`` (one JSON line per event). ``resume`` first loads the group's
latest marked checkpoint, as a trainer restarting does: the marker, checked against the root.
With ``hang`` it waits, once done, to be killed.

Usage: python -m tests.loaders.ckpt_worker SPEC_JSON
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

import lakestream
from lakestream.loaders import StreamDataset, StreamLoader, load_checkpoint, save_checkpoint

MODEL = 1000
"""Elements of the saved tensor: enough for torch.save to write in several buffers."""


def _emit(out: str, event: dict[str, Any]) -> None:
    with open(out, "a") as f:
        f.write(json.dumps(event) + "\n")


def main() -> None:
    spec = json.loads(sys.argv[1])
    uri, options, out = spec["uri"], spec["options"] or None, spec["out"]
    rank, world = spec["rank"], spec["world"]
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{spec['init']}", rank=rank,
                                world_size=world)
    try:
        ds = StreamDataset(uri, rank=rank, world_size=world, max_steps=spec["steps"],
                           timeout=60, storage_options=options)
        state = {"model": torch.zeros(MODEL)}
        if spec.get("resume"):
            marker = lakestream.open(uri, storage_options=options).checkpoints("train")[-1]
            load_checkpoint(state, marker, ds, root=spec["ckpt"])
            _emit(out, {"loaded": marker.checkpoint_id, "model": state["model"][:3].tolist(),
                        "next_step": ds.start_step})
        for batch in StreamLoader(ds):
            step = int(batch["step"])
            _emit(out, {"step": step, "ids": [int(x) for x in batch["id"]]})
            if step + 1 in spec.get("save_after", []):
                state["model"] = torch.arange(MODEL, dtype=torch.float32) * (step + 1)
                save_checkpoint(state, f"step-{step + 1}", ds, root=spec["ckpt"])
                _emit(out, {"saved": f"{spec['ckpt']}/step-{step + 1}"})
        _emit(out, {"done": True})
        while spec.get("hang"):
            time.sleep(1)
    finally:
        if world > 1:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
