"""DataLoader workers over an S3 stream: a forked worker is told to spawn, never left hanging
(the S3 client's runtime threads do not survive fork), and spawned workers read."""

from __future__ import annotations

import time

import pytest
import torch

import lakestream
from lakestream.errors import LakestreamError
from lakestream.loaders import StreamDataset
from tests.helpers import SCHEMA, rows


def _stream(s3_options: dict[str, str]) -> str:
    from tests.s3server import BUCKET

    uri = f"s3://{BUCKET}/workers-{time.time_ns()}"
    s = lakestream.create(uri, SCHEMA, global_batch_size=4, storage_options=s3_options)
    for k in range(4):
        s.append(rows(4 * k, 4))
    return uri


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["DataLoader", "StatefulDataLoader"])
def test_a_forked_dataloader_over_s3_raises_and_a_spawned_one_reads(s3_options,
                                                                   kind: str) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = torch.utils.data.DataLoader if kind == "DataLoader" else StatefulDataLoader
    uri = _stream(s3_options)
    # Opening the stream (here, in the parent) starts the client's runtime.
    ds = StreamDataset(uri, group=None, storage_options=s3_options, max_steps=4, timeout=5)
    forked = loader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(LakestreamError, match="spawn"):
        list(forked)
    for workers in (2, 0):  # in process, the dataset then goes on from where it stopped
        spawned = loader(ds, batch_size=None, num_workers=workers,
                         **({"multiprocessing_context": "spawn"} if workers else {}))
        assert sorted(int(b["step"]) for b in spawned) == [0, 1, 2, 3]
