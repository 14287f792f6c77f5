"""The figure registry (name -> ``fn(ctx) -> FigureOutput``) and the loop that writes the figures.

A figure's name is its file stem: the claim id it is evidence for where there is one (``gauge.forward_invariance``),
else a ``<package>.fig_*`` name with the claims it supports in ``claims``.  Each figure writes ``<name>.svg``,
``<name>.png``, a sidecar ``<name>.json`` (caption, claims, numbers: what the report reads) and, for a 3-D view,
``<name>.plotly.json``.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import figures.style as style
from rmsgauge import atomic_write_json, atomic_write_text

SOURCES = ("gauge text", "GRT text")
SIDE_SUFFIX = ".json"
PLOTLY_SUFFIX = ".plotly.json"


class FigureUnavailable(RuntimeError):
    """A figure cannot be drawn (a committed result or the shipped weights it reads are missing): noted, not fatal."""


@dataclass
class FigureOutput:
    fig: Any  # matplotlib Figure
    caption: str  # what it shows, the dtype, and (trained-model figures) the checkpoint and budget
    interactive: Any = None  # optional plotly Figure: the drag-to-rotate 3-D view
    numbers: dict[str, Any] = field(default_factory=dict)  # values the caption quotes, kept in the sidecar


@dataclass(frozen=True)
class FigureSpec:
    name: str  # file stem (a claim id where the figure is that claim's evidence)
    title: str
    source: str  # which source text's figure list it reproduces: one of SOURCES
    claims: tuple[str, ...]  # claim ids this figure is evidence for (may be empty)
    fn: Callable[[Any], FigureOutput]
    fast: bool = False  # cheap (< ~2 s, no training): used by --quick tests and the determinism check
    trained: bool = False  # draws a trained GRT: caption must name the checkpoint and budget
    interactive: bool = False  # also writes a plotly 3-D view


FIGURES: dict[str, FigureSpec] = {}
FIGURE_MODULES = ("figures.gauge_figs", "figures.dynamics_figs", "figures.grt_figs", "figures.trained_figs",
                  "figures.trained_stack_figs", "figures.grt_text_figs", "figures.grt_text_sublayer_figs",
                  "figures.monitor_figs", "figures.studies_figs")


def figure(name: str, *, title: str, source: str, claims: tuple[str, ...] = (), fast: bool = False,
           trained: bool = False, interactive: bool = False) -> Callable:
    """Register ``fn(ctx) -> FigureOutput`` under ``name``."""
    if source not in SOURCES:
        raise ValueError(f"figure {name!r}: source must be one of {SOURCES}, got {source!r}")

    def register(fn: Callable[[Any], FigureOutput]) -> Callable[[Any], FigureOutput]:
        if name in FIGURES:
            raise ValueError(f"figure {name!r} registered twice")
        FIGURES[name] = FigureSpec(name, title, source, tuple(claims), fn, fast, trained, interactive)
        return fn

    return register


def load_all() -> dict[str, FigureSpec]:
    """Import every figure module (registration happens on import) and return the registry in report order."""
    for module in FIGURE_MODULES:  # this order is the report's order
        importlib.import_module(module)
    return FIGURES


def resolve(selectors: list[str]) -> list[str]:
    """Figure names for ``--only`` selectors: an exact name, or a prefix ending in '.' / a group ('gauge', 'grt')."""
    figs = load_all()
    out: list[str] = []
    for sel in selectors:
        if sel in figs:
            hits = [sel]
        else:
            pre = sel if sel.endswith(".") else sel + "."
            hits = [n for n in figs if n.startswith(pre)]
        if not hits:
            raise KeyError(sel)
        out.extend(h for h in hits if h not in out)
    return out


@dataclass
class RunLog:
    written: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why (a package not in this checkout)
    failed: dict[str, str] = field(default_factory=dict)  # name -> traceback
    seconds: dict[str, float] = field(default_factory=dict)


def progress(msg: str) -> None:
    print(f"[figures] {msg}", file=sys.stderr, flush=True)


def write_output(spec: FigureSpec, out: FigureOutput, out_dir: Path) -> list[Path]:
    """Write the figure files and its sidecar, all atomically."""
    files = style.save_figure(out.fig, out_dir, spec.name)
    inter = None
    if out.interactive is not None:
        from figures.interactive import to_json

        inter = spec.name + PLOTLY_SUFFIX
        files.append(atomic_write_text(out_dir / inter, to_json(out.interactive)))
    side = {"name": spec.name, "title": spec.title, "source": spec.source, "claims": list(spec.claims),
            "caption": out.caption, "svg": spec.name + ".svg", "png": spec.name + ".png", "interactive": inter,
            "trained": spec.trained, "numbers": out.numbers}
    files.append(atomic_write_json(out_dir / (spec.name + SIDE_SUFFIX), side))
    return files


def generate(names: list[str], ctx: Any) -> RunLog:
    """Draw and write each named figure; a figure that raises is recorded, not fatal to the rest."""
    figs = load_all()
    log = RunLog()
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names, 1):
        spec = figs[name]
        t0 = time.perf_counter()
        progress(f"[{i}/{len(names)}] {name}: {spec.title}")
        try:
            write_output(spec, spec.fn(ctx), ctx.out_dir)
        except FigureUnavailable as e:
            log.skipped[name] = str(e)
            progress(f"    skipped: {e}")
        except Exception:
            log.failed[name] = traceback.format_exc()
            progress(f"    FAILED:\n{log.failed[name]}")
        else:
            log.written.append(name)
        finally:
            style.close_all()
        log.seconds[name] = time.perf_counter() - t0
        if name in log.written:
            progress(f"    wrote {name}.svg/.png in {log.seconds[name]:.1f} s")
    return log


def read_sidecars(out_dir: Path) -> list[dict[str, Any]]:
    """Sidecars of every registered figure present in ``out_dir``, in registry order (what the report shows)."""
    out_dir = Path(out_dir)
    return [json.loads((out_dir / (n + SIDE_SUFFIX)).read_text(encoding="utf-8")) for n in load_all()
            if (out_dir / (n + SIDE_SUFFIX)).is_file() and (out_dir / (n + ".svg")).is_file()]
