"""Stream URIs: a mistyped scheme is refused, never taken as a local folder."""

from __future__ import annotations

import pytest

import lakestream
from lakestream.store import LocalStore, open_store, split_uri
from tests.helpers import SCHEMA


@pytest.mark.parametrize("uri, meant", [
    ("s3:/bucket/x", "s3://bucket/x"), ("s3:bucket/x", "s3://bucket/x"),
    ("S3:/bucket/x", "s3://bucket/x"), ("s3a:/bucket/x", "s3a://bucket/x"),
    ("gs:/bucket/x", "gs://bucket/x"), ("abfs:/container/x", "abfs://container/x"),
])
def test_a_uri_with_one_slash_is_refused_and_creates_nothing(tmp_path, monkeypatch, uri: str,
                                                             meant: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"did you mean {meant}\\?"):
        open_store(uri)
    with pytest.raises(ValueError, match="did you mean"):
        lakestream.create(uri, SCHEMA, global_batch_size=4)
    assert list(tmp_path.iterdir()) == []


def test_local_paths_stay_local(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for uri in ("plain", "./s3:/bucket/x", "run:1", f"file://{tmp_path}/f", f"file:{tmp_path}/g"):
        assert isinstance(open_store(uri), LocalStore), uri
    assert split_uri("FILE:///tmp/x") == ("file", "/tmp/x")
    assert split_uri("S3A://bucket/x") == ("s3", "bucket/x")
    with pytest.raises(ValueError, match="unsupported stream URI 'GS://bucket/x'"):
        open_store("GS://bucket/x")
