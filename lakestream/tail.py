"""Where ``lakestream/head.py`` finds the log reader, which lives in ``lakestream.log.tail``:
kept only while that module imports this path (``tests/test_layering.py`` keeps every other
module off it)."""

from __future__ import annotations

from lakestream.log.tail import read_entry

__all__ = ["read_entry"]
