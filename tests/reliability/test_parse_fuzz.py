"""Every stored object a writer of the stream may forge parses, or raises a LakestreamError,
in bounded time and memory: log entries, snapshot manifests, the hint, progress objects,
fragment bytes (their page headers and dictionary pages too) and tensor metadata
(docs/deployment.md, "Threat model")."""

from __future__ import annotations

import json
import time
import zlib
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakestream.errors import LakestreamError
from lakestream.log.checksum import lines_checksum
from lakestream.log.codec import decode_entry
from lakestream.log.manifest import HINT_KEY
from lakestream.log.opening import read_hint
from lakestream.log.progress import progress_key, read_progress
from lakestream.log.replay import ReplayState
from lakestream.log.snapshot import decode_snapshot
from lakestream.read.fragments import FragmentReader
from lakestream.store import LocalStore
from tests.conftest import SOAK
from tests.helpers import SCHEMA, rows

EXAMPLES = 400 if SOAK else 60
BOUND_S = 1.0
"""Each parse, whatever it is given, ends within this (and decodes under ``BOUND_BYTES``)."""
BOUND_BYTES = 64 << 20

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                     st.floats(allow_nan=True), st.text(max_size=20))
_json = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=30)
_ops = st.sampled_from(["create", "append", "fence", "checkpoint", "register",
                        "remove_group", "seal", "reclaim", "compacted", "other"])
_field = st.sampled_from(["producer", "epoch", "seq", "state", "group", "step",
                          "checkpoint_id", "below_offset", "snapshot", "replaced",
                          "format", "commit_id", "prev"])


def _bounded(parse: Any) -> None:
    """Runs ``parse``: it returns, or raises a LakestreamError, within the bounds."""
    before, t0 = pa.total_allocated_bytes(), time.monotonic()
    try:
        parse()
    except LakestreamError:
        pass
    assert time.monotonic() - t0 < BOUND_S
    assert pa.total_allocated_bytes() - before < BOUND_BYTES


@st.composite
def _entries(draw: st.DrawFn) -> bytes:
    """Entries shaped like Lakestream's, fields of any JSON, checksummed as written: what a
    writer of the log that knows the format can put there."""
    info: dict[str, Any] = {"format": draw(st.sampled_from([1, 2, 3, 4, 5, "1", None])),
                            "op": draw(_ops), "commit_id": draw(_json)}
    info.update(draw(st.dictionaries(_field, _json, max_size=6)))
    if draw(st.booleans()):
        info["seq"] = draw(st.lists(st.integers(-(2**64), 2**64), min_size=2, max_size=2))
    actions: list[dict[str, Any]] = [{"commitInfo": {"lakestream": info}}]
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["add", "remove", "metaData", "txn", "protocol"]))
        body = draw(st.dictionaries(st.sampled_from(["path", "size", "tags", "stats"]),
                                    _json, max_size=4))
        if draw(st.booleans()):
            body["path"] = draw(st.sampled_from(["data/p/0-0-a.parquet", "../x", "/etc/x",
                                                 "data/a\\b.parquet", "data/\x1b.parquet"]))
            body["tags"] = {k: draw(st.one_of(st.integers(-(2**70), 2**70).map(str),
                                              st.text(max_size=5)))
                            for k in ("lakestream.rows", "lakestream.offset",
                                      "lakestream.seq", "lakestream.crc32")}
            body["size"] = draw(st.integers(-5, 2**70))
        actions.append({kind: body})
    info["crc32"] = lines_checksum(actions)
    lines = [json.dumps(a, allow_nan=True) for a in actions]
    if draw(st.booleans()):
        lines[0] = lines[0][:draw(st.integers(0, len(lines[0])))]  # torn
    return ("\n".join(lines) + "\n").encode()


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_entries(), st.integers(0, 5))
def test_any_entry_decodes_and_replays_or_is_a_typed_error(data: bytes, version: int) -> None:
    state = ReplayState()

    def parse() -> None:
        entry = decode_entry(version, data)
        state.version = version - 1
        state.apply(version, entry)

    _bounded(parse)


@st.composite
def _manifests(draw: st.DrawFn) -> bytes:
    keys = st.sampled_from(["format", "version", "next_offset", "reclaimed_below",
                            "reclaim_versions", "meta", "producers", "markers", "registered",
                            "sealed_at", "voided", "segments", "digest", "chained"])
    info = draw(st.dictionaries(keys, _json, max_size=14))
    info.setdefault("format", draw(st.sampled_from([2, 3, 4, 5])))
    info.setdefault("version", 0)
    body = json.dumps(info).encode()
    return body + b"\ncrc32:" + str(zlib.crc32(body)).encode() + b"\n"


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_manifests())
def test_any_manifest_decodes_or_is_a_typed_error(data: bytes) -> None:
    def missing(key: str) -> bytes:
        raise AssertionError("a segment was fetched while decoding a manifest")

    _bounded(lambda: decode_snapshot(0, data, missing))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.one_of(_json.map(lambda v: json.dumps({"version": v, "step": v})),
                 st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                 st.integers(1, 50_000).map(lambda d: '{"version": ' + "[" * d + "]" * d
                                            + ', "step": ' + "[" * d + "]" * d + "}")))
