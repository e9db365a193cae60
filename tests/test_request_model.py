"""The request model of ``bench/requests.py``: its arithmetic, checked by hand, and what it
says at 512 ranks (docs/design.md, "Requests at 64 and 512 ranks")."""

from __future__ import annotations

import pytest

from bench import requests as request_model
from lakestream.log.head import EMPTY_POLLS_PER_S, POLL_REST_S


def test_the_model_counts_per_rank_per_host_and_per_prefix() -> None:
    m = request_model.model(8, 8, versions_per_s=10.0, steps_per_s=2.0,
                            fragments_per_rank_step=1.0, fragments_per_host_step=8.0,
                            empty_reads_per_s=20.0)
    assert m["ranks"] == 64
    assert m["log_gets_per_poller_s"] == 30.0  # 10 versions + 20 empty reads
    assert m["log_gets_per_s_head_per_process"] == 64 * 30.0
    assert m["log_gets_per_s_head_per_host"] == 8 * 30.0
    assert m["fragment_gets_per_s_no_cache"] == 64 * 2.0 * 1.0
    assert m["fragment_gets_per_s_host_cache"] == 8 * 2.0 * 8.0
    assert m["log_prefix_share_per_process"] == pytest.approx(1920 / 5500)


def test_at_rest_512_ranks_polling_per_process_exceed_a_prefix_and_per_host_do_not() -> None:
    """At rest each process sends only its polls, one each POLL_REST_S within the budget of
    reads that find nothing: 512 of them are 9,216 GETs a second, past the 5,500 one S3
    prefix serves; one poller a host (64, the default: ``lakestream.log.hosthead``) sends
    1,152."""
    rest = min(1 / POLL_REST_S, EMPTY_POLLS_PER_S)
    assert rest == request_model.REST_EMPTY_READS_PER_S
    m = request_model.model(64, 8, 0.0, 0.0, 0.0, 0.0)
    assert m["log_gets_per_s_head_per_process"] == pytest.approx(512 * rest) and 512 * rest > 5500
    assert m["log_gets_per_s_head_per_host"] == pytest.approx(64 * rest) and 64 * rest < 5500
