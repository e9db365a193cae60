"""Every error the package defines, and every error docs/design.md lists, is exported at the
top level, so ``except lakestream.StreamSealedError`` works as documented."""

from __future__ import annotations

import inspect
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
