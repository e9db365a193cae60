"""Least privilege against the real server: a producer, a trainer and a retention job, each
with the narrowest grants SeaweedFS can express (tests/s3server.py), do their work, and are
refused what is not theirs with PermissionDeniedError, leaving the stream unchanged."""

from __future__ import annotations

import logging
import time

import pytest

import lakestream
from lakestream.errors import PermissionDeniedError
from lakestream.log.progress import publish_progress, read_progress
from lakestream.ops.verify import verify
from lakestream.producers import Producer, ProducerOptions
from lakestream.store import open_store
from tests.conftest import BUCKET
from tests.helpers import SCHEMA, edit_entry, ids, rows
from tests.s3server import PRODUCER, READER, RETENTION, ROLES_PREFIX, TRAINER, SeaweedS3

URI = f"s3://{BUCKET}/{ROLES_PREFIX}"


@pytest.fixture(scope="module")
def roles(s3_server: SeaweedS3) -> SeaweedS3:
    lakestream.create(URI, SCHEMA, global_batch_size=4, snapshot_interval=3,
                      storage_options=s3_server.options())
    return s3_server


def test_each_role_does_its_work_and_no_more(roles: SeaweedS3) -> None:
    producer, trainer = roles.options(PRODUCER), roles.options(TRAINER)
    retention, reader = roles.options(RETENTION), roles.options(READER)

    # The producer writes its own data folder and commits to the log.
    with Producer(URI, "rollout-0", storage_options=producer) as p:
        for i in range(6):
            p.write(rows(4 * i, 4), state={"next": i + 1})
    # ... but not another producer's folder, nor a consumer group's progress.
    other = Producer(URI, "rollout-1", storage_options=producer)
    other.write(rows(1000, 4))
    with pytest.raises(PermissionDeniedError, match="refused"):
        other.flush()
    other.abort()
    with pytest.raises(PermissionDeniedError):
        publish_progress(open_store(URI, producer), "train", 3)

    # The trainer reads every step, commits a marker and publishes progress ...
    s = lakestream.open(URI, storage_options=trainer)
    assert [i for k in range(s.num_steps) for i in ids(s.read_step(k))] == list(range(24))
    s.mark_checkpoint("train", 4, "ckpt-4")
    publish_progress(s.store, "train", 4)
    assert read_progress(s.store, "train").step == 4  # type: ignore[union-attr]
    # ... but cannot write data, nor delete it.
    with pytest.raises(PermissionDeniedError):
        s.append(rows(100, 4))
    with pytest.raises(PermissionDeniedError):
        s.store.delete(s.state.all_fragments()[0].path)

    # A read-only identity reads, and a commit is refused at once, not retried for minutes.
    r = lakestream.open(URI, storage_options=reader)
    assert r.num_samples == 24
    with pytest.raises(PermissionDeniedError):
        r.mark_checkpoint("eval", 1)

    # The retention job reclaims and collects.
    job = lakestream.open(URI, storage_options=retention)
    assert job.retain(keep_last=1) is not None
    report = job.gc(grace_seconds=0, delta_checkpoint=False)
    assert report.data_files == 4  # the fragments of steps 0-3

    after = lakestream.open(URI, storage_options=reader)
    assert after.num_samples == 24 and after.state.reclaimed_below == 16
    assert ids(after.read_step(5)) == [20, 21, 22, 23]
    assert after.checkpoints("train")[-1].step == 4
    assert verify(open_store(URI, reader)).problems == []


def test_a_producers_grants_cannot_brick_gc_nor_rewrite_unseen(roles: SeaweedS3) -> None:
    """The producer role of the table: garbage where the next two snapshots go made gc (the
    retention role, no grace) delete the last readable snapshot; a plain PUT over a
    committed entry gave readers that opened before and after two histories."""
    from lakestream.errors import CorruptLogError
    from lakestream.log.keys import log_key
    from lakestream.log.manifest import snapshot_key

    producer, retention = roles.options(PRODUCER), roles.options(RETENTION)
    reader = roles.options(READER)
    store = open_store(URI, producer)
    s = lakestream.open(URI, storage_options=producer)
    first = s.version // 3 * 3 + 3
    for v in (first, first + 3):
        store.put(snapshot_key(v), b"{garbage", mode="create")
    with Producer(URI, "rollout-0", storage_options=producer) as p:
        for i in range(8):
            p.write(rows(200 + 4 * i, 4))
    job = lakestream.open(URI, storage_options=retention)
    report = job.gc(grace_seconds=0)
    assert any(snapshot_key(first) in line for line in report.forged), report
    fresh = lakestream.open(URI, storage_options=reader)
    steps = fresh.num_steps
    assert ids(fresh.read_step(steps - 1)) == [228, 229, 230, 231]

    before = lakestream.open(URI, storage_options=reader)
    target = before.version - 2
    original = store.get(log_key(target))
    # The producer grant allows a plain PUT; the checksum is made to match.
    store.put(log_key(target), edit_entry(original, commit_id="forged"), mode="overwrite")
    with pytest.raises(CorruptLogError, match=f"log version {target + 1} does not follow"):
        lakestream.open(URI, storage_options=reader)
    assert ids(before.read_step(steps - 1)) == [228, 229, 230, 231]
    open_store(URI, retention).put(log_key(target), original)  # for the tests after this
    assert lakestream.open(URI, storage_options=reader).num_steps == steps


def test_a_producer_refused_the_pooled_runs_commits_for_its_host_alone(
        roles: SeaweedS3, caplog: pytest.LogCaptureFixture) -> None:
    """``share_commits="store"`` with a producer's grants, which name no
    ``_lakestream/runs/``: the refused put turns pooling off, with a warning saying what
    to grant, and every write still commits."""
    producer = roles.options(PRODUCER)
    options = ProducerOptions(share_commits="store")
    with caplog.at_level(logging.WARNING, logger="lakestream"), \
            Producer(URI, "rollout-0", storage_options=producer, options=options) as p:
        start = p.state["next"] if p.state else 0
        for i in range(start, start + 8):  # paced: the host's committer offers as it waits
            p.write(rows(10_000 + 4 * i, 4), state={"next": i + 1})
            time.sleep(0.03)
    assert "refused the pooled runs" in caplog.text
    s = lakestream.open(URI, storage_options=roles.options(READER))
    assert s.producers["rollout-0"][2] == {"next": start + 8}
