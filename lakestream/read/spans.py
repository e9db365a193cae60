"""Reading spans of offsets from fragments: each fragment a read touches read once, through a
cache that keeps what later steps draw on, and tensor columns copied from a fragment's bytes
and columns of one number a row straight into the arrays a caller gave (``ColumnSink``)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from functools import partial

import pyarrow as pa

from lakestream.log.segments import Fragment
from lakestream.plan.rows import plan_rows
from lakestream.read.ahead import fetch_ahead, whole_file
from lakestream.read.cache import FragmentCache
from lakestream.read.fragments import FragmentReader, LastStep, fetched_whole
from lakestream.read.tensors import ColumnSink, copy_rows, copy_values


def read_spans(reader: FragmentReader, fragments: Sequence[Fragment],
               spans: Sequence[tuple[int, int]], columns: list[str] | None,
               cache: FragmentCache | None = None, last_step: LastStep | None = None,
               sink: ColumnSink | None = None) -> list[pa.Table]:
    """The rows at offsets ``[lo, hi)`` of each span, as slices in the order given, from
    ``fragments`` (contiguous, in offset order, covering every span). A fragment that several
    spans touch is read once, over the rows they need.

    With a ``cache``, each row group is decoded once, and a file read whole fetched once,
    while the cache keeps them: until ``last_step(lo, hi)``, the last step that may read
    offsets ``[lo, hi)`` (None: until the cache's bound pushes them out). They are loaded
    in this thread (on a shared pool it cost more CPU: ``bench/mixing.py``; the caller's
    reader threads already fill the cores).

    With a ``sink``, its columns are not in the tables: the spans' rows of each go, in
    order, into the sink's array for it, copied from the fragment's bytes where it was read
    whole and lays the column out plainly (``lakestream.read.tensors``), else from the column
    decoded.
    """
    ranges = _row_ranges(fragments, spans)
    direct = set(sink.columns) if sink is not None else set()
    decoded = columns
    if direct:
        names = columns if columns is not None else reader.schema_names or []
        decoded = [c for c in names if c not in direct]
    reach: dict[int, tuple[int, int]] = {}
    for i, start, stop in ranges:
        first, last = reach.get(i, (start, stop))
        reach[i] = (min(first, start), max(last, stop))
    if cache is not None and len(reach) > 1:
        fetch_ahead(reader, cache, [fragments[i] for i, (start, stop) in reach.items()
                                    if fetched_whole(fragments[i].size, fragments[i].crc32,
                                                     stop - start, fragments[i].rows)],
                    last_step)
    tables: dict[int, tuple[pa.Table, int]] = {}  # rows from a first row on, and that row
    if decoded is None or decoded:
        for i, (start, stop) in reach.items():
            f = fragments[i]
            tables[i] = (reader.read(f.path, f.size, start, stop, decoded, crc32=f.crc32,
                                     rows=f.rows), start) if cache is None \
                else _cached_rows(reader, cache, f, start, stop, decoded, last_step,
                                  keep_bytes=bool(direct))
    if sink is not None:
        pieces: dict[int, list[tuple[int, int, int]]] = {}
        at = 0
        for i, start, stop in ranges:
            pieces.setdefault(i, []).append((start, stop, at))
            at += stop - start
        for i, mine in pieces.items():
            _fill(reader, cache, fragments[i], mine, sink, last_step)
    if not tables:
        return [pa.table({}).slice(0, 0) for _ in ranges]
    return [tables[i][0].slice(start - tables[i][1], stop - start)
            for i, start, stop in ranges]


def _fill(reader: FragmentReader, cache: FragmentCache | None, f: Fragment,
          pieces: list[tuple[int, int, int]], sink: ColumnSink,
          last_step: LastStep | None) -> None:
    """Each piece ``(start, stop, at)``: rows ``[start, stop)`` of each of the sink's columns
    in ``f`` into the sink's arrays from row ``at``. The fragment is fetched, and its layout
    found, once for all its pieces (a shuffled step of single-sample groups has one a
    sample)."""
    lo, hi = min(p[0] for p in pieces), max(p[1] for p in pieces)
    wanted = sum(stop - start for start, stop, _ in pieces)
    whole = fetched_whole(f.size, f.crc32, wanted, f.rows)
    data = whole_file(reader, cache, f, last_step) if whole else None
    footer = reader.footer(f.path, f.size, data, f.rows, f.crc32)
    for name, direct in sink.columns.items():
        array = sink.arrays[name]
        layout = None if data is None else reader.plain(f.path, footer, data, name, direct)
        if layout is not None:
            for start, stop, at in pieces:
                copy_rows(data, layout, start, stop, array[at:at + stop - start])
            continue
        # Fetched whole, decoded once for all pieces; read by range, each piece's row groups
        # alone (pieces far apart in a large fragment would fetch what lies between).
        for a, b, batch in ([(lo, hi, pieces)] if data is not None else
                            [(start, stop, [(start, stop, at)]) for start, stop, at in pieces]):
            groups = footer.groups(a, b)
            column = reader.decode(f.path, f.size, data, footer, groups, [name]).column(0)
            first = footer.starts[groups[0]]
            for start, stop, at in batch:
                copy_values(column.slice(start - first, stop - start), direct,
                            array[at:at + stop - start], name)


def _row_ranges(fragments: Sequence[Fragment], spans: Sequence[tuple[int, int]]
                ) -> list[tuple[int, int, int]]:
    """(fragment index, first row, end row) covering each span in turn: ``plan_rows``, with
    the spans inside one fragment (each sample of a shuffled step of single-sample groups)
    found at once."""
    offsets = [f.offset for f in fragments]
    ends = [f.offset + f.rows for f in fragments]
    out: list[tuple[int, int, int]] = []
    for lo, hi in spans:
        i = bisect.bisect_right(offsets, lo) - 1
        if i >= 0 and hi <= ends[i]:
            out.append((i, lo - offsets[i], hi - offsets[i]))
        else:
            out.extend((r.index, r.start, r.stop) for r in plan_rows(fragments, lo, hi))
    return out


def _cached_rows(reader: FragmentReader, cache: FragmentCache, f: Fragment, start: int,
                 stop: int, columns: list[str] | None, last_step: LastStep | None,
                 keep_bytes: bool = False) -> tuple[pa.Table, int]:
    """The row groups of ``f`` that hold rows ``[start, stop)``, and the first row of them,
    through ``cache``; the file's bytes, when it is fetched whole, are kept while row groups
    of it are still to be decoded (and, with ``keep_bytes``, until the cache lets them go:
    tensor columns are copied from them)."""
    kind = ",".join(columns) if columns is not None else "*"
    whole = fetched_whole(f.size, f.crc32, stop - start, f.rows)
    file = (f.path, f.size, f.crc32)  # two entries naming one path are two files here

    def until(lo: int, hi: int) -> int | None:
        return None if last_step is None else last_step(f.offset + lo, f.offset + hi)

    def data() -> pa.Buffer | None:
        return whole_file(reader, cache, f, last_step) if whole else None

    footer = reader.cached_footer(*file)
    if footer is None or footer.starts[-1] != f.rows:
        footer = reader.footer(f.path, f.size, data(), f.rows, f.crc32)
    starts = footer.starts

    def decode(g: int) -> pa.Table:
        return reader.decode(f.path, f.size, data(), footer, [g], columns)

    groups = footer.groups(start, stop)
    if keep_bytes:  # the columns beside tensor ones are small: decoded in one call
        first, last = starts[groups[0]], starts[groups[-1] + 1]
        table = cache.fetch((*file, kind, first, last), lambda: reader.decode(
            f.path, f.size, data(), footer, groups, columns), until=until(first, last))
        return table, first
    parts = [cache.fetch((*file, kind, g), partial(decode, g),
                         until=until(starts[g], starts[g + 1])) for g in groups]
    if whole and cache.holds(file) \
            and cache.holds(*[(*file, kind, g) for g in range(len(starts) - 1)]):
        cache.discard(file)  # every row group decoded: the bytes are done with
    return (parts[0] if len(parts) == 1 else pa.concat_tables(parts)), starts[groups[0]]

