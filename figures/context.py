"""What every figure function receives: output folder, run options, and ``memo(key, fn)``, which computes an
expensive shared result (the trained GRT, a sentence trace, the gauge setup) once per run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path("figures") / "out"
CACHE_SUBDIR = "cache"  # the auto-trained checkpoint lives under <out>/cache/ unless --cache-dir says otherwise


@dataclass
class FigureContext:
    out_dir: Path
    quick: bool = False  # smaller sizes everywhere (tests); the captions say so
    seed: int = 0
    checkpoint: Path | None = None  # --checkpoint: a trained GRT; None -> train a small one and cache it
    cache_dir: Path | None = None  # where the auto-trained checkpoint is cached (default <out>/cache)
    threads: int = 0  # torch CPU threads for training/tracing; 0 leaves torch's default
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        if self.cache_dir is None:
            self.cache_dir = self.out_dir / CACHE_SUBDIR
        self.cache_dir = Path(self.cache_dir)

    def memo(self, key: str, fn: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    @property
    def size_note(self) -> str:
        return "quick (reduced) sizes" if self.quick else "full sizes"
