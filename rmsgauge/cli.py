"""Argument validation shared by the CLIs: fail before any work, naming the
parameter and the allowed range."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping
from typing import Any

DTYPES = ("float32", "float64")


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None, *,
                lo_open: bool = False, hi_open: bool = False) -> float:
    """Raise ``ValueError`` naming ``name`` and the allowed interval unless ``value`` lies in it."""
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        left = "(" if lo_open or lo is None else "["
        right = ")" if hi_open or hi is None else "]"
        lo_s = "-inf" if lo is None else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi:g}"
        raise ValueError(f"{name} must be in {left}{lo_s}, {hi_s}{right}, got {value!r}")
    return value


def check_positive(name: str, value: float) -> float:
    return check_range(name, value, 0.0, None, lo_open=True)


def check_choice(name: str, value: str, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def parse_dtype(value: str) -> str:
    """argparse ``type=``: accept float32/float64 (and the short f32/f64)."""
    v = {"f32": "float32", "f64": "float64", "double": "float64", "float": "float32"}.get(value, value)
    if v not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {value!r}; allowed: {', '.join(DTYPES)}")
    return v


def parse_float_list(value: str) -> list[float]:
    """argparse ``type=``: comma-separated floats, e.g. ``0,1e-6,1e-5``."""
    try:
        out = [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {value!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one number")
    return out


def reject_unknown_keys(kind: str, given: Mapping[str, Any], allowed: Iterable[str]) -> None:
    allowed = set(allowed)
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ValueError(f"unknown {kind} key(s) {unknown}; allowed: {sorted(allowed)}")
