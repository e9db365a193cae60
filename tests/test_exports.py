"""Every error the package defines, and every error docs/design.md lists, is exported at the
top level, so ``except lakestream.StreamSealedError`` works as documented; the loaders'
own errors are exported by ``lakestream.loaders``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import lakestream
from lakestream import errors

ROOT = Path(__file__).resolve().parents[1]


def test_every_error_is_exported_at_the_top_level() -> None:
    defined = {name for name, cls in inspect.getmembers(errors, inspect.isclass)
               if issubclass(cls, errors.LakestreamError)}
    assert "StreamSealedError" in defined
    for name in defined:
        assert getattr(lakestream, name, None) is getattr(errors, name), name
        assert name in lakestream.__all__, name


def test_the_errors_docs_list_are_the_exported_ones() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    paragraph = design[design.index("Errors derive from `LakestreamError`"):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    listed = set(re.findall(r"`(\w+Error)`", paragraph)) - {"ValueError", "TypeError",
                                                             "FileNotFoundError",
                                                             "FileExistsError"}
    exported = {n for n in lakestream.__all__ if n.endswith("Error")}
    assert listed == exported


def test_every_error_anywhere_is_exported_where_its_package_is() -> None:
    """Not only ``errors.py``: an error class defined in any module (the loaders' checkpoint
    errors were defined beside their code and exported nowhere) is exported by its package
    (``lakestream`` for the core, ``lakestream.loaders``, ``lakestream.producers``), or is
    a subclass of an exported error that catches it (``SegmentError``, a
    ``CorruptLogError``)."""
    import lakestream.loaders
    import lakestream.producers

    homes = [lakestream.loaders, lakestream.producers, lakestream]
    seen = set()
    for home in homes:
        for info in pkgutil.walk_packages(home.__path__, home.__name__ + "."):
            module = importlib.import_module(info.name)
            for name, cls in inspect.getmembers(module, inspect.isclass):
                if not issubclass(cls, errors.LakestreamError) or cls.__module__ != info.name:
                    continue
                seen.add(name)
                package = next(h for h in homes if info.name.startswith(h.__name__ + "."))
                exported = getattr(package, name, None) is cls and name in package.__all__
                caught = any(getattr(lakestream, base.__name__, None) is base
                             for base in cls.__mro__[1:] if base is not errors.LakestreamError
                             and issubclass(base, errors.LakestreamError))
                assert exported or caught, f"{info.name}.{name} is exported nowhere"
    assert {"StreamMismatchError", "CheckpointLocationError", "SegmentError"} <= seen
