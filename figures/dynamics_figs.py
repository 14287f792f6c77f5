"""The weight-norm dynamics figures of the first source text, drawn from the dynamics package's own machinery: a
memoized :class:`dynamics.context.Context` (the QK-norm ``W_q`` of a transformer on Shakespeare in float32, the
float64 regression toy, the noise toy), the laws of :mod:`dynamics.laws` and :class:`dynamics.simulate.Stepper`.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from figures.registry import FigureOutput, figure, progress
from figures.style import new_figure, new_panels

CONVERGENCE_GRID = (  # (optimizer, decay, lr, wd): SGD at three decays and lrs, plus AdamW in torch's convention
    ("sgd", "source", 0.1, 0.01),
    ("sgd", "source", 0.1, 0.05),
    ("sgd", "source", 0.3, 0.05),
    ("adamw", "torch", 0.01, 0.5),
)
CONVERGENCE_START = 4.0  # start at 4x the predicted equilibrium squared norm: the approach is visible
RATE_SCALES = tuple(2.0 ** (-k / 2) for k in range(-2, 7))  # sqrt(2)-spaced norm scales 2 .. 1/8 (exact: c^2 = 2^-k)


def dyn_context(ctx):
    """One dynamics Context for all figures (its runs are memoized), at the report's size."""
    from dynamics.context import Context, DynamicsPlan

    return ctx.memo("dynamics_context", lambda: Context(DynamicsPlan(quick=ctx.quick, seed=ctx.seed),
                                                        progress=lambda m: progress("  " + m)))


def _label(tr) -> str:
    return f"{tr.problem_name} ({tr.dtype}, {tr.cfg.label()})"


@figure("dynamics.radial_gradient_during_training", title="The radial gradient over a training run",
        source="gauge text", claims=("dynamics.radial_gradient_during_training", "gauge.euler_radial_gradient"))
def radial_gradient(ctx) -> FigureOutput:
    from rmsgauge import tolerance

    dc = dyn_context(ctx)
    runs = [dc.model_trace(), dc.toy_trace(), dc.toy_trace("float32")]
    fig, (ax, ax2) = new_panels(2, figsize=(10.0, 4.2))
    colors = ("#1f77b4", "#d62728", "#2ca02c")
    styles = ("-", "-", "--")  # the two toy runs share their gradient norms: the float32 one dashed on top
    rows = {}
    for tr, color, ls in zip(runs, colors, styles):
        rel = tr.radial_relative()  # (T, R)
        t = np.arange(tr.steps)
        tol = tolerance(tr.dtype, size=tr.group_size).rtol
        ax.semilogy(t, np.maximum(rel.max(1), 1e-20), lw=0.8, color=color, label=_label(tr))
        ax.axhline(tol, color=color, ls="--", lw=0.8)
        ax2.semilogy(t, np.sqrt(tr.g2).mean(1), lw=1.0, ls=ls, color=color, label=f"{tr.problem_name} ({tr.dtype})")
        rows[_label(tr)] = {"max_rel": float(rel.max()), "tol": tol}
    ax.set(xlabel="training step", ylabel="max over gauge groups of |<g, W>| / (||g|| ||W||)")
    ax.set_title("radial part of the gradient: round-off every step (dashed: tolerance)", fontsize=9)
    ax.legend(fontsize=6.5)
    ax2.set(xlabel="training step", ylabel="||g|| (mean over gauge groups)")
    ax2.set_title("while the gradient itself is far from zero", fontsize=9)
    ax2.legend(fontsize=7)
    fig.suptitle("Euler's identity during training: <grad_W L, W> = 0 at every step", weight="bold")
    cap = ("Relative radial gradient |<g, W>|/(||g|| ||W||) at every step of the dynamics package's training runs "
           "(the QK-norm W_q of a transformer on Shakespeare in float32, one gauge group per head; the float64 and "
           "float32 regression toy), against each dtype's round-off tolerance eps·sqrt(size)·16 (dashed); right: "
           "the gradient norm over the same runs. Max relative radial part: "
           + "; ".join(f"{k}: {v['max_rel']:.2g} (tol {v['tol']:.2g})" for k, v in rows.items()) + ".")
    return FigureOutput(fig, cap, numbers=rows)


@figure("dynamics.trajectory_tracking", title="Squared-norm trajectory: exact vs first-order prediction",
        source="gauge text", claims=("dynamics.trajectory_tracking", "dynamics.norm_identity"))
