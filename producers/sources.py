"""Datasets that already exist, read as the importer needs them: a fixed list of files in a
fixed order, each read from any row on, so that an import resumes where it stopped.

Three kinds: Parquet files (a file, a folder of them, or a glob), a Hugging Face dataset
saved with ``save_to_disk`` (Arrow stream files, in the order its ``state.json`` lists), and
WebDataset tar shards (each sample the consecutive members sharing a key; each extension a
field, the key ``__key__``). Local paths only.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

FORMATS = ("parquet", "hf", "webdataset")
EDGE_BYTES = 4096
"""What of each file the fingerprint reads."""
KEY_FIELD = "__key__"
"""A WebDataset sample's key, as a field of its own."""


@dataclass(frozen=True)
class Position:
    """Where an import stands: the rows of file ``file`` before ``row`` are imported, and
    every file before it."""

    file: int
    row: int


@dataclass(frozen=True)
class DatasetFiles:
    """A dataset to import: its kind, its files in reading order, and the fields a file
    holds (for WebDataset, those of its first sample: others may hold more or fewer)."""

    kind: str
    files: tuple[str, ...]
    sizes: tuple[int, ...]
    schema: pa.Schema
    """The fields every file holds (for WebDataset, those of its first sample)."""
    rows: int | None
    """All its rows, where the files' metadata says (None for WebDataset)."""
    row_bytes: float
    """About how many bytes a row takes in memory (from the first row group, batch or
    sample), to read in pieces of a bounded size."""

    @property
    def fingerprint(self) -> str:
        """A digest of the kind and, in order, each file's name, size and edge (the 4 KiB
        at its end for Parquet, its footer's; at its start otherwise): an import resumes
        only the dataset it started (a copy elsewhere counts as the same), also where
        another dataset's files have the same names and sizes."""
        digest = hashlib.sha256(json.dumps([self.kind]).encode())
        for path, size in zip(self.files, self.sizes, strict=True):
            digest.update(json.dumps([os.path.basename(path), size]).encode())
            with open(path, "rb") as f:
                if self.kind == "parquet":
                    f.seek(max(0, size - EDGE_BYTES))
                digest.update(f.read(EDGE_BYTES))
        return digest.hexdigest()[:32]

    def read(self, start: Position, fields: dict[str, pa.Field],
             rows: int) -> Iterator[tuple[Position, pa.Table]]:
        """From ``start`` on, tables of up to ``rows`` rows holding ``fields`` (the name in
        the dataset -> the field it becomes), each with the position of its first row.

        Raises:
            ValueError: a file lacks a field (Parquet, Arrow), or a WebDataset value does
                not convert to its field's type; the message names the file.
        """
        reader = {"parquet": _parquet, "hf": _arrow, "webdataset": _tar}[self.kind]
        for i in range(start.file, len(self.files)):
            first = start.row if i == start.file else 0
            for row, table in reader(self.files[i], first, fields, rows):
                yield Position(i, row), table


def open_dataset(paths: str | Sequence[str], kind: str | None = None,
                 split: str | None = None) -> DatasetFiles:
    """The dataset at ``paths``: files, folders or globs (``kind`` None: told by what they
    hold). ``split`` picks one split of a saved Hugging Face ``DatasetDict``.

    Raises:
        ValueError: nothing found, an unknown or mixed kind, a dataset dict without
            ``split``, or a saved dataset whose rows are an index over others.
    """
    given = [paths] if isinstance(paths, str) else list(paths)
    if kind is not None and kind not in FORMATS:
        raise ValueError(f"unknown dataset format {kind!r}; use one of {list(FORMATS)}")
    if len(given) == 1 and os.path.isdir(given[0]) and (
            kind == "hf" or kind is None and _is_saved_dataset(given[0])):
        return _saved_dataset(given[0], split)
    files = _expand(given)
    if not files:
        raise ValueError(f"no Parquet files or tar shards at {given}: pass files, folders "
                         "or globs (a saved Hugging Face dataset: its folder)")
    found = {"webdataset" if f.endswith(".tar") else "parquet" for f in files}
    if kind is None and len(found) > 1:
        raise ValueError(f"{given} hold both Parquet files and tar shards: import each apart")
    kind = kind or found.pop()
    sizes = tuple(os.path.getsize(f) for f in files)
    if kind == "parquet":
        opened = [pq.ParquetFile(f) for f in files]
        metas = [p.metadata for p in opened]
        first = next((m.row_group(0) for m in metas if m.num_row_groups), None)
        row_bytes = first.total_byte_size / max(1, first.num_rows) if first else 1.0
        shared = set.intersection(*(set(p.schema_arrow.names) for p in opened))
        schema = pa.schema([f for f in _plain(opened[0].schema_arrow) if f.name in shared])
        return DatasetFiles(kind, tuple(files), sizes, schema,
                            sum(m.num_rows for m in metas), row_bytes)
    if kind == "webdataset":
        schema, row_bytes = _tar_schema(files[0])
        return DatasetFiles(kind, tuple(files), sizes, schema, None, row_bytes)
    raise ValueError(f"a saved Hugging Face dataset is a folder (with state.json), not {given}")


