"""Imports point down the layers of docs/design.md; the core and producers never import
torch; nothing imports the log reader from the snapshot module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each core module may import only modules of a lower rank.
RANKS = {
    "errors": 0, "failpoints": 0, "threads": 0, "casts": 0,
    "store": 1, "schema": 1, "stored": 1,
    "log": 2, "plan": 2,
    "index": 3, "mix": 3, "balance": 3, "progress": 3, "choose": 3,
    "replay": 4, "fragment": 4,
    "tail": 5, "inventory": 5, "lineage": 5,
    "head": 6,
    "snapshot": 6,
    "transaction": 7, "retention": 7, "verify": 7,
    "stream": 8,
    "status": 9, "steps": 9, "selected": 9,
    "cli": 10, "__init__": 11,
}


# The CLI's demo verb starts the application built on every layer (imported lazily).
ALLOWED_UPWARD = {("cli", "demo")}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def _module(name: str) -> str:
    return name.split(".")[1] if name.count(".") >= 1 else "__init__"


def test_core_imports_point_down() -> None:
    for path in (ROOT / "lakestream").rglob("*.py"):
        rel = path.relative_to(ROOT / "lakestream").parts
        me = rel[0].removesuffix(".py")
        for name in _imports(path):
            if not name.startswith("lakestream") or name == "lakestream":
                continue
            other = _module(name)
            assert other not in ("producers", "loaders"), f"{path} imports {name}"
            if me == other or (me, other) in ALLOWED_UPWARD:
                continue
            assert RANKS[other] < RANKS[me], f"{path} ({me}) imports {name} ({other}): upward"


def test_the_log_reader_is_read_from_its_own_module() -> None:
    """``read_entry``/``read_tail`` live in ``lakestream.tail``; the snapshot module only
    uses them, and nothing reaches them through it."""
    for folder in ("lakestream", "producers", "loaders", "tests", "bench", "demo"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "lakestream.snapshot":
                    names = {a.name for a in node.names}
                    assert not names & {"read_entry", "read_tail"}, path


def test_torch_stays_out_of_the_core_and_producers() -> None:
    for folder in ("lakestream", "producers"):
        for path in (ROOT / folder).rglob("*.py"):
            assert not any(n == "torch" or n.startswith("torch.") for n in _imports(path)), path


def test_producers_and_loaders_do_not_import_each_other() -> None:
    for folder, other in (("producers", "loaders"), ("loaders", "producers")):
        for path in (ROOT / folder).rglob("*.py"):
            assert not any(n.startswith(f"lakestream.{other}") for n in _imports(path)), path


def test_nothing_unpickles_stream_data() -> None:
    """Nor a checkpoint's values, but through torch's weights-only loader (a checkpoint's
    ``.metadata`` goes through the allowlist of ``loaders/safe_load.py``)."""
    for folder in ("lakestream", "producers", "loaders"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            assert "pickle.loads" not in text, path
            calls = re.findall(r"torch\.load\(([^)]*)\)", text)
            assert all("weights_only=True" in call for call in calls), path
