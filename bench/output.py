"""What every benchmark writes beside its figures: where results go, and the command that
made them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root, the working directory a benchmark runs from (``python -m``)."""
RESULTS = ROOT / "bench" / "results"


def command(name: str) -> str:
    """The command that ran benchmark ``name``, with this process's arguments:
    ``python -m bench.loader --reps 3``."""
    return " ".join(["python", "-m", f"bench.{name}", *sys.argv[1:]])


def save(filename: str, data: Any, indent: int | None = 1) -> Path:
    """``data`` as JSON in ``RESULTS / filename`` (made if missing); returns that path."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / filename
    path.write_text(json.dumps(data, indent=indent))
    return path
