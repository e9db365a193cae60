"""Bringing an existing dataset into a stream, exactly once and resumable: one producer
writes its rows in their order, and the position after each write's last row is that
write's committed state, so that a run killed anywhere resumes at the first row no commit
holds (``producers/sources.py`` reads the datasets)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

import lakestream
from lakestream.errors import NotFoundError
from lakestream.producers.options import ProducerOptions
from lakestream.producers.producer import Producer
from lakestream.producers.sources import DatasetFiles, Position, open_dataset

WRITE_BYTES = 32 << 20
"""Arrow bytes a write gathers before it is handed to the producer (one fragment)."""
READ_ROWS = 8192
"""Rows read from the dataset at a time."""


@dataclass(frozen=True)
class ImportResult:
    """What an import did."""

    rows: int
    """Rows this run wrote."""
    resumed_from: int
    """Rows an earlier run of the same import had committed (0: it started afresh)."""
    writes: int
    seconds: float
    ignored_fields: tuple[str, ...]
    """The dataset's fields that no column of the stream takes."""


def import_dataset(uri: str, paths: str | Sequence[str], *, producer_id: str = "import",
                   kind: str | None = None, split: str | None = None,
                   columns: Mapping[str, str] | None = None,
                   storage_options: dict[str, str] | None = None,
                   options: ProducerOptions | None = None,
                   global_batch_size: int | None = None, group_size: int = 1,
                   write_bytes: int = WRITE_BYTES) -> ImportResult:
    """Writes the rows of the dataset at ``paths`` into the stream at ``uri``, in the
    dataset's order, as the producer ``producer_id``; run again after a crash (or once
    done), it writes only the rows no commit holds.

    Args:
        paths: Parquet files, folders or globs; WebDataset ``.tar`` shards; or the folder of
            a Hugging Face dataset saved with ``save_to_disk`` (``producers/sources.py``).
        kind: ``parquet``, ``hf`` or ``webdataset``; None: told by the files.
        split: the split of a saved ``DatasetDict``.
        columns: stream column -> dataset field, where the names differ; the stream's other
            columns take the field of their own name.
        global_batch_size, group_size: if given, a stream that does not exist is created
            with them, its columns the dataset's fields (renamed by ``columns``).

    Raises:
        ValueError: the dataset cannot be read as that kind, a stream column has no field,
            ``columns`` names no stream column, the rows left do not make whole groups
            (where the files count them), or ``producer_id`` holds the state of other work.
            Raised before anything is written: the stream is unchanged. WebDataset shards
            are not counted ahead: a last group short of the group size is found at the
            end, the rows before it committed.
        SchemaMismatchError: a field's values do not fit its column (rows before the
            write that holds them are committed; a rerun resumes there).
    """
    started = time.monotonic()
    data = open_dataset(paths, kind, split)
    fingerprint = data.fingerprint
    stream = _open(uri, storage_options, create=global_batch_size is not None)
    schema, group, state = _target(stream, data, columns, producer_id, group_size)
    fields = _fields(schema, data, columns)
    ignored = tuple(n for n in data.schema.names if n not in fields)
    start, done = _resume(state, fingerprint, data, producer_id, uri, group)
    if done == data.rows:  # all in: not even a fence to commit
        return ImportResult(0, done, 0, time.monotonic() - started, ignored)
    if stream is None and global_batch_size is not None:
        lakestream.create(uri, schema, global_batch_size=global_batch_size,
                          group_size=group_size, storage_options=storage_options)
    with Producer(uri, producer_id, storage_options=storage_options, options=options) as p:
        if p.state != state:  # an instance fenced just now committed more meanwhile
            start, done = _resume(p.state, fingerprint, data, producer_id, uri, group)
        writer = _Writer(fingerprint, group, done, write_bytes)
        read_rows = max(1, min(READ_ROWS, int(write_bytes / max(1.0, data.row_bytes))))
        for position, table in data.read(start, fields, read_rows):
            writer.add(position, table)
            writer.write(p)
        writer.write(p, final=True)
        if writer.rows:
            raise ValueError(f"the dataset's last {writer.rows} rows are not a whole group of "
                             f"{group} (the stream's group size): they were not imported")
    return ImportResult(writer.written, done, writer.writes, time.monotonic() - started,
                        ignored)


def _target(stream: lakestream.Stream | None, data: DatasetFiles,
            columns: Mapping[str, str] | None, producer_id: str,
            group_size: int) -> tuple[pa.Schema, int, Any]:
    """The stream's schema, group size and ``producer_id``'s committed state; for a stream
    still to be created (None), the dataset's fields renamed by ``columns``, ``group_size``
    and no state."""
    if stream is None:
        named = {field: column for column, field in (columns or {}).items()}
        return pa.schema([f.with_name(named.get(f.name, f.name)) for f in data.schema]), \
            group_size, None
    mine = stream.state.producers.get(producer_id)
    return stream.schema, stream.group_size, None if mine is None else mine.state