def trajectory_tracking(ctx) -> FigureOutput:
    from dynamics import laws

    dc = dyn_context(ctx)
    runs = [dc.toy_trace(), dc.model_trace()]
    fig = new_figure(figsize=(11.0, 6.4))
    nums = {}
    for j, tr in enumerate(runs):
        c = tr.cfg
        x = tr.traj  # (T+1, R) measured ||W_t||^2
        exact = laws.iterate_prediction(x[0], c.lr**2 * tr.u2 - 2 * c.lr * c.q * tr.uw, c.q**2)
        first = laws.iterate_prediction(x[0], c.lr**2 * tr.u2, 1.0 - 2.0 * c.d)
        bias = laws.first_order_bias(x, c.d)  # exact law of the first-order form's gap
        g = 0  # one gauge group drawn (every group behaves alike; the caption gives the max over groups)
        t = np.arange(x.shape[0])
        ax = fig.add_subplot(2, 2, j + 1)
        ax.plot(t, x[:, g], color="k", lw=2.2, label="measured ||W_t||²")
        ax.plot(t, exact[:, g], color="#1f77b4", lw=1.0, ls="--", label="exact form q²x − 2ηq<u,W> + η²||u||²")
        ax.plot(t, first[:, g], color="#d62728", lw=1.0, label="source's (1 − 2wd)x + η²||g||²")
        ax.set(yscale="log", ylabel="||W_t||²")
        ax.set_title(f"{tr.problem_name} ({tr.dtype}): {c.label()}", fontsize=9)
        ax.legend(fontsize=6.5)
        ax2 = fig.add_subplot(2, 2, j + 3)
        rel_exact = np.abs(exact - x) / x
        rel_first = np.abs(first - x) / x
        ax2.semilogy(t, np.maximum(rel_exact[:, g], 1e-18), color="#1f77b4", lw=0.8, label="exact form")
        ax2.semilogy(t, np.maximum(rel_first[:, g], 1e-18), color="#d62728", lw=1.2, label="source's form")
        ax2.semilogy(t, np.maximum(np.abs(bias[:, g]) / x[:, g], 1e-18), color="k", lw=0.8, ls=":",
                     label="bias law e_(t+1) = (1−2d)e_t + d²x_t")
        ax2.axhline(4e-4, color="#ff7f0e", ls="--", lw=1, label="source: 'a relative 4e-4'")
        ax2.axhline(c.d / 2, color="gray", ls="-.", lw=0.8, label="d/2 (saturation)")
        ax2.set(xlabel="step t", ylabel="relative error of the prediction")
        ax2.legend(fontsize=6.5, loc="lower right")
        nums[tr.problem_name] = {"exact_max_rel": float(rel_exact.max()), "first_max_rel": float(rel_first.max()),
                                 "first_final_rel": float(rel_first[-1].max()), "d": c.d}
    fig.suptitle("The squared-norm trajectory and its two predictions (iterated from the measured update norms)",
                 weight="bold")
    cap = ("Top: measured ||W_t||² (one gauge group) and the two predictions, each iterated from x_0 with the measured "
           "per-step update norms: the exact identity (blue, dashed, on top of the data) and the source's first-order "
           "(1 − 2wd) form (red). Bottom: their relative errors; the first-order gap follows the exact bias law "
           "e_(t+1) = (1 − 2d) e_t + d² x_t (dotted): a systematic bias, ≈ d² t early, saturating at d/2. "
           + "; ".join(f"{k}: exact form max {v['exact_max_rel']:.2g}, first-order max {v['first_max_rel']:.2g} "
                       f"(d = {v['d']:g})" for k, v in nums.items())
           + ". Left: the float64 regression toy; right: the QK-norm W_q on Shakespeare (float32 weights, float64 "
             "norms: the exact form's ~1e-6 there is the float32 rounding of the stored weight, accumulated).")
    return FigureOutput(fig, cap, numbers=nums)


@figure("dynamics.equilibrium_norm", title="Convergence to the rotational equilibrium (norm and angle)",
        source="gauge text", claims=("dynamics.equilibrium_norm", "dynamics.equilibrium_angle"))
