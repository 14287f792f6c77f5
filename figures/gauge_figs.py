r"""The gauge figure of the first source text (``gauge.forward_invariance``, also evidence for
``gauge.epsilon_breaking``), on the gauge package's setup (:func:`gauge.model.build_setup`):
:math:`\max|\mathrm{RMSNorm}_\epsilon(x(cW)^\top) - \mathrm{RMSNorm}_\epsilon(xW^\top)|` over
:math:`c\in[10^{-2}, 10^2]` (:func:`gauge.measure.scale_deviation`), :math:`\epsilon = 0` in float64 and float32
against the round-off tolerance, and each :math:`\epsilon > 0` in float64 against the exact law
(:func:`gauge.laws.predicted_deviation`) and its first-order form :math:`\frac{\epsilon}{2m}(1 - c^{-2})`.
"""

from __future__ import annotations

import numpy as np
import torch

from figures.registry import FigureOutput, figure, progress
from figures.style import new_figure

EPS_COLORS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b")


def gauge_setup(ctx):
    """The gauge package's setup (trained QK-norm model + held-out batch), built once per run."""
    from gauge.model import GaugeConfig, build_setup

    def build():
        progress("  building the gauge package's QK-norm setup (a short float32 training run)")
        cfg = GaugeConfig(seed=ctx.seed, c_points=41 if ctx.quick else 101)
        return build_setup(cfg, qk_norm=True)

    return ctx.memo("gauge_setup", build)


@figure("gauge.forward_invariance", title="Gauge deviation against the scale c", source="gauge text",
        claims=("gauge.forward_invariance", "gauge.epsilon_breaking"))
def forward_invariance(ctx) -> FigureOutput:
    from gauge.laws import break_scales, predicted_deviation
    from gauge.measure import output_tolerance, scale_deviation
    from gauge.model import DTYPES, capture_q_path

    setup = gauge_setup(ctx)
    cfg = setup.config
    cs = cfg.c_grid()  # (C,) float64
    curves: dict[str, np.ndarray] = {}
    tols: dict[str, float] = {}
    eps_rows = []
    with torch.no_grad():
        for dtype in ("float64", "float32"):
            model = setup.model(dtype)
            attn = model.blocks[cfg.layer].attn
            W = setup.weight(dtype)
            x = capture_q_path(model, cfg.layer, setup.idx, setup.targets).x.flatten(0, 1)  # (N, D)
            dev, ref = scale_deviation(x, W, cfg.n_heads, 0.0, attn.q_norm.weight, cs)  # (C,), (N, H, hd)
            curves[dtype] = dev.double().numpy()
            tols[dtype] = output_tolerance(dtype, cfg, float(ref.abs().max())).bound()
            if dtype != "float64":
                continue
            for eps in cfg.eps_values(DTYPES[dtype]):
                dev_e, ref_e = scale_deviation(x, W, cfg.n_heads, eps, attn.q_norm.weight, cs)
                z = torch.matmul(x, W.T).unflatten(-1, (cfg.n_heads, -1)).reshape(-1, ref_e.shape[-1])  # (R, hd)
                y = ref_e.reshape(z.shape)
                c_used = cs.to(W.dtype)
                exact = predicted_deviation(c_used, z, y, eps).numpy()
                first = predicted_deviation(c_used, z, y, eps, leading=True).numpy()
                c_lo, _ = break_scales(z, y, eps, tols["float64"])
                eps_rows.append((eps, dev_e.numpy(), exact, first, c_lo))

    c = cs.numpy()
    floor = 1e-19  # exact zeros (bitwise-equal outputs, e.g. c = 1 or powers of two) drawn at the axis floor
    fig = new_figure(figsize=(10.5, 4.4))
    ax = fig.add_subplot(1, 2, 1)
    for dtype, color in (("float64", "#1f77b4"), ("float32", "#2ca02c")):
        ax.loglog(c, np.maximum(curves[dtype], floor), ".", ms=3, color=color, label=f"measured, eps = 0 ({dtype})")
        ax.axhline(tols[dtype], color=color, ls="--", lw=1, label=f"round-off tolerance ({dtype})")
    ax.axhline(3e-15, color="k", ls=":", lw=1, label="source: 'about 3e-15' (float64)")
    ax.set(xlabel="scale c of W", ylabel="max |RMSNorm(x(cW)) − RMSNorm(xW)|", ylim=(floor / 2, 1.0))
    ax.set_title("eps = 0: invariant to round-off for every c", fontsize=9)
    ax.legend(fontsize=7, loc="upper center")

    ax2 = fig.add_subplot(1, 2, 2)
    for (eps, meas, exact, first, c_lo), color in zip(eps_rows, EPS_COLORS):
        ax2.loglog(c, np.maximum(meas, floor), "o", ms=2.5, color=color, label=f"measured, eps = {eps:.3g}")
        ax2.loglog(c, np.maximum(exact, floor), "-", lw=1.2, color=color, label="exact law")
        ax2.loglog(c, np.maximum(first, floor), ":", lw=1.2, color=color)
        if c_lo > c[0]:
            ax2.axvline(c_lo, color=color, lw=0.6, alpha=0.6)
    ax2.axhline(tols["float64"], color="#1f77b4", ls="--", lw=1, label="float64 tolerance")
    ax2.set(xlabel="scale c of W", ylim=(floor / 2, 10.0))
    ax2.set_title("eps > 0 (float64): the gauge breaks for small c, as predicted\n"
                  "solid: exact law; dotted: first order (eps/2m)(1 − 1/c²); vertical: predicted break scale",
                  fontsize=8)
    ax2.legend(fontsize=6.5, loc="upper right", ncol=1)
    fig.suptitle("The RMSNorm scale gauge: output deviation against the scale c of W", weight="bold")
    err = max(float(np.max(np.abs(meas - exact))) for _, meas, exact, _, _ in eps_rows)
    cap = (f"W = {setup.weight_name()} of the gauge package's QK-norm transformer (d_model {cfg.d_model}, "
           f"{cfg.n_heads} heads, trained {cfg.train_steps} AdamW steps), inputs from a held-out Shakespeare batch "
           f"({cfg.batch_size}x{cfg.block_size} bytes); {len(c)} log-spaced c in [{cfg.c_min:g}, {cfg.c_max:g}]. "
           f"Left: eps = 0, "
           f"max deviation {curves['float64'].max():.2g} in float64 (tolerance {tols['float64']:.2g}) and "
           f"{curves['float32'].max():.2g} in float32 (tolerance {tols['float32']:.2g}); points at the floor are "
           f"bitwise-equal outputs. Right: eps in {{{', '.join(f'{e:.3g}' for e, *_ in eps_rows)}}} (float64): "
           f"measured against the exact law (max |measured − law| = {err:.2g}); the first-order form is dotted. "
           "Same measurement functions as the gauge.forward_invariance and gauge.epsilon_breaking records.")
    return FigureOutput(fig, cap, numbers={"max_dev_float64": float(curves["float64"].max()),
                                           "max_dev_float32": float(curves["float32"].max()),
                                           "max_law_error": err})
