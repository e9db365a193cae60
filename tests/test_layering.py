"""The wings of docs/design.md §9 and their order: imports point down, between wings and,
inside the log, plan, read and ops wings, between their modules; the core and producers never
import torch; nothing imports the log reader from the snapshot module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WINGS = ("errors", "store", "log", "plan", "read", "stream", "ops", "__init__")
"""The core's wings, lowest first: errors -> store -> log (the commit and its records) ->
plan (pure planners) -> read (the read side) -> the ``Stream`` façade -> ops (the operator's
tools) -> the package's face. A module imports its own wing and lower ones, never a higher
one. ``lakestream.producers`` and ``lakestream.loaders`` stand above the façade."""

PLACED = {"failpoints": "errors", "checks": "errors", "schema": "store", "writing": "stream",
          "reading": "stream", "groups": "stream"}
"""What is not a folder of its own, and the wing it belongs to: the crash points and the
integer check beside the errors, the schema beside the store, the SDKs' APIs and the
handle's namespaces beside the façade."""

SDK_ALLOWED = {"producers": ("lakestream", "lakestream.errors", "lakestream.stream",
                             "lakestream.writing", "lakestream.producers"),
               "loaders": ("lakestream", "lakestream.errors", "lakestream.stream",
                           "lakestream.reading", "lakestream.loaders")}
"""What each SDK may import of the package (a module named, or one under it): the face,
the errors, the ``Stream`` façade, the API the core offers it, and its own modules."""

LAYERS = {
    "log": (("log.keys",),
            ("log.entries", "log.threads", "log.overlay"),
            ("log.actions", "log.checksum"),
            ("log", "log.codec", "log.segments", "log.fragments", "log.progress"),
            ("log.index",),
            ("log.replay",),
            ("log.tail", "log.inventory", "log.retention", "log.manifest"),
            ("log.snapshot", "log.put", "log.hosthead"),
            ("log.head", "log.opening", "log.outcomes"),
            ("log.transaction",),
            ("log.view", "log.compaction"),
            ("log.commits", "log.gc"),
            ("log.hostruns",),
            ("log.storeruns",)),
    "plan": (("plan", "plan.slices", "plan.rows", "plan.choose"),
             ("plan.balance", "plan.mix")),
    "read": (("read", "read.cache", "read.compact"),
             ("read.pages", "read.footer"),
             ("read.fastpages",),
             ("read.tensors", "read.bounds"),
             ("read.fragments", "read.lineage"),
             ("read.ahead",),
             ("read.spans",),
             ("read.offsets",),
             ("read.steps", "read.selected")),
    "ops": (("ops", "ops.text", "ops.verify"),
            ("ops.args", "ops.status", "ops.tail"),
            ("ops.cli",)),
}
"""Inside these wings, their modules' layers, lowest first: an import inside a wing points
down too (records below replay, replay below snapshots, snapshots below the commit...)."""

ALLOWED_UPWARD = {("ops.cli", "demo"), ("ops.cli", "producers.importing")}
"""The CLI's demo verb starts the application built on every layer, and its import verb runs
a producer (both imported lazily)."""

PACKAGES = {"producers": ROOT / "producers", "loaders": ROOT / "loaders", "demo": ROOT / "demo"}
"""The packages under ``lakestream.`` that live in folders of their own."""


