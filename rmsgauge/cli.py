"""Argument validation shared by the CLIs: fail before any work, naming the
parameter and the allowed range."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
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


# One spelling of the shared flags across every CLI; the old spellings are refused with the new name.
SHARED_FLAGS = ("--d-model", "--n-heads", "--n-layers", "--batch-size", "--seq-len", "--seed", "--dtype",
                "--threads", "--device", "--json", "--verbose", "--out-dir")
RENAMED_FLAGS = {
    "--heads": "--n-heads",
    "--layers": "--n-layers",
    "--n-blocks": "--n-layers",
    "--batch": "--batch-size",
    "--block": "--seq-len",
    "--block-size": "--seq-len",
}


def refuse_renamed_flags(argv: Iterable[str], renamed: Mapping[str, str] = RENAMED_FLAGS) -> None:
    """Raise ``ValueError`` (one line) when an old spelling of a shared flag is used, naming the new one."""
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in renamed:
            raise ValueError(f"{flag} was renamed {renamed[flag]} (the same name in every rmsgauge CLI); "
                             f"use {renamed[flag]}")


def parse_shared_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)`` after refusing old spellings of the shared flags (a usage error, exit 2)."""
    try:
        refuse_renamed_flags(argv)
    except ValueError as e:
        parser.error(str(e))
    return parser.parse_args(argv)


def check_output_file(name: str, path: str | os.PathLike | None) -> Path | None:
    """Before any work: ``path`` must name a file we can create or replace (not a directory, its folder
    writable or creatable). Returns the path, or None when ``path`` is None."""
    if path is None:
        return None
    p = Path(path)
    if str(path) == "":
        raise ValueError(f"{name} must be a file path, got an empty string")
    if p.is_dir():
        raise ValueError(f"{name} {p} is a directory; give a file path such as {p / 'claims.json'}")
    parent = p.parent if str(p.parent) else Path(".")
    probe = parent
    while not probe.exists():  # the first existing ancestor decides whether the folders can be made
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{name} {p}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{name} {p}: not writable (permissions of {p if p.exists() else probe})")
    return p


def check_output_dir(name: str, path: str | os.PathLike) -> Path:
    """Before any work: ``path`` must be a folder we can create or write into."""
    if str(path) == "":
        raise ValueError(f"{name} must be a folder path, got an empty string")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{name} {p} is a file; give a folder")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{name} {p}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {p}: not writable (permissions of {probe})")
    return p


# ---------------------------------------------------------------------------------------------
# One-line errors: exit 2 for usage errors, 1 for failures, a traceback only with --debug
# ---------------------------------------------------------------------------------------------

EXIT_FAILURE = 1  # the run could not complete (non-finite loss, corrupt file, disk full, ...)
EXIT_USAGE = 2  # a flag, config key or path is wrong (argparse's own status for usage errors)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error: ``prog: error: message (see --help)`` on stderr, exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)} (see --help)\n")


def one_line(message: object) -> str:
    """``message`` on one line: newlines and runs of spaces become single spaces."""
    return " ".join(str(message).split())


def run_guarded(prog: str, fn: Any, *, debug: bool = False,
                usage_errors: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError),
                failure_errors: tuple[type[BaseException], ...] = ()) -> int:
    """Call ``fn()`` and turn what escapes it into one line on stderr and an exit status: the classes in
    ``failure_errors`` -> 1 (checked first: a failure may subclass ValueError), ``usage_errors`` -> 2,
    Ctrl-C -> 130, anything else -> 1.  ``debug``: re-raise instead, with the traceback."""
    import sys

    try:
        return int(fn() or 0)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        if debug:
            raise
        sys.stderr.write(f"{prog}: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as e:  # the one place every error becomes a line
        if debug:
            raise
        if isinstance(e, failure_errors) or not isinstance(e, usage_errors):
            kind = "" if isinstance(e, failure_errors) else f"{type(e).__name__}: "
            sys.stderr.write(f"{prog}: error: {kind}{one_line(e)} (--debug shows the traceback)\n")
            return EXIT_FAILURE
        sys.stderr.write(f"{prog}: error: {one_line(e)}\n")
        return EXIT_USAGE
