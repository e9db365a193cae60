"""Where ``producers/committer.py`` finds the replay state, which lives in
``lakestream.log.replay``: kept only while that module imports this path
(``tests/test_layering.py`` keeps every other module off it)."""

from __future__ import annotations

from lakestream.log.replay import ReplayState, refuse_if_sealed

__all__ = ["ReplayState", "refuse_if_sealed"]
