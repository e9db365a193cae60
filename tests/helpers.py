"""Small builders shared by tests."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

# DataLoader workers forked from a server that imported torch once start in ~0.05 s, not the
# ~2 s a spawned worker takes to import it. The server itself opens no store (obstore does
# not survive a fork), so workers reach S3 as spawned ones do.
WORKER_CONTEXT = multiprocessing.get_context("forkserver")
WORKER_CONTEXT.set_forkserver_preload(["torch", "lakestream.loaders"])


def worker_options(n: int) -> dict[str, Any]:
    """DataLoader options for ``n`` workers started from ``WORKER_CONTEXT`` (none: in-process)."""
    return {"num_workers": n, "multiprocessing_context": WORKER_CONTEXT} if n else {}

def read_ranks(uri: str, world: int, *, state: dict[str, Any] | None = None,
               stop: int | None = None, workers: int = 0,
               **options: Any) -> tuple[list[list[int]], dict[str, Any]]:
    """Every rank of ``world`` reads to ``stop`` (a ``StreamDataset`` with ``options``,
    resumed from ``state``; through ``StreamLoader`` with ``workers``): the ids of each step,
    the ranks' slices joined in rank order, and rank 0's state afterwards."""
    from lakestream.loaders import StreamDataset, StreamLoader

    per_rank, saved = [], {}
    for rank in range(world):
        ds = StreamDataset(uri, rank=rank, world_size=world, max_steps=stop, **options)
        if state is not None:
            ds.load_state_dict(state)
        loader = StreamLoader(ds, **worker_options(workers)) if workers else ds
        per_rank.append([[int(x) for x in batch["id"]] for batch in loader])
        if rank == 0:
            saved = loader.state_dict()
    return [sum(parts, []) for parts in zip(*per_rank, strict=True)], saved


SCHEMA = pa.schema([
    ("id", pa.int64()),
    ("tokens", pa.list_(pa.int32())),
    ("reward", pa.float32()),
])


def rows(start: int, n: int) -> pa.Table:
    """Samples with ids ``start .. start+n-1``; each id's tokens are derived from it."""
    ids = list(range(start, start + n))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "tokens": pa.array([[i, i + 1, i % 7] for i in ids], pa.list_(pa.int32())),
        "reward": pa.array([i / 10 for i in ids], pa.float32()),
    }, schema=SCHEMA)


_DELTA_READ = """
import json, os, sys
import deltalake
uri, options = sys.argv[1], json.loads(sys.argv[2])
table = deltalake.DeltaTable(uri, storage_options=options or None).to_pyarrow_table()
print(json.dumps(sorted(table.column("id").to_pylist())), flush=True)
os._exit(0)
"""


def delta_ids(uri: str, options: dict[str, str] | None) -> list[int]:
    """The ids ``deltalake.DeltaTable(uri).to_pyarrow_table()`` returns.

    It runs in a child process that leaves with ``os._exit``: deltalake 1.6 aborts the
    interpreter at exit ("terminate called without an active exception") after a pyarrow
    read, which would take pytest down with it.
    """
    out = subprocess.run([sys.executable, "-c", _DELTA_READ, uri, json.dumps(options or {})],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"deltalake failed to read {uri}: {out.stderr[-2000:]}")
    return list(json.loads(out.stdout))


def ids(table: Any) -> list[int]:
    return list(table.column("id").to_pylist())


