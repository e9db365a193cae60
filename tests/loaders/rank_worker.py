"""One trainer rank, a real process in a gloo group: reads every step through a DataLoader
with workers and writes what it got to a JSON file.

Usage: python -m tests.loaders.rank_worker URI RANK WORLD INIT_FILE OUT STEPS WORKERS OPTS
       [BATCH_SIZE]
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from lakestream.loaders import StreamDataset, StreamLoader


def main() -> None:
    uri, rank, world, init, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        sys.argv[4], sys.argv[5]
    steps, workers, options = int(sys.argv[6]), int(sys.argv[7]), json.loads(sys.argv[8])
    batch_size = int(sys.argv[9]) if len(sys.argv) > 9 else None
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        ds = StreamDataset(uri, max_steps=steps, timeout=60, storage_options=options or None,
                           batch_size=batch_size)
        assert (ds.rank, ds.world_size) == (rank, world)  # taken from torch.distributed
        got = [[int(b["step"]), [int(x) for x in b["id"]]]
               for b in StreamLoader(ds, num_workers=workers)]
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(got, f)


if __name__ == "__main__":
    main()
