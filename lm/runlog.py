"""What a run shows and keeps: the progress line, the strict-JSON log, the machine description."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from pathlib import Path

import torch

from rmsgauge import (
    atomic_write_text,
)
from rmsgauge.atomic import json_nulls

# ---------------------------------------------------------------------------------------------
# Progress line and JSON-lines log
# ---------------------------------------------------------------------------------------------


class Progress:
    """One status line on stderr: rewritten in place on a terminal, one line per update otherwise."""

    def __init__(self, total: int, enabled: bool, label: str = "") -> None:
        self.total, self.enabled, self.label = total, enabled, label
        self.tty = enabled and sys.stderr.isatty()

    def update(self, step: int, loss: float, tok_s: float, lr: float, eta_s: float, extra: str = "") -> None:
        if not self.enabled:
            return
        frac = step / self.total
        bar = "#" * int(20 * frac) + "." * (20 - int(20 * frac))
        line = (f"{self.label}[{bar}] {step}/{self.total} loss {loss:.4f} | {tok_s / 1e3:.1f}k tok/s | "
                f"lr {lr:.2e} | eta {_fmt_time(eta_s)}{extra}")
        if self.tty:
            sys.stderr.write("\r" + line.ljust(110))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def message(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(("\n" if self.tty else "") + text + "\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _fmt_time(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = round(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class JsonLog:
    """Append-only JSON lines (rank 0 only), strict JSON: a non-finite number is written as ``null`` and its
    key listed under ``"nonfinite"``.  On resume, records after the checkpoint's step are dropped first
    (they belong to the interrupted tail that is about to be recomputed)."""

    def __init__(self, path: Path | None, resume_step: int | None) -> None:
        self.path = path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            path.write_text("")
        elif path.exists():
            keep = [ln for ln in path.read_text().splitlines() if _step_of(ln) <= resume_step]
            atomic_write_text(path, "".join(ln + "\n" for ln in keep))

    def write(self, record: dict) -> None:
        if self.path is None:
            return
        clean, bad = json_nulls(record)
        if bad:
            clean["nonfinite"] = bad
        with self.path.open("a") as fh:
            fh.write(json.dumps(clean, allow_nan=False) + "\n")


def _step_of(line: str) -> float:
    """A log line's step; a blank or half-written line (a crash mid-write) sorts after everything."""
    try:
        return float(json.loads(line).get("step", -1))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return math.inf


def read_log(path: str | os.PathLike) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


def machine_description() -> str:
    """CPU model, logical CPUs, torch version and OS: where a run's timings come from."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, {platform.system()}"


