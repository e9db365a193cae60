"""A rollout worker reads the trainer's policy version through its Producer: what the
consumer group last published, read at most once per poll interval and shared with the
``max_lag_steps`` check."""

from __future__ import annotations

import time
from pathlib import Path

import torch.distributed as dist

import lakestream
from lakestream.loaders import StreamDataset, StreamLoader
from lakestream.log.progress import progress_key, publish_progress
from lakestream.producers import Producer, ProducerOptions
from tests.helpers import SCHEMA, rows


def _reads(p: Producer) -> list[str]:
    """The progress objects ``p``'s store is asked for, from now on."""
    seen: list[str] = []
    real_get = p.stream.store.get

    def get(key: str, *args: object, **kwargs: object) -> bytes:
        if key.startswith(progress_key("x").rsplit("/", 1)[0]):
            seen.append(key)
        return real_get(key, *args, **kwargs)  # type: ignore[arg-type]

    p.stream.store.get = get  # type: ignore[method-assign]
    return seen


def test_the_policy_version_is_what_the_group_published(tmp_path: Path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    with Producer(s.uri, "w", progress_group="rl",
                  options=ProducerOptions(progress_poll_s=0.05)) as p:
        assert p.trainer_progress() is None and p.policy_version == 0
        publish_progress(s.store, "rl", step=3, policy_version=7, job="j")
        publish_progress(s.store, "train", step=9, policy_version=99)  # another group
        time.sleep(0.06)
        progress = p.trainer_progress()
        assert progress is not None and (progress.step, progress.policy_version,
                                         progress.job) == (3, 7, "j")
        assert p.policy_version == 7
        publish_progress(s.store, "rl", step=4, policy_version=None)
        time.sleep(0.06)
        assert p.policy_version == 0  # published without a version


def test_reads_are_cached_for_the_poll_interval_and_shared_with_the_lag_check(
        tmp_path: Path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    publish_progress(s.store, "train", step=0, policy_version=1)
    with Producer(s.uri, "w", max_lag_steps=4,
                  options=ProducerOptions(progress_poll_s=30)) as p:
        reads = _reads(p)
        assert p.wait_for_lag(timeout=1)
        for _ in range(100):
            assert p.policy_version == 1
        p.write(rows(0, 4))
        assert reads == [progress_key("train")]  # one GET for the admission and 100 reads


def test_a_trainer_publishes_the_version_a_producer_reads(tmp_path: Path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 8))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdv", rank=0, world_size=1)
    try:
        ds = StreamDataset(s.uri, timeout=5, max_steps=2, progress_interval_s=0.05)
        for batch in StreamLoader(ds):  # each step publishes the version set before it
            ds.policy_version = int(batch["step"]) + 5
    finally:
        dist.destroy_process_group()
    with Producer(s.uri, "w") as p:
        assert p.policy_version == 5