def _expand(given: list[str]) -> list[str]:
    """Files, folders (their ``.parquet`` and ``.tar`` files, recursively, sorted) and
    globs (sorted), in the order given, each file once."""
    out: list[str] = []
    for path in given:
        if os.path.isdir(path):
            found = [os.path.join(d, n) for d, _, names in os.walk(path) for n in names
                     if n.endswith((".parquet", ".tar")) and not n.startswith((".", "_"))]
        elif os.path.exists(path):
            found = [path]
        else:
            found = glob.glob(path)
        out.extend(f for f in sorted(found) if f not in out)
    return out


def _plain(schema: pa.Schema) -> pa.Schema:
    """A schema without the metadata writers add (pandas, Hugging Face features)."""
    return pa.schema([f.remove_metadata() for f in schema])


def _is_saved_dataset(folder: str) -> bool:
    return any(os.path.exists(os.path.join(folder, n))
               for n in ("state.json", "dataset_dict.json"))


def _saved_dataset(folder: str, split: str | None) -> DatasetFiles:
    """A Hugging Face dataset saved with ``save_to_disk`` (a split of a dict, by name)."""
    if os.path.exists(os.path.join(folder, "dataset_dict.json")):
        with open(os.path.join(folder, "dataset_dict.json")) as f:
            splits = json.load(f).get("splits", [])
        if split is None or split not in splits:
            raise ValueError(f"{folder} is a dataset dict with splits {splits}: pick one "
                             "(split=, --split)")
        folder = os.path.join(folder, split)
    with open(os.path.join(folder, "state.json")) as f:
        state = json.load(f)
    if state.get("_indices_data_files"):
        raise ValueError(f"{folder} holds an index over its rows (a shuffle or select "
                         "saved without flatten_indices()): save it again after "
                         "dataset.flatten_indices()")
    files = tuple(os.path.join(folder, d["filename"]) for d in state["_data_files"])
    rows, schema, row_bytes = 0, None, 1.0
    for path in files:
        with pa.memory_map(path) as source:
            reader = pa.ipc.open_stream(source)
            schema = schema or reader.schema
            for batch in reader:
                if not rows and batch.num_rows:
                    row_bytes = batch.nbytes / batch.num_rows
                rows += batch.num_rows
    if schema is None:
        raise ValueError(f"{folder} lists no data files in its state.json")
    return DatasetFiles("hf", files, tuple(os.path.getsize(f) for f in files), _plain(schema),
                        rows, row_bytes)


def _select(table: pa.Table, fields: dict[str, pa.Field], path: str) -> pa.Table:
    missing = sorted(set(fields) - set(table.schema.names))
    if missing:
        raise ValueError(f"{path} has no field {missing[0]!r} (it has {table.schema.names})")
    return pa.table({fields[name].name: table.column(name) for name in fields})


