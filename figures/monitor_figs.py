"""``dynamics.fig_rotational_variants``: base optimizers (AdamW, SGD with momentum) against their rotational variants
(:mod:`dynamics.rotational`; Kosson, Messmer & Jaggi, arXiv:2305.17212; Wan et al., arXiv:2006.08419): loss and the
gauge groups' per-step angle against the equilibrium angle.  A view of ``results/rotational/compare.json`` (written
by ``python -m studies.rotational_compare``, about 7 minutes), not a rerun.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from figures.registry import FigureOutput, FigureUnavailable, figure
from figures.style import new_panels

RESULT = Path(__file__).resolve().parent.parent / "results" / "rotational" / "compare.json"


@figure("dynamics.fig_rotational_variants", title="Rotational variants: equilibrium angle from step 1",
        source="gauge text", claims=(), fast=True)
def rotational_variants(ctx) -> FigureOutput:
    if not RESULT.is_file():
        raise FigureUnavailable(f"{RESULT} is missing: run python -m studies.rotational_compare")
    data = json.loads(RESULT.read_text())
    fig, (ax1, ax2) = new_panels(2, figsize=(10.0, 4.0))
    numbers = {}
    for i, r in enumerate(data["runs"]):
        col, ls = f"C{i // 2}", "-" if r["rotational"] else ":"
        lab = f"{r['optimizer']} {'rotational' if r['rotational'] else 'base'}"
        w = max(1, len(r["losses"]) // 30)  # running mean: per-step losses of a 16-sequence batch are noisy
        sm = np.convolve(r["losses"], np.ones(w) / w, mode="valid")
        ax1.plot(np.arange(len(sm)) + w, sm, color=col, ls=ls, lw=1, label=lab)
        ax2.plot(np.arange(1, len(r["angle_mean"]) + 1), r["angle_mean"], color=col, ls=ls, lw=1, label=lab)
        ax2.axhline(r["angle_eq"], color=col, lw=0.6, ls="--")
        numbers[lab] = {"val_loss": r["val_loss"], "angle_step1_over_pred": r["angle_mean"][0] / r["angle_eq"]}
    ax1.set(xlabel="step", ylabel="train loss (nats, running mean)", title="loss (same tokens, same seed)")
    ax2.set(xlabel="step", ylabel="mean gauge-group angle per step (rad)", yscale="log",
            title="rotation; dashed: equilibrium angle")
    ax1.legend(fontsize=7)
    cap = (f"Dense QK-norm model {data['model']}, batch {data['batch']}, {data['steps']} steps, float32, "
           f"bundled corpus; base optimizer vs rotational variant (gauge groups: per-head row blocks of q_proj and "
           f"k_proj found by gauge.census). The rotational variant turns every group by the equilibrium angle from "
           f"step 1 at a fixed norm; the base optimizers start far from it.")
    return FigureOutput(fig=fig, caption=cap, numbers=numbers)
