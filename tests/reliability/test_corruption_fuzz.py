"""Bit flips, truncations and emptied objects in log entries, snapshots, index segments and
Parquet fragments. Reading the stream either fails with a typed error that names the damaged
object or returns exactly the original data (a damaged snapshot falls back to an older one
plus replay; an entry behind a snapshot is not read at all); ``verify``, which reads
everything, names every damaged object. Nothing is ever read as other data."""

from __future__ import annotations

import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import lakestream
from lakestream.errors import CorruptLogError
from lakestream.log.entries import Fence
from lakestream.ops.verify import verify
from lakestream.producers import Producer
from lakestream.store import open_store
from tests.conftest import SOAK
from tests.helpers import SCHEMA, rows

B = 8


def _everything(uri: str) -> dict[str, Any]:
    s = lakestream.open(uri)
    return {"version": s.version, "samples": s.num_samples, "producers": s.producers,
            "markers": [(m.step, m.checkpoint_id) for m in s.checkpoints("train")],
            "steps": [s.read_step(k).to_pylist() for k in range(s.num_steps)]}


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("fuzz") / "s"
    s = lakestream.create(str(root), SCHEMA, global_batch_size=B, group_size=4,
                          snapshot_interval=3)
    with Producer(str(root), "w") as p:
        for k in range(12):
            p.write(rows(4 * k, 4), state={"next": k + 1})
            if k % 3 == 2:
                p.flush()
    s.refresh()
    s.mark_checkpoint("train", 2, "ckpt-2")
    s.commit(lambda _s, cid: Fence("other", 1, cid))
    s.append(rows(48, 8))
    while s.version % 3 != 2:  # leave a tail of entries past the newest snapshot
        s.mark_checkpoint("train", 3, f"ckpt-3-{s.version}")
    return root, _everything(str(root))


def _victims(root: Path) -> list[tuple[str, Path]]:
    out = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name.startswith("."):
            continue
        rel = path.relative_to(root).as_posix()
        if rel.startswith("_delta_log/") and rel.endswith(".json"):
            out.append(("log", path))
        elif rel.startswith("_lakestream/snapshots/"):
            out.append(("snapshot", path))
        elif rel.startswith("_lakestream/index/"):
            out.append(("segment", path))
        elif rel.startswith("data/"):
            out.append(("fragment", path))
    return out


def _damage(data: bytes, how: str, rng: random.Random) -> bytes:
    if how == "flip":
        i = rng.randrange(len(data))
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]
    if how == "truncate":
        return data[:rng.randrange(len(data))]
    return b""


def _names(message: str, kind: str, rel: str) -> bool:
    if kind == "log":
        return f"log version {int(Path(rel).stem)}" in message
    return rel in message


TRIALS = 3000 if SOAK else 250


def test_every_damage_is_caught_or_recovered(original, tmp_path, tally: Counter[str]) -> None:
    root, want = original
    rng = random.Random(0)
    kinds: Counter[str] = Counter()
    detected = 0
    for trial in range(TRIALS):
        work = tmp_path / f"t{trial}"
        shutil.copytree(root, work)
        kind, victim = rng.choice(_victims(work))
        how = rng.choice(["flip", "flip", "truncate", "empty"])
        rel = victim.relative_to(work).as_posix()
        before = victim.read_bytes()
        after = _damage(before, how, rng)
        victim.write_bytes(after)
        try:
            got = _everything(str(work))
        except CorruptLogError as e:
            assert _names(str(e), kind, rel), f"{how} of {rel}: {e} does not name it"
            outcome = "read-failed"
        else:
            assert got == want, f"{how} of {rel} was read as other data"
            outcome = "read-intact"
        problems = verify(open_store(str(work))).problems
        if after != before:
            assert any(_names(p, kind, rel) for p in problems), \
                f"{how} of {rel}: verify did not name it: {problems}"
            detected += 1
        kinds[f"{kind}.{how}.{outcome}"] += 1
        shutil.rmtree(work)
    tally["corruptions_tried"] += TRIALS
    tally["corruptions_detected_by_verify"] += detected
    for k, n in kinds.items():
        tally[f"corruption.{k}"] += n
    assert sum(n for k, n in kinds.items() if k.startswith("fragment.")) > TRIALS // 10
