"""Deterministic matplotlib: the same inputs give byte-identical SVG and PNG files.

- SVG ids: ``svg.hashsalt`` is fixed, and every hashed id (a letter + 10 hex digits; clip-path ids hash the clip
  rectangle's floats, which constrained layout can move by an ulp) is renamed to the letter + its order of first
  appearance.
- ``savefig(metadata=...)`` with ``None`` values drops the creation date and matplotlib's version.
- Text is drawn as glyph paths from DejaVu Sans (bundled with matplotlib): no system fonts, the same in any browser.
- The Agg backend, selected before pyplot loads, rasterizes deterministically.

Every file is written atomically (``rmsgauge.atomic_write_bytes``).
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless and deterministic; must precede the pyplot import

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from rmsgauge import atomic_write_bytes

SVG_HASHSALT = "rmsgauge-figures"  # any fixed string: makes SVG clip-path/glyph ids reproducible
PNG_DPI = 110  # PNGs are for quick viewing; the SVG is the figure of record
SVG_METADATA = {"Date": None, "Creator": None}  # drop the timestamp and the matplotlib version
PNG_METADATA = {"Software": None}  # drop the matplotlib version

# One palette for the whole report.  Heads follow the source text's "head colors".
HEAD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
STAGE_GROUP_COLORS = {
    "q": "#1f77b4", "k": "#ff7f0e", "v": "#2ca02c", "o": "#d62728",
    "mixer": "#9467bd", "ffn_expand": "#8c564b", "ffn_contract": "#e377c2",
}
COS_CMAP = "RdBu"  # the source's convention: blue = aligned (cos = +1), red = opposed (cos = -1)
FADED = "#c8c8c8"


def head_color(h: int) -> str:
    return HEAD_COLORS[h % len(HEAD_COLORS)]

RC = {
    "svg.hashsalt": SVG_HASHSALT,
    "svg.fonttype": "path",
    "svg.id": None,
    "font.family": "DejaVu Sans",
    "font.size": 9.0,
    "axes.titlesize": 10.0,
    "axes.labelsize": 9.0,
    "legend.fontsize": 8.0,
    "figure.dpi": 100.0,
    "savefig.dpi": PNG_DPI,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "image.cmap": "viridis",
    "path.simplify": True,
}


def configure() -> None:
    """Apply the report's rcParams (idempotent; called by every figure function through ``new_figure``)."""
    plt.rcParams.update(RC)


def new_figure(*, figsize: tuple[float, float] = (6.4, 4.0), **kw) -> Figure:
    """A fresh figure under the report's style (``constrained`` layout so labels never collide)."""
    configure()
    kw.setdefault("layout", "constrained")
    return plt.figure(figsize=figsize, **kw)


def new_panels(n: int, *, figsize: tuple[float, float], **subplot_kw) -> tuple[Figure, list]:
    """A fresh figure (:func:`new_figure`) with ``n`` axes side by side, left to right."""
    fig = new_figure(figsize=figsize)
    return fig, [fig.add_subplot(1, n, k, **subplot_kw) for k in range(1, n + 1)]


def render(fig: Figure) -> dict[str, bytes]:
    """The figure's SVG and PNG bytes (nothing written yet)."""
    configure()
    out = {}
    for fmt, meta in (("svg", SVG_METADATA), ("png", PNG_METADATA)):
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, metadata=meta)
        out[fmt] = buf.getvalue()
    out["svg"] = canonical_svg_ids(out["svg"])
    return out


_HASHED_ID = re.compile(rb'(?<=id=")([a-z])([0-9a-f]{10})(?=")')


def canonical_svg_ids(svg: bytes) -> bytes:
    """Rename matplotlib's hashed SVG ids (``p05ebe82954``) to ``<letter><n>`` in order of definition."""
    mapping: dict[bytes, bytes] = {}
    for m in _HASHED_ID.finditer(svg):
        mapping.setdefault(m.group(0), m.group(1) + str(len(mapping)).encode())
    if not mapping:
        return svg
    refs = re.compile(rb"(?<=[\"#])(" + b"|".join(re.escape(k) for k in mapping) + rb')(?=[")])')
    return refs.sub(lambda m: mapping[m.group(1)], svg)


def save_figure(fig: Figure, out_dir: str | os.PathLike, stem: str) -> list[Path]:
    """Write ``<stem>.svg`` and ``<stem>.png`` atomically and close the figure."""
    try:
        data = render(fig)
    finally:
        plt.close(fig)
    return [atomic_write_bytes(Path(out_dir) / f"{stem}.{fmt}", b) for fmt, b in data.items()]


def close_all() -> None:
    plt.close("all")
