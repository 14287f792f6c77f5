"""The equilibrium monitor's figure, readable with any number of gauge groups.

Up to :data:`FEW` groups: one coloured line per group (norm, angle), its equilibrium at each step's lr dashed and the
norm predicted along the run's schedule dotted.  More groups: each group's *ratio to its own prediction* as a thin
grey line (raw values where no law applies), the median across groups in black, the 10-90% band shaded and the group
farthest from 1 named in colour, so dozens of groups read as one distribution.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

FEW = 8  # up to this many groups get their own colour and legend entry (the qualitative palette has 10)
BAND = (10, 90)  # percentiles of the shaded band across groups


def _aligned(mon: Any, key: str, ref: str | None) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values (S, G))`` of ``key`` (divided by ``ref`` where given and recorded), NaN where missing."""
    steps = np.array([h["step"] for h in mon.history], dtype=np.float64)
    vals = np.full((len(steps), len(mon.groups)), np.nan)
    for i, h in enumerate(mon.history):
        for j, g in enumerate(mon.groups):
            r = h["groups"][g.name]
            v, den = r.get(key), (r.get(ref) if ref else 1.0)
            if v is not None and den not in (None, 0.0) and np.isfinite(den):
                vals[i, j] = float(v) / float(den)
    return steps, vals


def _few(mon: Any, axes: Any) -> None:
    a1, a2 = axes
    shown = mon.group_labels()[1]
    for i, (g, label) in enumerate(zip(mon.groups, shown)):
        col = f"C{i % 10}"
        a1.plot(*mon.series(g.name, "norm"), color=col, lw=1)
        a1.plot(*mon.series(g.name, "norm_eq"), color=col, lw=1, ls="--")
        a1.plot(*mon.series(g.name, "norm_track"), color=col, lw=1, ls=":")
        a2.plot(*mon.series(g.name, "angle"), color=col, lw=0.8, label=label)
        a2.plot(*mon.series(g.name, "angle_eq"), color=col, lw=1, ls="--")
    a1.set(xlabel="step", ylabel="||W_I||", title="norm (dashed: equilibrium at the lr; dotted: along the schedule)")
    a2.set(xlabel="step", ylabel="eff lr: angle per step (rad)", yscale="log", title="rotation (dashed: predicted)")
    a2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _many(mon: Any, axes: Any) -> None:
    for ax, key, ref, what in ((axes[0], "norm", "norm_eq", "norm"), (axes[1], "angle", "angle_eq", "angle")):
        steps, ratio = _aligned(mon, key, ref)
        raw = np.isnan(ratio).all(axis=0)  # groups without a prediction: plot their raw values
        if raw.any():
            ratio[:, raw] = _aligned(mon, key, None)[1][:, raw]
        ax.plot(steps, ratio, color="0.6", lw=0.4, alpha=0.5)
        ok = ~np.isnan(ratio).all(axis=1)
        if ok.any():
            lo, med, hi = np.nanpercentile(ratio[ok], [BAND[0], 50, BAND[1]], axis=1)
            ax.fill_between(steps[ok], lo, hi, color="C0", alpha=0.25, lw=0, label=f"{BAND[0]}-{BAND[1]}% of groups")
            ax.plot(steps[ok], med, color="k", lw=1.5, label="median over groups")
            last = ratio[ok][-1]
            if np.isfinite(last).any():
                j = int(np.nanargmax(np.abs(np.log(np.abs(last) + 1e-300))))
                shown = mon.group_labels()[1]
                ax.plot(steps, ratio[:, j], color="C3", lw=1, label=f"farthest: {shown[j]}")
        ax.axhline(1.0, color="k", lw=0.6, ls=":")
        ylabel = f"{what} / predicted" if not raw.all() else what
        ax.set(xlabel="step", ylabel=ylabel, yscale="log" if what == "angle" else "linear",
               title=f"{what}: {len(mon.groups)} groups ({int(raw.sum())} without a law: raw)")
        ax.legend(fontsize=7, loc="best", frameon=False)


def plot_monitor(mon: Any, path: str | Path) -> None:
    """Write the monitor's figure to ``path`` (format by suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    few = len(mon.groups) <= FEW
    fig, axes = plt.subplots(1, 2, figsize=(12.0 if few else 11.0, 4.2))
    (_few if few else _many)(mon, axes)
    fig.tight_layout()
    fig.savefig(str(path))
    plt.close(fig)
