"""Tables and verdicts of the experiment grid (filled in below)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def summary(results: Path, specs: list[Any], json_path: str | None = None, verbose: bool = False) -> int:
    raise NotImplementedError