def _parquet(path: str, first: int, fields: dict[str, pa.Field],
             rows: int) -> Iterator[tuple[int, pa.Table]]:
    """Row ``first`` on, from the row group holding it."""
    file = pq.ParquetFile(path)
    meta = file.metadata
    start, groups = 0, list[int]()
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if groups or start + n > first:
            groups.append(g)
        else:
            start += n
    if not groups:
        return
    missing = sorted(set(fields) - set(file.schema_arrow.names))
    if missing:
        raise ValueError(f"{path} has no field {missing[0]!r} (it has "
                         f"{file.schema_arrow.names})")
    skip = first - start
    for batch in file.iter_batches(batch_size=rows, row_groups=groups, columns=list(fields),
                                   use_threads=False):
        table = pa.Table.from_batches([batch])
        if skip:
            cut = min(skip, table.num_rows)
            table, skip, start = table.slice(cut), skip - cut, start + cut
        if table.num_rows:
            yield start, _select(table, fields, path)
            start += table.num_rows


def _arrow(path: str, first: int, fields: dict[str, pa.Field],
           rows: int) -> Iterator[tuple[int, pa.Table]]:
    """An Arrow stream file (memory-mapped: skipped batches are never copied)."""
    start = 0
    with pa.memory_map(path) as source:
        for batch in pa.ipc.open_stream(source):
            for lo in range(0, batch.num_rows, rows):
                piece = batch.slice(lo, rows)
                end = start + piece.num_rows
                if end > first:
                    cut = max(0, first - start)
                    yield start + cut, _select(pa.Table.from_batches([piece]).slice(cut),
                                               fields, path)
                start = end


def _tar_schema(path: str) -> tuple[pa.Schema, float]:
    """The fields of the first sample of a shard (its key, then each extension, as bytes),
    and its size."""
    for sample in _samples(path):
        return pa.schema([(KEY_FIELD, pa.string())] + [
            (name, pa.binary()) for name in sorted(sample) if name != KEY_FIELD]), \
            float(sum(len(v) for v in sample.values()))
    raise ValueError(f"{path} holds no samples")


def _samples(path: str) -> Iterator[dict[str, bytes | str]]:
    """Each sample of a shard: the members that share a key (the member's name up to the
    first dot of its last part), read in one pass."""
    sample: dict[str, bytes | str] = {}
    with tarfile.open(path, "r|*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            folder, _, name = member.name.rpartition("/")
            stem, dot, extension = name.partition(".")
            if not dot or not stem:
                continue  # not a sample's field (a README, a hidden file such as ._0.jpg)
            key = f"{folder}/{stem}" if folder else stem
            if sample and sample[KEY_FIELD] != key:
                yield sample
                sample = {}
            handle = tar.extractfile(member)
            if handle is None:
                continue
            sample[KEY_FIELD] = key
            sample[extension] = handle.read()
    if sample:
        yield sample


def _tar(path: str, first: int, fields: dict[str, pa.Field],
         rows: int) -> Iterator[tuple[int, pa.Table]]:
    batch: list[dict[str, bytes | str]] = []
    start = first
    for i, sample in enumerate(_samples(path)):
        if i < first:
            continue
        batch.append(sample)
        if len(batch) == rows:
            yield start, _tar_table(batch, fields, path)
            start += len(batch)
            batch = []
    if batch:
        yield start, _tar_table(batch, fields, path)


def _tar_table(samples: list[dict[str, bytes | str]], fields: dict[str, pa.Field],
               path: str) -> pa.Table:
    """Samples as columns: bytes as they are, text for string fields, numbers and JSON
    parsed for the other types; a field a sample lacks is null."""
    columns = {}
    for name, field in fields.items():
        values = [s.get(name) for s in samples]
        try:
            columns[field.name] = pa.array([_value(v, field.type) for v in values], field.type)
        except (ValueError, TypeError, pa.ArrowInvalid) as e:
            raise ValueError(f"{path}: field {name!r} does not convert to {field.type}: "
                             f"{str(e)[:200]}") from None
    return pa.table(columns)


def _value(raw: bytes | str | None, t: pa.DataType) -> object:
    if raw is None or isinstance(raw, str) or pa.types.is_binary(t) or \
            pa.types.is_large_binary(t):
        return raw
    text = raw.decode("utf-8")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return text
    if pa.types.is_integer(t):
        return int(text.strip())
    if pa.types.is_floating(t):
        return float(text.strip())
    return json.loads(text)
