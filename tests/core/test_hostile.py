"""What a writer of the stream's folder or log cannot do to the rest of the machine or the
stream (docs/deployment.md, "Threat model")."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import lakestream
from lakestream.errors import StoreError
from tests.helpers import SCHEMA, ids, rows

B = 4


def _old_files(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for k in range(n):
        f = folder / f"precious-{k}.parquet"
        f.write_bytes(b"not the stream's")
        os.utime(f, (time.time() - 3600, time.time() - 3600))
        files.append(f)
    return files


def _stream(tmp_path: Path) -> lakestream.Stream:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=B, snapshot_interval=5)
    for k in range(12):
        s.append(rows(4 * k, 4))
    return s


@pytest.mark.parametrize("linked", ["data", "_lakestream/index"])
def test_gc_never_deletes_through_a_link_out_of_the_stream(tmp_path, linked) -> None:
    s = _stream(tmp_path)
    outside = tmp_path / "elsewhere"
    precious = _old_files(outside, 3)
    real = Path(s.uri) / linked
    os.rename(real, tmp_path / "moved")  # the stream's own files, out of reach now
    os.symlink(outside, real)
    time.sleep(1.1)
    report = s.gc(grace_seconds=1)
    assert all(f.exists() for f in precious)
    assert report.skipped and "link" in report.skipped[0]
    assert report.log_entries > 0  # the log is compacted all the same
    if linked == "data":  # and nothing is written through it either
        with pytest.raises(StoreError, match="link"):
            s.append(rows(100, 4))
        assert sorted(p.name for p in outside.iterdir()) == sorted(f.name for f in precious)


def test_a_fragment_that_is_a_link_is_not_read_and_only_the_link_is_deleted(tmp_path) -> None:
    s = _stream(tmp_path)
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 100)
    first = s.state.fragments_between(0, 4)[0].path
    path = Path(s.uri) / first
    path.unlink()
    os.symlink(secret, path)
    fresh = lakestream.open(s.uri)
    with pytest.raises(StoreError, match="link"):
        fresh.read_step(0)
    assert ids(fresh.read_step(1)) == [4, 5, 6, 7]
    stray = Path(s.uri) / "data" / "_append" / "stray.parquet"
    os.symlink(secret, stray)
    os.utime(stray, (time.time() - 3600,) * 2, follow_symlinks=False)
    s.gc(grace_seconds=1)
    assert not stray.is_symlink() and secret.read_bytes() == b"x" * 100


def test_gc_skips_a_file_it_cannot_name_and_compacts(tmp_path) -> None:
    s = _stream(tmp_path)
    odd = Path(s.uri) / "data" / "evil"
    odd.mkdir()
    (odd / "a\\b.parquet").write_bytes(b"?")
    os.utime(odd / "a\\b.parquet", (time.time() - 3600,) * 2)
    time.sleep(1.1)
    report = s.gc(grace_seconds=1)
    assert report.log_entries > 0
    assert any("a\\\\b.parquet" in line for line in report.skipped), report.skipped
    assert (odd / "a\\b.parquet").exists()