@contextmanager
def count_reads() -> Iterator[tuple[Counter[str], list[int]]]:
    """Meanwhile, the GETs of each fragment (whole, or opened to read by range; not the log's
    index segments, Parquet too) as the stores' request hook sees them, and in ``[0]`` the
    Parquet row groups decoded."""
    import lakestream.read.fragments as fragments
    from lakestream.log.keys import DATA_DIR
    from lakestream.store import Request, add_request_hook

    gets: Counter[str] = Counter()
    decoded = [0]
    reader = fragments._reader

    def counted(request: Request) -> None:
        if request.op in ("get", "get_buffer", "open_input") \
                and request.key.startswith(DATA_DIR):
            gets[request.key] += 1

    class Counted:
        """A Parquet reader whose row groups read are counted."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def read_row_groups(self, groups: list[int], *args: Any, **kwargs: Any) -> pa.Table:
            decoded[0] += len(groups)
            return self.inner.read_row_groups(groups, *args, **kwargs)

    def counted_reader(*args: Any) -> Counted:
        return Counted(reader(*args))

    remove = add_request_hook(counted)
    fragments._reader = counted_reader  # type: ignore[assignment]
    try:
        yield gets, decoded
    finally:
        remove()
        fragments._reader = reader


class HookedStore:
    """A store that runs ``hook(op, key, phase)`` around each request of the store it wraps
    (``phase`` is "before" or "after"), so a test can fail, block or interrupt exactly one
    request: an outage, a lost reply, a KeyboardInterrupt with a put in flight."""

    def __init__(self, inner: Any, hook: Any) -> None:
        self.inner = inner
        self.hook = hook

    @property
    def uri(self) -> str:
        return str(self.inner.uri)

    def _call(self, op: str, key: str, *args: Any, **kwargs: Any) -> Any:
        self.hook(op, key, "before")
        out = getattr(self.inner, op)(key, *args, **kwargs)
        self.hook(op, key, "after")
        return out

    def put(self, key: str, data: bytes, *, mode: str = "overwrite") -> None:
        self._call("put", key, data, mode=mode)

    def get(self, key: str, **kwargs: Any) -> bytes:
        return bytes(self._call("get", key, **kwargs))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return bytes(self._call("get_range", key, start, end))

    def get_buffer(self, key: str, size: int) -> Any:
        return self._call("get_buffer", key, size)

    def head(self, key: str) -> Any:
        return self._call("head", key)

    def delete(self, key: str) -> None:
        self._call("delete", key)

    def open_input(self, key: str, size: int | None = None) -> Any:
        return self._call("open_input", key, size)

    def list(self, prefix: str) -> Any:
        self.hook("list", prefix, "before")
        return self.inner.list(prefix)

    def list_temp(self, prefix: str) -> Any:
        self.hook("list_temp", prefix, "before")
        return self.inner.list_temp(prefix)


def step_ids(loader: Any, n: int | None = None) -> list[tuple[int, list[int]]]:
    """``(step, ids)`` of each batch ``loader`` yields (the first ``n`` if given)."""
    got = []
    for batch in loader:
        got.append((int(batch["step"]), [int(x) for x in batch["id"]]))
        if n is not None and len(got) == n:
            break
    return got


def put_entry(store: Any, version: int, entry: Any, *, mode: str = "create") -> bytes:
    """Writes ``entry`` at log ``version`` as any writer of the log may: chained to the entry
    stored at ``version - 1`` (a writer that goes around the committer, or an attacker
    holding a producer's grants, computes the same link), and without the encoder's refusal
    of appends readers void. Returns the bytes written."""
    import lakestream.log.codec as codec
    from lakestream.log.keys import log_key

    prev = codec.entry_digest(store.get(log_key(version - 1))) if version > 0 else None
    checks = codec.refusal
    codec.refusal = lambda *_: None  # type: ignore[assignment] # an encoder without them
    try:
        data = codec.encode_entry(entry, prev)
    finally:
        codec.refusal = checks
    store.put(log_key(version), data, mode=mode)
    return data


DROP = object()


def edit_entry(data: bytes, **info: Any) -> bytes:
    """An entry with fields of its ``commitInfo.lakestream`` changed (``DROP``: removed),
    its checksum made to match: what a writer that goes around the encoder writes."""
    from lakestream.log.checksum import lines_checksum

    lines = [json.loads(line) for line in data.splitlines()]
    fields = lines[0]["commitInfo"]["lakestream"]
    fields.pop("crc32")
    for key, value in info.items():
        if value is DROP:
            fields.pop(key)
        else:
            fields[key] = value
    fields["crc32"] = lines_checksum(lines)
    return "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in lines).encode()


def child_pids(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` now (from ``/proc``)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found
