"""What every figure function receives: output folder, run options, and ``memo(key, fn)``, which computes an
expensive shared result (the trained GRT, a sentence trace, the gauge setup) once per run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path("figures") / "out"


@dataclass
class FigureContext:
    out_dir: Path
    quick: bool = False  # smaller sizes everywhere (tests); the captions say so
    seed: int = 0
    checkpoint: Path | None = None  # --checkpoint: a trained GRT; None -> the shipped reference GRT
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)

    def memo(self, key: str, fn: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]