def test_any_hint_or_progress_reads_as_a_value_or_as_none(tmp_path, text: str) -> None:
    store = LocalStore(str(tmp_path))
    store.put(HINT_KEY, text.encode("utf-8", "surrogatepass"), mode="overwrite")
    store.put(progress_key("train"), text.encode("utf-8", "surrogatepass"), mode="overwrite")
    t0 = time.monotonic()
    hint = read_hint(store)
    progress = read_progress(store, "train")
    assert time.monotonic() - t0 < BOUND_S
    assert hint is None or (type(hint) is int and 0 <= hint < 2**63)
    assert progress is None or 0 <= progress.step < 2**63


def _valid_fragment(**options: Any) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(rows(0, 4), sink, **options)
    return sink.getvalue().to_pybytes()


VALID = _valid_fragment()
VARIANTS = [VALID, _valid_fragment(compression="zstd", use_dictionary=True),
            _valid_fragment(data_page_version="2.0", compression="none"),
            _valid_fragment(write_page_checksum=True, data_page_size=64)]
"""Fragments whose page headers and dictionary pages the mutations below land in."""


def _page_headers(body: bytes) -> list[int]:
    """Where the page headers of ``body`` start (the bytes worth mutating most)."""
    from lakestream.read.bounds import chunk_range
    from lakestream.read.pages import column_chunk_pages

    md = pq.ParquetFile(pa.BufferReader(body)).metadata
    starts = []
    for g in range(md.num_row_groups):
        for j in range(md.num_columns):
            lo, hi = chunk_range(md, g, j)
            starts += [p.offset for p in column_chunk_pages(body, lo, hi - lo,
                                                            md.row_group(g).column(j).num_values)]
    return starts


HEADERS = [_page_headers(v) for v in VARIANTS]


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    """A valid fragment with a few bytes changed: anywhere, or in its page headers."""
    which = draw(st.integers(0, len(VARIANTS) - 1))
    body = bytearray(VARIANTS[which])
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            at = draw(st.sampled_from(HEADERS[which])) + draw(st.integers(0, 40))
        else:
            at = draw(st.integers(0, len(body) - 1))
        body[min(at, len(body) - 1)] = draw(st.integers(0, 255))
    return bytes(body)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=2_000), _mutated()), st.booleans())
def test_any_fragment_bytes_read_as_the_log_says_or_are_a_typed_error(
        tmp_path, body: bytes, whole: bool) -> None:
    """Read by range (no checksum: the reader's own checks, not the CRC-32, are under
    test), or whole with a CRC-32 that matches (a writer of the log records what it likes)."""
    store = LocalStore(str(tmp_path))
    store.put("data/p/f.parquet", body, mode="overwrite")
    reader = FragmentReader(store, cache_size=0, schema=SCHEMA)
    crc = zlib.crc32(body) if whole else -1

    def parse() -> None:
        table = reader.read("data/p/f.parquet", len(body), 0, 4, crc32=crc, rows=4)
        assert table.num_rows == 4 and table.schema.types == SCHEMA.types

    _bounded(parse)


_dims = st.one_of(st.integers(-3, 2**70), st.text(max_size=3), st.none(), st.booleans())


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.fixed_dictionaries({"shape": st.lists(_dims, max_size=40),
                           "dtype": st.sampled_from(["uint8", "bfloat16", "x", 7, None])})
    .map(json.dumps),
    _json.map(json.dumps),
    st.integers(1, 50_000).map(lambda d: '{"shape": ' + "[" * d + "]" * d + "}"),
    st.binary(max_size=100).map(lambda b: b.decode("latin-1"))))
def test_any_tensor_metadata_is_a_spec_or_a_value_error(text: str) -> None:
    """A stream's schema comes from its log: its tensor metadata gives a spec whose values
    fit a binary column, or a ValueError (collation turns it into CorruptLogError)."""
    from lakestream.schema.tensors import MAX_TENSOR_BYTES, TENSOR_KEY, tensor_spec

    field = pa.field("x", pa.binary(), metadata={TENSOR_KEY: text.encode("utf-8",
                                                                          "surrogatepass")})
    t0 = time.monotonic()
    try:
        spec = tensor_spec(field)
    except ValueError:
        spec = None
    assert time.monotonic() - t0 < BOUND_S
    assert spec is None or 0 < spec.nbytes <= MAX_TENSOR_BYTES
