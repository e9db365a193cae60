"""Every integer option takes the same values: an int or numpy integer at least its bound,
never a bool, None where it may be unset (``lakestream.checks.check_int``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import lakestream
from lakestream.checks import check_int
from lakestream.loaders import Source, StreamDataset
from lakestream.producers import Producer, ProducerOptions
from tests.helpers import SCHEMA, rows


def test_check_int() -> None:
    assert check_int("n", 3) == 3 and check_int("n", np.int64(2), least=1) == 2
    assert check_int("n", None, optional=True) is None
    for bad, least, said in ((True, 0, "n must be a non-negative int, got True"),
                             (0, 1, "n must be a positive int, got 0"),
                             (1.0, 0, "got 1.0"), (None, 0, "got None"),
                             ("2", 0, "got '2'"), (1, 2, "an int >= 2")):
        with pytest.raises(ValueError, match=said):
            check_int("n", bad, least=least)


def test_every_integer_option_refuses_a_bool_and_takes_a_numpy_int(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    s.append(rows(0, 4))
    s.seal()
    options: list[tuple[str, Callable[[Any], object]]] = [
        ("keep_last", lambda v: s.retain(keep_last=v)),
        ("step", lambda v: s.mark_checkpoint("train", v)),
        ("step", lambda v: s.lineage(v) if v is True else s.lineage(v - 1)),  # 0 taken
        ("world_size", lambda v: s.read_step(0, 0, v)),
        ("upload_threads", lambda v: ProducerOptions(upload_threads=v)),
        ("max_lag_steps", lambda v: Producer(s.uri, "p", max_lag_steps=v).close()),
        ("read_threads", lambda v: StreamDataset(s.uri, group=None, read_threads=v)),
        ("prefetch", lambda v: StreamDataset(s.uri, group=None, prefetch=v)),
        ("start_step", lambda v: StreamDataset(s.uri, group=None, start_step=v)),
        ("keep_last", lambda v: StreamDataset(s.uri, group=None, keep_last=v)),
        ("batch_size", lambda v: StreamDataset(s.uri, group=None, batch_size=v)),
        ("shuffle_window", lambda v: StreamDataset([Source(s.uri)], group=None,
                                                   shuffle_window=v)),
        ("epochs", lambda v: StreamDataset([Source(s.uri)], group=None, epochs=v)),
    ]
    for name, call in options:
        with pytest.raises(ValueError, match=f"{name} must be .* int.*, got True"):
            call(True)
        call(np.int64(1))  # taken
    with pytest.raises(ValueError, match="max_staleness must be a non-negative int or None"):
        StreamDataset(s.uri, group=None, max_staleness=True)
