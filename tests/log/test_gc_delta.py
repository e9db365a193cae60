"""gc keeps the Delta log bounded: old Delta checkpoints go with the entries they cover."""

from __future__ import annotations

import lakestream
from lakestream.log.keys import LOG_DIR, is_delta_checkpoint_key
from lakestream.store import LocalStore
from tests.helpers import SCHEMA, delta_ids, rows


def _checkpoints(uri: str) -> list[int]:
    found = (is_delta_checkpoint_key(m.key) for m in LocalStore(uri).list(LOG_DIR))
    return sorted(v for v in found if v is not None)


def test_gc_deletes_delta_checkpoints_older_than_what_it_keeps(tmp_path) -> None:
    # Regression: every gc wrote a Delta checkpoint but compaction deleted only .json
    # entries, so checkpoint files piled up, one per gc, for ever.
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4, snapshot_interval=2)
    written = 0
    for _round in range(4):
        for _ in range(3):
            s.append(rows(written, 4))
            written += 4
        s.gc(grace_seconds=0)
    assert _checkpoints(uri) == [s.version]  # only the one the last gc wrote
    assert delta_ids(uri, None) == list(range(written))
    assert lakestream.open(uri).num_samples == written


def test_gc_keeps_the_checkpoint_delta_readers_are_pointed_at(tmp_path, monkeypatch) -> None:
    # Another gc or engine may rewrite _last_checkpoint to an older checkpoint than the one
    # this gc wrote: that one, and the entries after it, must stay.
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=4, snapshot_interval=2)
    for i in range(3):
        s.append(rows(4 * i, 4))
    s.gc(grace_seconds=0)
    older = LocalStore(uri).get("_delta_log/_last_checkpoint")
    for i in range(3, 9):
        s.append(rows(4 * i, 4))
    write = lakestream.log.gc._write_delta_checkpoint

    def then_a_rival_points_back(uri_: str, options: dict[str, str] | None,
                                 report: object) -> int | None:
        version = write(uri_, options, report)
        LocalStore(uri).put("_delta_log/_last_checkpoint", older)
        return version

    monkeypatch.setattr(lakestream.log.gc, "_write_delta_checkpoint", then_a_rival_points_back)
    s.gc(grace_seconds=0)
    assert _checkpoints(uri) == [3, 9]
    assert delta_ids(uri, None) == list(range(36))