def _open(uri: str, storage_options: dict[str, str] | None,
          create: bool) -> lakestream.Stream | None:
    """The stream, or None where it does not exist and ``create`` says to make it.

    Raises:
        NotFoundError: it does not exist, and nothing says to create it.
    """
    try:
        return lakestream.open(uri, storage_options=storage_options)
    except NotFoundError:
        if not create:
            raise
        return None


def _fields(schema: pa.Schema, data: DatasetFiles,
            columns: Mapping[str, str] | None) -> dict[str, pa.Field]:
    """Dataset field -> the stream's field it fills.

    Raises:
        ValueError: ``columns`` names no stream column, or a stream column's field is not
            in every file (Parquet, Arrow) or in the first sample (WebDataset, whose later
            samples may lack it: a null there).
    """
    columns = dict(columns or {})
    unknown = sorted(set(columns) - set(schema.names))
    if unknown:
        raise ValueError(f"columns= names {unknown}, not columns of the stream "
                         f"({schema.names})")
    out: dict[str, pa.Field] = {}
    for field in schema:
        name = columns.get(field.name, field.name)
        if name not in data.schema.names:
            where = "the dataset's first sample" if data.kind == "webdataset" else \
                "every file of the dataset"
            raise ValueError(f"the stream's column {field.name!r} has no field {name!r} in "
                             f"{where} (it has {data.schema.names}): map one with "
                             f"columns={{{field.name!r}: FIELD}} (--map {field.name}=FIELD)")
        if name in out:
            raise ValueError(f"field {name!r} is mapped to two columns: "
                             f"{out[name].name!r} and {field.name!r}")
        out[name] = field
    return out


def _resume(state: Any, fingerprint: str, data: DatasetFiles, producer_id: str, uri: str,
            group: int) -> tuple[Position, int]:
    """Where this import resumes, and the rows committed before it, from the producer's
    committed state.

    Raises:
        ValueError: the state is not this dataset's import, or the rows left (where the
            files count them) are not whole groups.
    """
    if state is None:
        start, done = Position(0, 0), 0
    elif isinstance(state, dict) and state.get("import") == fingerprint:
        start, done = Position(int(state["file"]), int(state["row"])), int(state["rows"])
    else:
        what = "an import of another dataset" if isinstance(state, dict) and \
            "import" in state else "other work"
        raise ValueError(f"producer {producer_id!r} of {uri} has committed {what} (its "
                         f"state: {str(state)[:200]}): pass another producer id to import "
                         "this dataset")
    if data.rows is not None and (data.rows - done) % group:
        raise ValueError(f"{data.rows - done} rows left to import are not whole groups of "
                         f"{group} (the stream's group size): import a dataset whose rows "
                         "make whole groups, or into a stream of group size 1")
    return start, done


class _Writer:
    """Gathers the dataset's tables and writes them in whole groups of about
    ``write_bytes``, each write's state the position after its last row."""

    def __init__(self, fingerprint: str, group: int, done: int, write_bytes: int) -> None:
        self.fingerprint = fingerprint
        self.group = group
        self.done = done
        self.write_bytes = write_bytes
        self.pending: list[tuple[Position, pa.Table]] = []
        self.rows = self.nbytes = self.written = self.writes = 0

    def add(self, position: Position, table: pa.Table) -> None:
        self.pending.append((position, table))
        self.rows += table.num_rows
        self.nbytes += table.nbytes

    def write(self, producer: Producer, final: bool = False) -> None:
        """Writes what makes writes of ``write_bytes`` (with ``final``, every whole group
        gathered); keeps the rest."""
        while self.rows >= self.group:
            per_write = max(1, int(self.write_bytes * self.rows / max(1, self.nbytes)))
            take = max(self.group, per_write // self.group * self.group)
            if take > self.rows:
                if not final:
                    return
                take = self.rows // self.group * self.group
            self._write(producer, take)

    def _write(self, producer: Producer, take: int) -> None:
        parts, left, end = [], take, Position(0, 0)
        while left:
            position, table = self.pending[0]
            n = min(left, table.num_rows)
            parts.append(table.slice(0, n))
            end = Position(position.file, position.row + n)
            left -= n
            if n == table.num_rows:
                self.pending.pop(0)
            else:
                self.pending[0] = (end, table.slice(n))
        batch = pa.concat_tables(parts, promote_options="permissive")
        self.done += take
        producer.write({name: batch.column(name) for name in batch.schema.names},
                       state={"import": self.fingerprint, "file": end.file, "row": end.row,
                              "rows": self.done})
        self.written += take
        self.writes += 1
        self.rows -= take
        self.nbytes = sum(t.nbytes for _, t in self.pending)
