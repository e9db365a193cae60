"""Producer state must be JSON; producer counters are exact under threads and bounded."""

from __future__ import annotations

import math
import sys
import threading

import pytest

import lakestream
import lakestream.producers.stats as stats_module
from lakestream.producers import Producer, ProducerOptions
from lakestream.producers.stats import ProducerStats
from tests.helpers import SCHEMA, rows


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, {"x": [1.0, math.nan]}])
def test_a_state_that_is_not_json_is_refused_before_anything_is_written(tmp_path, bad) -> None:
    # Regression: json.dumps let NaN and Infinity through; the entry then held tokens that
    # are not JSON, which other Delta readers reject.
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    with Producer(uri, "p") as p:
        with pytest.raises(ValueError, match="NaN or Infinity"):
            p.write(rows(0, 4), state=bad)
        assert p.stats.writes == 0
    s = lakestream.open(uri)
    assert s.num_samples == 0 and s.producers["p"][1:] == (-1, None)


def test_commit_latencies_are_bounded(tmp_path, monkeypatch) -> None:
    # Regression: every commit's latency was appended to a list that grew for ever.
    monkeypatch.setattr(stats_module, "LATENCY_WINDOW", 5)
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    with Producer(uri, "p", options=ProducerOptions(commit_policy="per-fragment")) as p:
        for i in range(12):
            p.write(rows(4 * i, 4))
            p.flush()
        assert p.stats.commits == 12
        assert len(p.stats.commit_latencies_s) == 5


def test_counters_are_exact_when_many_threads_add() -> None:
    # Regression: the upload threads and the committer did `stats.x += n` without a lock;
    # a thread switch between the read and the write loses an update.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        stats = ProducerStats()

        def work() -> None:
            for _ in range(20_000):
                stats.add(bytes_uploaded=3)
                stats.add_commit(1, 0, 2, 0.001)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert stats.bytes_uploaded == 4 * 20_000 * 3
    assert (stats.commits, stats.fragments_committed) == (80_000, 160_000)


def test_cpu_is_counted_by_stage(tmp_path) -> None:
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=4)
    p = Producer(uri, "p")
    assert set(p.stats.cpu_s) == set(stats_module.STAGES)
    assert not any(p.stats.cpu_s.values())
    for i in range(40):
        p.write(rows(4 * i, 4))
    p.close()
    cpu = p.stats.cpu_s
    assert all(v >= 0 for v in cpu.values())
    assert cpu["encode"] > 0 and cpu["store put"] > 0 and cpu["committer"] > 0
    assert cpu["write call"] >= cpu["conform"] + cpu["size check"] > 0