def equilibrium(ctx) -> FigureOutput:
    from dynamics import laws
    from dynamics.context import predicted_noise_equilibrium
    from dynamics.simulate import OptimConfig

    dc = dyn_context(ctx)
    grid = CONVERGENCE_GRID[::2] if ctx.quick else CONVERGENCE_GRID
    fig, (ax, ax2) = new_panels(2, figsize=(11.0, 4.4))
    nums = {}
    colors = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")
    for i, ((opt, decay, lr, wd), color) in enumerate(zip(grid, colors)):
        lw = 2.6 - 0.5 * i  # SGD's normalized curves coincide for equal d (the law is lr-free): earlier ones wider
        cfg = OptimConfig(optimizer=opt, decay=decay, lr=lr, wd=wd)
        tr, info = dc.noise_trace(cfg, start_factor=CONVERGENCE_START)
        n = info["n"]
        x_pred = predicted_noise_equilibrium(cfg, n)
        t = np.arange(tr.steps + 1)
        x = tr.traj.mean(1)  # (T+1,) mean over replicas
        ax.semilogy(t, x / x_pred, color=color, lw=lw, label=cfg.label())
        phi_law = laws.equilibrium_angle(opt, decay, lr, wd, cfg.momentum, cfg.betas)
        phi_pub, _ = laws.published_angle(opt, decay, lr, wd, cfg.momentum, cfg.betas)
        phi = tr.angle.mean(1)  # (T,)
        k = max(1, tr.steps // 200)  # light smoothing of the noisy per-step angle for display
        phi_s = np.convolve(phi, np.ones(k) / k, mode="valid")
        ax2.semilogy(np.arange(len(phi_s)) + k / 2, phi_s, color=color, lw=lw, label=cfg.label())
        ax2.axhline(phi_law, color=color, ls="--", lw=1.0)
        ax2.axhline(phi_pub, color=color, ls=":", lw=1.0)
        w = slice(info["burn"], tr.steps)
        nums[cfg.label()] = {"x_window/x_pred": float(tr.x[w].mean() / x_pred), "phi_window": float(phi[w].mean()),
                             "phi_law": phi_law, "phi_published": phi_pub, "burn": info["burn"]}
    ax.axhline(1.0, color="k", ls="--", lw=1)
    ax.set(xlabel="step", ylabel="||W_t||² / predicted equilibrium x*")
    ax.set_title(f"norm: from {CONVERGENCE_START:g}x the equilibrium down to it", fontsize=9)
    ax.legend(fontsize=7)
    ax2.set(xlabel="step", ylabel="per-step angle (rad, mean over replicas)")
    ax2.set_title("angle: dashed = exact law, dotted = published first-order form", fontsize=9)
    fig.suptitle("Convergence to the rotational equilibrium for several (lr, wd)", weight="bold")
    cap = ("The noise toy of the dynamics package (L_t = <ξ_t, W/||W||>, fresh Gaussian ξ_t each step: the "
           "random-walk regime of Kosson et al.), started at 4× the predicted equilibrium squared norm, float64, mean "
           "over independent replicas. Left: ||W_t||² relative to the predicted fixed point (SGD: x*² = lr² G²/(2d − "
           "d²); AdamW: its law with ν). Right: per-step angle against our exact equilibrium law "
           "cos φ* = (q + μ)/(1 + μq) (dashed) and the published first-order form (dotted). For SGD with the same "
           "d the normalized norm and the angle do not depend on lr (the two wd = 0.05 runs coincide). "
           "Stationary-window means: "
           + "; ".join(f"{k}: x/x* = {v['x_window/x_pred']:.3f}, φ = {v['phi_window']:.4g} (law {v['phi_law']:.4g}, "
                       f"published {v['phi_published']:.4g})" for k, v in nums.items()) + ".")
    return FigureOutput(fig, cap, numbers=nums)


def angles_at_scales(W: torch.Tensor, loss_fn, cfg, scales: tuple[float, ...]) -> np.ndarray:
    """Per-step angle of one optimizer step from fresh state at ``c W`` for each scale (``W`` restored)."""
    from dynamics.simulate import Stepper, angle_between

    w_init = W.detach().clone()
    out = []
    for c in scales:
        with torch.no_grad():
            W.copy_(w_init * c)
        (g,) = torch.autograd.grad(loss_fn(), W)
        W.grad = g
        before = W.detach().to(torch.float64, copy=True)
        Stepper(W, cfg).step()
        out.append(float(angle_between(before.reshape(1, -1), W.detach().double().reshape(1, -1))[0]))
    with torch.no_grad():
        W.copy_(w_init)
    W.grad = None
    return np.array(out)


@figure("dynamics.angular_rate_scaling", title="Per-step angle against norm scale (log-log)", source="gauge text",
        claims=("dynamics.angular_rate_scaling",))
def angular_rate_scaling(ctx) -> FigureOutput:
    from dynamics import laws
    from dynamics.checks_angle import rate_row
    from dynamics.context import SOURCE_ANGLES, SOURCE_SCALES
    from dynamics.simulate import OptimConfig

    dc = dyn_context(ctx)
    cal = dc.model_calibration()
    prob = cal["problem"]
    loss_fn = partial(prob.loss_on, *cal["batch"])
    sgd_row = rate_row(prob.weight, loss_fn, dc.main_cfg, None, prob.dtype)  # lr solved for 0.0025 rad at c = 1
    adam_cfg = partial(OptimConfig, "adamw", "torch", wd=0.1)  # AdamW, torch convention, at a given lr
    adam_row = rate_row(prob.weight, loss_fn, adam_cfg, None, prob.dtype)
    progress(f"  angle at {len(RATE_SCALES)} norm scales (SGD and AdamW, {prob.dtype})")
    sgd = angles_at_scales(prob.weight, loss_fn, dc.main_cfg(sgd_row["lr"]), RATE_SCALES)
    adam = angles_at_scales(prob.weight, loss_fn, adam_cfg(adam_row["lr"]), RATE_SCALES)
    c = np.array(RATE_SCALES)
    fit_sgd = laws.fitted_exponent(c, sgd)
    fit_adam = laws.fitted_exponent(c, adam)
    fit_src = laws.fitted_exponent(SOURCE_SCALES, SOURCE_ANGLES)

    fig, (ax,) = new_panels(1, figsize=(7.2, 5.4))
    a1 = SOURCE_ANGLES[0]
    cc = np.geomspace(c.min() / 1.2, c.max() * 1.2, 50)
    ax.loglog(cc, a1 * cc**-2.0, color="k", lw=1.0, ls="-", label="slope −2 (angle ∝ 1/||W||²)")
    ax.loglog(cc, a1 * cc**-1.0, color="k", lw=1.0, ls="--", label="slope −1 (angle ∝ 1/||W||, the text's wording)")
    ax.loglog(c, sgd, "o", color="#1f77b4", ms=6, label=f"measured, SGD (source decay): slope {fit_sgd:.3f}")
    ax.loglog(c, adam, "s", color="#2ca02c", ms=5, label=f"measured, AdamW (first step): slope {fit_adam:.3f}")
    ax.loglog(SOURCE_SCALES, SOURCE_ANGLES, "*", color="#d62728", ms=13, label=f"source's numbers: slope {fit_src:.3f}")
    ax.set(xlabel="norm scale c (W → cW, same direction)", ylabel="per-step rotation angle (rad)")
    ax.legend(fontsize=7.5, loc="upper right")
    ax.set_title("which law does the data follow?", fontsize=9)
    fig.suptitle("Effective angular learning rate against the norm scale", weight="bold")
    cap = (f"One optimizer step from fresh state on the QK-norm W_q of a real transformer (dynamics package, "
           f"{prob.dtype}, one fixed Shakespeare batch) at norm scales c = 2 … 1/8, same direction, same lr; the lr is "
           f"solved so that the SGD step at c = 1 turns W by the source's 0.0025 rad (lr = {sgd_row['lr']:.4g}). "
           f"SGD's angle follows slope −2 (fitted {fit_sgd:.4f}: tan φ ∝ ||g||/||W|| ∝ 1/c²), as do the source's own "
           f"numbers 0.0025, 0.010, 0.040 (slope {fit_src:.3f}); the text's wording 'grows like 1/||W||' (slope −1) "
           f"holds only for Adam, whose first step is scale-free (fitted {fit_adam:.4f}). Lines through the source's "
           f"c = 1 point.")
    return FigureOutput(fig, cap, numbers={"fit_sgd": fit_sgd, "fit_adam": fit_adam, "fit_source": fit_src,
                                           "lr_sgd": sgd_row["lr"], "angles_sgd": sgd.tolist(),
                                           "check_angles_sgd": sgd_row["angles"]})
