"""Drag-to-rotate 3-D views of pair traces (plotly, offline): x0, x1 (the rebuilt pair) across, the stage upward.

Serialization is deterministic: numbers rounded to ``DIGITS`` significant figures, no whitespace, plotly's key order.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

DIGITS = 4  # significant figures kept in the embedded JSON: plenty for a plot, keeps the page small


def plotly_js() -> str:
    """plotly's bundled, minified script (no network)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _round(a: np.ndarray) -> list[Any]:
    """Round to DIGITS significant figures; NaN (line breaks) becomes None."""
    a = np.asarray(a, dtype=np.float64).ravel()
    finite = np.isfinite(a) & (a != 0)
    mag = np.floor(np.log10(np.abs(np.where(finite, a, 1.0))))  # decimal exponent of each value
    # an integer divided by an exact power of ten is correctly rounded, so its repr is the short decimal
    scale = 10.0 ** (DIGITS - 1 - mag)
    out = np.where(finite, np.round(a * scale) / scale, a)
    return [v if v == v else None for v in out.tolist()]  # NaN (v != v) -> None: a line break in plotly


def polylines(tracks: np.ndarray) -> tuple[list[Any], list[Any], list[Any]]:
    """``(N, S, 3)`` tracks -> x, y, z lists with a ``None`` between tracks (one plotly trace draws all N)."""
    N, S, _ = tracks.shape
    pad = np.full((N, 1, 3), np.nan)
    flat = np.concatenate((tracks, pad), axis=1).reshape(N * (S + 1), 3)  # (N*(S+1), 3)
    return _round(flat[:, 0]), _round(flat[:, 1]), _round(flat[:, 2])


def line_trace(tracks: np.ndarray, *, name: str, color: str, width: float = 2.0, opacity: float = 1.0,
               markers: bool = False) -> Any:
    """One ``Scatter3d`` drawing every track in ``tracks`` (``(N, S, 3)``: x0, x1, stage)."""
    import plotly.graph_objects as go

    x, y, z = polylines(tracks)
    return go.Scatter3d(x=x, y=y, z=z, name=name, opacity=opacity, hoverinfo="name",
                        mode="lines+markers" if markers else "lines", line={"color": color, "width": width},
                        marker={"size": 2.5, "color": color} if markers else None)


def figure3d(traces: list[Any], *, title: str, z_title: str = "stage", height: int = 540) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure(data=traces)
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        template="none",  # no 6 KB default template per view; axes styled below
        height=height,
        margin={"l": 0, "r": 0, "t": 40, "b": 0},
        legend={"itemsizing": "constant"},
        scene={
            "xaxis": {"title": {"text": "x0"}, "backgroundcolor": "#f7f7f7", "showbackground": True},
            "yaxis": {"title": {"text": "x1"}, "backgroundcolor": "#f7f7f7", "showbackground": True},
            "zaxis": {"title": {"text": z_title}, "backgroundcolor": "#fbfbfb", "showbackground": True},
            "aspectmode": "manual",
            "aspectratio": {"x": 1, "y": 1, "z": 1.4},
        },
    )
    return fig


def to_json(fig: Any) -> str:
    """Deterministic JSON ``{"data": [...], "layout": {...}}`` of a plotly figure."""
    d = fig.to_plotly_json()
    return json.dumps({"data": d["data"], "layout": d["layout"]}, separators=(",", ":"), allow_nan=False,
                      default=_default)


def _default(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return _round(o) if o.dtype.kind == "f" else o.tolist()
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(f"not JSON serializable in a plotly view: {type(o).__name__}")