def _is_module(name: str) -> bool:
    """Whether ``lakestream.x.y`` is a module or package of this repository."""
    parts = name.split(".")[1:]
    base = PACKAGES.get(parts[0]) if parts else None
    path = base.joinpath(*parts[1:]) if base else (ROOT / "lakestream").joinpath(*parts)
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imported(source: str) -> set[str]:
    """The modules ``source`` imports: ``from lakestream.log import gc`` imports the module
    ``lakestream.log.gc`` (not only the package), where that module exists."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names
                      if node.module.startswith("lakestream")
                      and _is_module(f"{node.module}.{a.name}")}
    return found


def _imports(path: Path) -> set[str]:
    return _imported(path.read_text())


def _core_violations(me: str, names: set[str]) -> list[str]:
    """What a core module ``me`` importing ``names`` breaks: an SDK imported, a higher
    wing, or a module of its own wing's layer or above."""
    out = []
    for name in sorted(n for n in names if n.startswith("lakestream.")):
        other = name.removeprefix("lakestream.")
        if (me, _wing(other)) in ALLOWED_UPWARD or (me, other) in ALLOWED_UPWARD:
            continue
        if _wing(other) in ("producers", "loaders"):
            out.append(f"imports the SDK module {name}")
            continue
        mine, theirs = WINGS.index(_wing(me)), WINGS.index(_wing(other))
        if theirs > mine:
            out.append(f"({_wing(me)}) imports {name} ({_wing(other)})")
        elif theirs == mine and _wing(me) in LAYERS and me != other and not (
                _layer(other) is not None and _layer(other) < _layer(me)):
            out.append(f"({me}) imports {name} ({other}), of the same layer or above")
    return out


def _sdk_violations(sdk: str, names: set[str]) -> list[str]:
    """The imports of ``lakestream`` modules outside ``SDK_ALLOWED[sdk]``."""
    allowed = SDK_ALLOWED[sdk]
    return [n for n in sorted(names) if n.startswith("lakestream") and not any(
        n == a or n.startswith(a + ".") and a != "lakestream" for a in allowed)]


def _module(path: Path) -> str:
    """``log.entries`` for ``lakestream/log/entries.py``, ``log`` for its ``__init__``."""
    parts = path.relative_to(ROOT / "lakestream").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _wing(module: str) -> str:
    top = module.split(".")[0]
    return PLACED.get(top, top)


def _layer(module: str) -> int | None:
    for rank, layer in enumerate(LAYERS.get(_wing(module), ())):
        if module in layer:
            return rank
    return None


def test_every_core_module_has_a_wing_and_a_layer() -> None:
    for path in (ROOT / "lakestream").rglob("*.py"):
        me = _module(path)
        assert _wing(me) in WINGS, f"{path}: {me} belongs to no wing of {WINGS}"
        if _wing(me) in LAYERS:
            assert _layer(me) is not None, f"{path}: {me} has no layer in LAYERS"


def test_core_imports_point_down() -> None:
    for path in (ROOT / "lakestream").rglob("*.py"):
        assert _core_violations(_module(path), _imports(path)) == [], path


def test_the_sdks_import_only_what_the_core_offers_them() -> None:
    for sdk in SDK_ALLOWED:
        for path in PACKAGES[sdk].rglob("*.py"):
            assert _sdk_violations(sdk, _imports(path)) == [], path


def test_the_checks_catch_what_they_are_for() -> None:
    """Each check on a synthetic import it must refuse, written as code writes it."""
    upward = _imported("from lakestream.log import gc\n")
    assert "lakestream.log.gc" in upward
    assert _core_violations("log.entries", upward)  # gc is a higher layer of the log
    assert _core_violations("store.base", _imported("from lakestream import stream\n"))
    assert _core_violations("read.steps", _imported("import lakestream.ops.cli\n"))
    assert _core_violations("ops.cli", _imported("from lakestream.loaders import reader\n"))
    assert _core_violations("log.gc", _imported("from lakestream.log import entries\n")) == []
    assert _sdk_violations("producers", _imported(
        "from lakestream.log.fragments import encode_fragment\n"))
    assert _sdk_violations("loaders", _imported("from lakestream.store import slots\n"))
    assert _sdk_violations("loaders", _imported("from lakestream.writing import conform\n"))
    assert _sdk_violations("producers", _imported("import lakestream.loaders\n"))
    assert _sdk_violations("loaders", _imported(
        "from lakestream.reading import Source\nimport lakestream\n"
        "from lakestream.loaders.reader import StepReader\n")) == []


def test_the_log_reader_is_read_from_its_own_module() -> None:
    """``read_entry``/``read_tail`` live in ``lakestream.log.tail``; the snapshot modules
    only use them, and nothing reaches them through one."""
    for folder in ("lakestream", "producers", "loaders", "tests", "bench", "demo"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module in (
                        "lakestream.log.snapshot", "lakestream.log.opening"):
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
