"""Importing existing datasets: Parquet, a Hugging Face dataset saved to disk and WebDataset
shards come in whole, in order, exactly once, also when the importing process is killed
midway (by a real SIGKILL at a crash point) and run again; bad input changes nothing."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lakestream
from lakestream.ops.cli import main
from lakestream.producers import Producer, importing
from lakestream.producers.importing import import_dataset
from lakestream.producers.sources import open_dataset

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("id", pa.int64()), ("text", pa.string())])


def _parquet(folder: Path, rows: int, files: int) -> Path:
    folder.mkdir()
    per = rows // files
    for k in range(files):
        ids = range(k * per, (k + 1) * per)
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()),
                                 "text": [f"row {i}" for i in ids],
                                 "score": [0.5] * per}),
                       folder / f"part-{k:03d}.parquet", row_group_size=7_000)
    return folder


def _shards(folder: Path, samples: int, shards: int) -> Path:
    folder.mkdir()
    per = samples // shards
    for k in range(shards):
        with tarfile.open(folder / f"shard-{k:03d}.tar", "w") as tar:
            for i in range(k * per, (k + 1) * per):
                for ext, body in (("jpg", i.to_bytes(4, "big") * 8), ("cls", str(i).encode()),
                                  ("json", json.dumps({"i": i}).encode())):
                    info = tarfile.TarInfo(f"s/{i:07d}.{ext}")
                    info.size = len(body)
                    tar.addfile(info, io.BytesIO(body))
    return folder


def _column(uri: str, name: str) -> list[object]:
    s = lakestream.open(uri)
    return [v for step in range(s.num_steps) for v in s.read_step(step).column(name).to_pylist()]


def _import_killed(uri: str, paths: str, failpoint: str, **kwargs: object) -> int:
    """Runs the import in a child killed at ``failpoint``; returns its exit status."""
    code = ("import sys, json; from lakestream.producers.importing import import_dataset; "
            "import_dataset(sys.argv[1], sys.argv[2], write_bytes=16_000, "
            "**json.loads(sys.argv[3]))")
    env = {**os.environ, "LAKESTREAM_FAILPOINT": failpoint}
    return subprocess.run([sys.executable, "-c", code, uri, paths, json.dumps(kwargs)],
                          cwd=ROOT, env=env, timeout=120, capture_output=True).returncode


@pytest.mark.parametrize("failpoint", ["after_commit@2", "after_upload@9"])
def test_100k_parquet_rows_killed_midway_come_in_exactly_once(tmp_path, failpoint) -> None:
    data = _parquet(tmp_path / "data", 100_000, 4)
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=1000)
    assert _import_killed(uri, str(data), failpoint) == -9
    landed = lakestream.open(uri).num_samples
    # Killed midway; at the second commit (the first is the producer's fence) with rows
    # committed, at an upload with some committed or none, as the committer kept up.
    assert landed < 100_000 and (landed > 0 or failpoint.startswith("after_upload")), landed
    result = import_dataset(uri, str(data), write_bytes=64_000)
    assert result.resumed_from == landed and result.rows == 100_000 - landed
    assert result.ignored_fields == ("score",)
    assert _column(uri, "id") == list(range(100_000))
    again = import_dataset(uri, str(data))  # done: nothing left to write
    assert (again.rows, again.resumed_from, again.writes) == (0, 100_000, 0)


def test_webdataset_shards_killed_midway_come_in_exactly_once(tmp_path, capsys) -> None:
    data = _shards(tmp_path / "shards", 6_000, 3)
    uri = str(tmp_path / "s")
    lakestream.create(uri, pa.schema([("key", pa.string()), ("image", pa.binary()),
                                      ("label", pa.int64()),
                                      ("meta", pa.struct([("i", pa.int64())]))]),
                      global_batch_size=100)
    mapping = {"key": "__key__", "image": "jpg", "label": "cls", "meta": "json"}
    assert _import_killed(uri, str(data), "after_commit@3", columns=mapping) == -9
    landed = lakestream.open(uri).num_samples
    assert 0 < landed < 6_000, landed
    assert main(["import", uri, str(data), "--map", "key=__key__", "--map", "image=jpg",
                 "--map", "label=cls", "--map", "meta=json"]) == 0
    said = capsys.readouterr().out
    assert f"imported {6_000 - landed:,} rows after the {landed:,} an earlier run committed" \
        in said, said
    assert _column(uri, "label") == list(range(6_000))
    assert _column(uri, "key")[:2] == ["s/0000000", "s/0000001"]
    assert _column(uri, "meta")[5999] == {"i": 5999}
    assert _column(uri, "image")[7] == (7).to_bytes(4, "big") * 8


def test_a_saved_hugging_face_dataset_comes_in_by_split(tmp_path, capsys) -> None:
    datasets = pytest.importorskip("datasets")  # a dev dependency: missing only off CI
    splits = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"id": list(range(900)),
                                             "text": [f"t{i}" for i in range(900)]}),
        "test": datasets.Dataset.from_dict({"id": [1], "text": ["x"]})})
    splits.save_to_disk(str(tmp_path / "hf"), num_shards={"train": 3, "test": 1})
    uri = str(tmp_path / "s")
    with pytest.raises(ValueError, match=r"dataset dict with splits \['train', 'test'\]"):
        import_dataset(uri, str(tmp_path / "hf"), global_batch_size=100)
    assert not (tmp_path / "s").exists()
    assert main(["import", uri, str(tmp_path / "hf"), "--split", "train",
                 "--global-batch-size", "100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 900
    s = lakestream.open(uri)
    assert s.schema == pa.schema([("id", pa.int64()), ("text", pa.string())])
    assert _column(uri, "id") == list(range(900))


def test_bad_input_changes_nothing(tmp_path, capsys) -> None:
    data = _parquet(tmp_path / "data", 1_001, 1)
    other = _parquet(tmp_path / "other", 1_000, 2)
    uri = str(tmp_path / "s")
    s = lakestream.create(uri, SCHEMA, global_batch_size=2, group_size=2)
    with pytest.raises(ValueError, match="1001 rows left to import are not whole groups of 2"):
        import_dataset(uri, str(data))
    with pytest.raises(ValueError, match=r"column 'text' has no field 'body'.*--map text=FIELD"):
        import_dataset(uri, str(other), columns={"text": "body"})
    with pytest.raises(ValueError, match=r"names \['label'\], not columns of the stream"):
        import_dataset(uri, str(other), columns={"label": "id"})
    with pytest.raises(ValueError, match="no Parquet files or tar shards"):
        import_dataset(uri, str(tmp_path / "nothing-*.parquet"))
    assert lakestream.open(uri).version == s.version  # not even a producer's fence
    import_dataset(uri, str(other))
    version = lakestream.open(uri).version
    with pytest.raises(ValueError, match="has committed an import of another dataset"):
        import_dataset(uri, str(_parquet(tmp_path / "third", 10, 1)))
    assert lakestream.open(uri).version == version
    with pytest.raises(SystemExit):
        main(["import", uri, str(other), "--map", "text"])
    assert "is not COLUMN=FIELD" in capsys.readouterr().err


def test_an_import_fencing_a_running_one_resumes_after_what_that_one_committed(
        tmp_path, monkeypatch) -> None:
    """The state is read before the producer opens; an older instance still running may
    commit more before the fence: the import resumes after that, not before it."""
    data = _parquet(tmp_path / "data", 3_000, 3)
    uri = str(tmp_path / "s")
    lakestream.create(uri, SCHEMA, global_batch_size=100)
    fingerprint = open_dataset(str(data)).fingerprint
    real = importing.Producer

    def fenced_late(*args: object, **kwargs: object) -> Producer:
        with real(uri, "import") as older:  # commits the first file, then is fenced
            older.write(pq.read_table(data / "part-000.parquet", columns=["id", "text"]),
                        state={"import": fingerprint, "file": 1, "row": 0, "rows": 1_000})
        return real(*args, **kwargs)

    monkeypatch.setattr(importing, "Producer", fenced_late)
    result = import_dataset(uri, str(data))
    assert (result.resumed_from, result.rows) == (1_000, 2_000)
    assert _column(uri, "id") == list(range(3_000))
