"""Bad inputs the rest of the suite does not already cover: each raises a typed error that
names what was wrong, and leaves the stream unchanged (same version, nothing uploaded)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pyarrow as pa
import pytest

import lakestream
from lakestream.errors import SchemaMismatchError, TooLargeError
from lakestream.producers import Producer, ProducerOptions
from lakestream.schema.conform import finite
from tests.helpers import SCHEMA, rows

ROOT = Path(__file__).resolve().parents[2]
GUARDED = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    finite(pa.field("reward", pa.float32())),
    finite(pa.field("logprobs", pa.list_(pa.float32()))),
])


def _unchanged(s: lakestream.Stream, version: int) -> bool:
    return s.refresh() == version and not list(s.store.list("data/"))


@pytest.mark.parametrize("column, value", [
    ("reward", math.nan), ("reward", math.inf), ("logprobs", [0.0, -math.inf]),
    ("logprobs", [math.nan]),
])
def test_non_finite_values_are_refused_where_the_schema_forbids_them(tmp_path, column, value):
    s = lakestream.create(str(tmp_path / "s"), GUARDED, global_batch_size=2)
    good = {"id": [0, 1], "reward": [0.5, 1.0], "logprobs": [[-0.1], [-0.2]]}
    bad = {**good, column: [good[column][0], value]}
    with pytest.raises(SchemaMismatchError, match=f"column {column} holds 1 NaN or infinite"):
        s.append(bad)
    with Producer(s.uri, "p") as p, pytest.raises(SchemaMismatchError, match=column):
        p.write(bad)
    assert s.refresh() == 1  # only the producer's fence
    s.append(good)  # the constraint survives reopening: it lives in the stream's schema
    assert lakestream.open(s.uri).schema.field(column).metadata == GUARDED.field(column).metadata


def test_without_the_constraint_nan_is_data(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=2)
    s.append({"id": [0, 1], "tokens": [[1], [2]], "reward": [math.nan, 1.0]})
    assert math.isnan(s.read_step(0).column("reward")[0].as_py())


def test_an_oversized_sample_is_refused_naming_it(tmp_path) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    big = rows(0, 4).set_column(1, "tokens", pa.array(
        [[1], [2], list(range(5000)), [3]], pa.list_(pa.int32())))
    with Producer(s.uri, "p", options=ProducerOptions(max_sample_bytes=10_000)) as p:
        with pytest.raises(TooLargeError, match="sample 2 of the write is about 20.* bytes, over "
                                             "max_sample_bytes=10000"):
            p.write(big)
        version = p.stream.version
    assert _unchanged(s, version)


@pytest.mark.parametrize("seed", range(20))
def test_the_sample_size_check_skips_no_oversized_sample(seed: int) -> None:
    """The check sizes rows only when a column total could exceed the limit: on sliced,
    chunked, null-holding tables of lists, strings and scalars it finds exactly the rows a
    row-by-row sizing finds, at limits on both sides of the largest sample."""
    import random

    from lakestream.schema.conform import oversized_sample, sample_bytes

    rng = random.Random(seed)
    n = rng.randint(1, 40)

    def lists() -> list[list[int] | None]:
        return [None if rng.random() < 0.1 else list(range(rng.randint(0, 300)))
                for _ in range(n)]

    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "tokens": pa.array(lists(), pa.list_(pa.int32())),
        "nested": pa.array([[x] if x else x for x in lists()], pa.list_(pa.list_(pa.int16()))),
        "text": pa.array([None if rng.random() < 0.1 else "x" * rng.randint(0, 900)
                          for _ in range(n)]),
        "flag": pa.array([rng.random() < 0.5 for _ in range(n)]),
    })
    if n > 2 and rng.random() < 0.5:
        table = table.slice(1, n - 2)
    if rng.random() < 0.5:
        table = pa.concat_tables([table.slice(0, table.num_rows // 2),
                                  table.slice(table.num_rows // 2)])
    sizes = sample_bytes(table).to_pylist()
    largest = max(sizes)
    for limit in (0, largest - 1, largest, largest + 1, 10 * largest + 10):
        found = oversized_sample(table, limit)
        expected = None if largest <= limit else (sizes.index(largest), largest)
        assert found == expected, (limit, found, expected)


@pytest.mark.parametrize("data, error, match", [
    ([], ValueError, "0 rows"),
    ({"id": [], "tokens": [], "reward": []}, ValueError, "0 rows"),
    ("id,tokens,reward", TypeError, "cannot write a str"),
    (None, TypeError, "cannot write a NoneType"),
])
def test_empty_and_non_tabular_writes(tmp_path, data, error, match) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=4)
    with pytest.raises(error, match=match):
        s.append(data)
    assert _unchanged(s, 0)


def test_no_unsafe_deserialisation_of_stream_data() -> None:
    # Samples are Arrow types; entries, snapshots and progress are JSON. Nothing read from a
    # store may be unpickled (pickle, torch.load with pickles, marshal, eval), but for a DCP
    # checkpoint's .metadata, a pickle by DCP's format: loaders/safe_load.py unpickles it
    # with an Unpickler whose find_class admits torch's metadata classes alone, and loads
    # other values with torch.load(weights_only=True).
    pattern = re.compile(r"pickle\.loads?\(|torch\.load\((?!.*weights_only=True)|"
                         r"marshal\.loads?\(|\beval\(|weights_only\s*=\s*False|import pickle")
    allowed = ROOT / "loaders" / "safe_load.py"
    offenders = []
    for folder in ("lakestream", "producers", "loaders", "demo"):
        for path in (ROOT / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and not (path == allowed and "import pickle" in line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []
    restricted = allowed.read_text()
    assert "class _MetadataUnpickler(pickle.Unpickler)" in restricted
    assert "def find_class(" in restricted and "pickle.load(" not in restricted


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("data", [
    {"id": [0, 1], "tokens": [[1], [2]], "reward": [1e300, 0.5]},
    [{"id": 0, "tokens": [1], "reward": -4e38}, {"id": 1, "tokens": [2], "reward": 0.5}],
], ids=["columns", "rows"])
def test_a_value_beyond_float32_is_refused_not_stored_as_infinity(tmp_path, data) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=2)
    files = _files(tmp_path / "s")
    with pytest.raises(SchemaMismatchError, match=r"column reward holds 1 finite values beyond "
                                                  r"the range of float"):
        s.append(data)
    assert s.refresh() == 0 and _files(tmp_path / "s") == files
    with Producer(s.uri, "p") as p:
        with pytest.raises(SchemaMismatchError, match="column reward"):
            p.write(data)
        version = p.stream.version
    assert _unchanged(s, version)


@pytest.mark.parametrize("t, value", [
    (pa.list_(pa.float32(), 2), [1.0, 1e39]),
    (pa.struct([("x", pa.float32())]), {"x": -1e39}),
    (pa.list_(pa.list_(pa.float32())), [[1.0], [7e38]]),
], ids=["fixed-size-list", "struct", "nested-list"])
def test_overflow_is_caught_at_any_depth_and_ints_stay_exact(tmp_path, t, value) -> None:
    schema = pa.schema([("id", pa.int64()), ("v", t)])
    s = lakestream.create(str(tmp_path / "s"), schema, global_batch_size=1)
    with pytest.raises(SchemaMismatchError, match="column v holds 1 finite values beyond"):
        s.append({"id": [0], "v": [value]})
    assert s.refresh() == 0
    plain = lakestream.create(str(tmp_path / "p"), pa.schema([("r", pa.float32())]),
                              global_batch_size=1)
    with pytest.raises(SchemaMismatchError, match="16777217"):  # as before: not rounded
        plain.append({"r": [16777217]})


def test_a_state_with_non_string_keys_is_refused(tmp_path) -> None:
    """JSON would hand ``{1: "a"}`` back as ``{"1": "a"}`` after a restart."""
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=2)
    with Producer(s.uri, "p") as p:
        version = p.stream.version
        for state in ({1: "a"}, {"cursor": {"shard": [{2: 0}]}}):
            with pytest.raises(TypeError, match=r"entry state key at state\[.*\] is not a "
                                                r"string"):
                p.write(rows(0, 2), state=state)
    assert _unchanged(s, version)
    with Producer(s.uri, "p") as p:
        p.write(rows(0, 2), state={"1": "a"})
    with Producer(s.uri, "p") as p:
        assert p.state == {"1": "a"}


@pytest.mark.parametrize("producer_id", ["r\n", "r\r", "../x", "a/b", ""])
def test_a_bad_producer_id_commits_no_fence(tmp_path, producer_id) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=2)
    files = _files(tmp_path / "s")
    with pytest.raises(ValueError, match="producer id .* is not valid"):
        Producer(s.uri, producer_id)
    assert s.refresh() == 0 and _files(tmp_path / "s") == files


@pytest.mark.parametrize("group", ["../x", "a/b", "x\n", ""])
def test_a_bad_group_commits_no_marker_or_registration(tmp_path, group) -> None:
    s = lakestream.create(str(tmp_path / "s"), SCHEMA, global_batch_size=2)
    s.append(rows(0, 2))
    files = _files(tmp_path / "s")
    for call in (lambda: s.mark_checkpoint(group, 0), lambda: s.register_group(group),
                 lambda: s.remove_group(group)):
        with pytest.raises(ValueError, match="consumer group .* is not valid"):
            call()
    assert s.refresh() == 1 and _files(tmp_path / "s") == files
