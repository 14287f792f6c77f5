"""Static figures of the GRT text's figure list (embedding storage, the coupling W's indexing, the butterfly wiring,
parameter accounting), read from ``grt_model`` itself (config, modules on the ``meta`` device for counts, a freshly
initialized cascade), never typed in; no training.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.patches import Rectangle

from figures.registry import FigureOutput, figure
from figures.style import FADED, HEAD_COLORS, new_figure, new_panels
from grt_model.config import GRTConfig
from rmsgauge import seed_everything, tolerance

FEATURE_NAMES = ("f0: energy x0²+x1²", "f1: x0", "f2: x1", "f3: signed area with pair p+1")


@figure("grt.embedding_rebuild", title="Embedding storage: dense table vs phase table + magnitude",
        source="GRT text", claims=("grt.embedding_rebuild", "grt.param_accounting"), fast=True)
def embedding_storage(ctx) -> FigureOutput:
    from grt_model.embedding import PhaseEmbedding

    cfg = GRTConfig()  # the text's reference config: V = 50,000, d = 256
    V, d, P = cfg.vocab_size, cfg.d_model, cfg.pairs
    # count parameters of the real modules, allocated on the meta device (no memory)
    dense_n = torch.nn.Embedding(V, d, device="meta").weight.numel()  # V*d
    phase = PhaseEmbedding(V, P, cfg.embed_radius_init, device="meta")
    phase_n, mag_n = phase.phases.numel(), phase.magnitudes.numel()
    ratio = (phase_n + mag_n) / dense_n

    fig = new_figure(figsize=(9.0, 4.2))
    gs = fig.add_gridspec(1, 2, width_ratios=(1.5, 1.0))
    ax = fig.add_subplot(gs[0, 0])
    ax.set_axis_off()
    h = 1.0  # both tables have V rows: draw them at equal height, width proportional to columns
    sx = 1.0 / d  # the dense table is one unit wide
    ax.add_patch(Rectangle((0, 0), d * sx, h, fc="#9ecae1", ec="k"))
    ax.text(d * sx / 2, h / 2, f"dense table\n[{V:,}, {d}]\n{dense_n:,} numbers", ha="center", va="center")
    x_grt = d * sx + 0.25
    ax.add_patch(Rectangle((x_grt, 0), P * sx, h, fc="#fdae6b", ec="k"))
    ax.text(x_grt + P * sx / 2, h / 2, f"phases θ\n[{V:,}, {P}]\n{phase_n:,}", ha="center", va="center",
            fontsize=8)
    w_mag = max(sx, 0.03)  # one column is too thin to see at this scale: drawn at a minimum width
    ax.add_patch(Rectangle((x_grt + P * sx + 0.08, 0), w_mag, h, fc="#d94801", ec="k"))
    ax.text(x_grt + P * sx + 0.08 + w_mag + 0.03, h / 2, f"magnitude r\n[{V:,}]\n{mag_n:,}", ha="left",
            va="center", fontsize=8)
    ax.text(0, -0.16, "standard", ha="left", va="top", weight="bold")
    ax.text(x_grt, -0.16, f"GRT: {phase_n + mag_n:,} numbers\n= {ratio:.5f} × dense\n"
            f"= (P+1)/(2P) = {P + 1}/{2 * P}", ha="left", va="top", weight="bold")
    ax.text(x_grt, 1.12, "rebuilt every pass, never stored:\n"
            r"$x_{2p} = r\,\cos\theta_p,\quad x_{2p+1} = r\,\sin\theta_p$", ha="left", va="bottom")
    ax.set(xlim=(-0.05, x_grt + P * sx + 0.5), ylim=(-0.55, 1.4))

    # one token's rebuilt pairs: every pair shares the token's magnitude, so the token is a ring
    seed_everything(ctx.seed)
    small = PhaseEmbedding(8, P, cfg.embed_radius_init, dtype=torch.float64)
    x = small(torch.tensor([3])).reshape(P, 2).detach().numpy()  # (P, 2)
    ax2 = fig.add_subplot(gs[0, 1])
    t = np.linspace(0, 2 * np.pi, 256)
    r0 = cfg.embed_radius_init
    ax2.plot(r0 * np.cos(t), r0 * np.sin(t), color=FADED, lw=1)
    ax2.scatter(x[:, 0], x[:, 1], s=10, color="#d94801", zorder=3)
    ax2.set(aspect="equal", xlabel="x0 = r cos θ", ylabel="x1 = r sin θ")
    ax2.set_title(f"one token's {P} rebuilt pairs (init):\na ring of radius r = {r0:g}", fontsize=9)
    fig.suptitle("How the embedding is stored", weight="bold")
    caption = (f"Reference config (V = {V:,}, d = {d}, P = {P} pairs). A dense embedding stores {dense_n:,} numbers; "
               f"the phase embedding stores one phase per pair [{V:,}, {P}] plus one magnitude per token [{V:,}]: "
               f"{phase_n + mag_n:,} numbers, ratio {ratio:.5f} (the text's 'about half'). Counts are read from "
               f"the modules themselves (grt_model.embedding.PhaseEmbedding vs torch.nn.Embedding). Right: one "
               f"token's pairs rebuilt in float64 at initialization (seed {ctx.seed}); all share the token's "
               f"magnitude, hence the ring the text's block-0 plots start from.")
    return FigureOutput(fig, caption, numbers={"dense": dense_n, "grt": phase_n + mag_n, "ratio": ratio})


@figure("grt.fig_coupling_w_indexing", title="How the coupling W [4P, P] is indexed",
        source="GRT text", fast=True)
def coupling_w_indexing(ctx) -> FigureOutput:
    from grt_model.butterfly import to_pairs
    from grt_model.cascade import RotationCascade, clifford_features

    cfg = GRTConfig()
    d, P, S = cfg.d_head, cfg.head_pairs, cfg.qkvo_stages  # one head of the Q projection: W is [4P, P]
    seed_everything(ctx.seed)
    casc = RotationCascade(d, S, coupling=True, heads=1, coupling_init_std=cfg.coupling_init_std,
                           dtype=torch.float64)
    casc.requires_grad_(False)  # a drawing, not training
    W = casc.coupling[0, 0]  # (4P, P): stage 0 of head 0
    p = 5  # the highlighted slot (any p works; 5 keeps the cells away from the band edges)

    # the nudge of stage 0, computed by hand from the indexing, against the cascade's own stage 0
    x = torch.randn(1, d, dtype=torch.float64)  # (1, d)
    x0, x1 = to_pairs(x, 1)  # (1, P) each
    F = clifford_features(x0, x1)  # (1, 4P) feature-major
    pre = (F[0].unsqueeze(1) * W)  # (4P, P): row r's contribution to slot p's pre-activation
    self_rows = torch.arange(4) * P  # offsets of the four bands
    self_part = pre[self_rows.unsqueeze(1) + torch.arange(P), torch.arange(P)].sum(0)  # (P,) self 1x4 per slot
    full = pre.sum(0)  # (P,)
    theta = casc.angles[0, 0] + torch.tanh(full)
    sc = casc.scales()[0, 0]  # (P, 2)
    y0 = (torch.cos(theta) * x0 - torch.sin(theta) * x1) * sc[:, 0]
    y1 = (torch.sin(theta) * x0 + torch.cos(theta) * x1) * sc[:, 1]
    yc0, yc1 = to_pairs(casc.stage_trace(x)[1], 1)
    err = float(torch.maximum((y0 - yc0).abs().max(), (y1 - yc1).abs().max()))
    tol = tolerance(torch.float64, size=4 * P, depth=2)
    agrees = tol.holds(err, 1.0)

    fig = new_figure(figsize=(10.0, 5.2))
    gs = fig.add_gridspec(1, 2, width_ratios=(1.0, 1.25))
    ax = fig.add_subplot(gs[0, 0])
    lim = float(W.abs().max())
    im = ax.imshow(W.numpy(), cmap="PuOr", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
    fig.colorbar(im, ax=ax, shrink=0.7, label="W value (init)")
    for b in range(1, 4):
        ax.axhline(b * P - 0.5, color="k", lw=1.2)
    for b, name in enumerate(FEATURE_NAMES):
        ax.text(-1.2, b * P + P / 2, f"{name.split(':')[0]}\nrows {b * P}–{(b + 1) * P - 1}", ha="right",
                va="center", fontsize=7)
    ax.add_patch(Rectangle((p - 0.5, -0.5), 1, 4 * P, fill=False, ec="#d62728", lw=1.6))
    for b in range(4):
        ax.add_patch(Rectangle((p - 0.5, b * P + p - 0.5), 1, 1, fc="#d62728", ec="k", lw=0.8))
    ax.annotate("f3 self-cell also carries pair p+1\n(cyclic roll, zero extra weights)", xy=(p, 3 * P + p),
                xytext=(p + 6, 3 * P + p + 12), fontsize=7, arrowprops={"arrowstyle": "->"})
    ax.set(xlabel=f"output slot (pair) p = 0..{P - 1}", yticks=[])
    ax.set_title(f"W [{4 * P}, {P}]: column p = {p} (outline), self 1×4 rows "
                 f"{{{p}, {P + p}, {2 * P + p}, {3 * P + p}}} (filled)", fontsize=8)

    ax2 = fig.add_subplot(gs[0, 1])
    idx = np.arange(P)
    ax2.bar(idx - 0.2, self_part.numpy(), width=0.4, color="#d62728", label="self 1×4 (own features)")
    ax2.bar(idx + 0.2, (full - self_part).numpy(), width=0.4, color=FADED, label="other 124 rows (all other pairs)")
    ax2.axhline(0, color="k", lw=0.6)
    ax2.set(xlabel="slot p", ylabel="contribution to (F·W)[p]")
    ax2.set_title("one input: Δθ_p = tanh(F·W[:, p]) reads the whole column", fontsize=9)
    ax2.legend(loc="upper right")
    fig.suptitle("How the coupling W is indexed (feature-major rows)", weight="bold")
    caption = (f"Coupling of one head's Q projection at the reference size (d_head = {d}, P = {P}): W is "
               f"[{4 * P}, {P}], rows feature-major (f0 energy, f1 x0, f2 x1, f3 signed area with pair p+1, each "
               f"band {P} rows), columns the output slots. Slot p's nudge reads its full column W[:, p]; the self "
               f"1×4 is rows {{p, P+p, 2P+p, 3P+p}}. Values are the cascade's initialization (seed {ctx.seed}, "
               f"std {cfg.coupling_init_std:g}), float64. Right: for one random input, each slot's pre-activation "
               f"split into its self 1×4 part and the rest. The nudge computed by hand from this indexing "
               f"reproduces grt_model's stage 0 to {err:.2g} (tolerance {tol.bound(1.0):.2g}: "
               f"{'agrees' if agrees else 'DISAGREES'}).")
    return FigureOutput(fig, caption, numbers={"max_abs_error": err, "agrees": agrees})


def reach_counts(width: int, n_stages: int) -> np.ndarray:
    """``[n_stages + 1]``: the fewest input coordinates any output coordinate depends on after s stages (both
    outputs of a pair depend on both its inputs, so a stage ORs the two rows of the boolean Jacobian sparsity)."""
    from grt_model.butterfly import pair_index

    D = np.eye(width, dtype=bool)  # (d_out, d_in)
    out = [1]
    for s in range(n_stages):
        idx = pair_index(width, s).numpy()  # (P, 2)
        D[idx[:, 0]] = D[idx[:, 1]] = D[idx[:, 0]] | D[idx[:, 1]]  # (P, d_in) rows merged
        out.append(int(D.sum(1).min()))
    return np.array(out)


@figure("grt.mixing", title="Butterfly wiring: which coordinates pair at each stage",
        source="GRT text", claims=("grt.mixing",), fast=True)
def butterfly_wiring(ctx) -> FigureOutput:
    from grt_model.butterfly import pair_index, stage_stride

    cfg = GRTConfig()
    fig = new_figure(figsize=(11.0, 4.6))
    gs = fig.add_gridspec(1, 3, width_ratios=(1.0, 1.5, 1.0))
    for k, (width, n_st) in enumerate(((16, 8), (cfg.d_head, cfg.qkvo_stages))):
        ax = fig.add_subplot(gs[0, k])
        lw = 1.3 if width <= 16 else 0.5
        strides = []
        for s in range(n_st):
            idx = pair_index(width, s).numpy()  # (P, 2)
            h = stage_stride(width, s)
            strides.append(h)
            # pairs sharing a block j overlap vertically: shift pair k of the block right by k/h of the gap
            xs = s + 0.7 * (np.arange(len(idx)) % h) / h  # (P,)
            for p, ((i0, i1), xp) in enumerate(zip(idx, xs)):
                ax.plot([xp, xp], [i0, i1], color=HEAD_COLORS[p % 4], lw=lw, alpha=0.9)
            ax.scatter(np.concatenate((xs, xs)), idx.T.ravel(), s=3 if width > 16 else 9, color="k", zorder=3)
        ax.invert_yaxis()
        ax.set_xticks(range(n_st), [f"{s}\nh={h}" for s, h in enumerate(strides)], fontsize=6 if width > 16 else 7)
        ax.set(xlabel="stage s (stride h = 2^(s mod log2 d))", ylabel="coordinate i")
        ax.grid(False)
        ax.set_title(f"d = {width}: {n_st} stages" + (" (one Q head)" if width == cfg.d_head else ""), fontsize=9)
    ax = fig.add_subplot(gs[0, 2])
    widths = (16, cfg.d_head, cfg.d_model, cfg.d_ff)
    full_after = {}
    for w in widths:
        n = int(math.log2(w)) + 3
        r = reach_counts(w, n)
        ax.plot(range(n + 1), r, marker="o", ms=3, label=f"d = {w}")
        full_after[w] = int(np.argmax(r == w))
    ax.set_yscale("log", base=2)
    ax.set(xlabel="stages applied", ylabel="fewest inputs any output depends on")
    ax.set_title("full mixing after log2(d) stages, not before", fontsize=9)
    ax.legend()
    fig.suptitle("The FFT-butterfly wiring (fixed, zero learned parameters)", weight="bold")
    ok = all(full_after[w] == int(math.log2(w)) for w in widths)
    caption = ("Left, middle: every stage pairs coordinate i with i + h for i with bit h clear (grt_model.butterfly, "
               "the one place that says it); a line joins the two coordinates of each pair, coloured by pair index "
               "mod 4 (pairs of one block are shifted sideways so none overlap). "
               f"Middle: the {cfg.qkvo_stages}-stage schedule of one Q head at d_head = {cfg.d_head} "
               "(strides cycle 1, 2, ..., d/2, 1, ...). Right: Jacobian sparsity from composing the pairings: the "
               "fewest inputs any output depends on after s stages; it reaches all d inputs after exactly "
               + ", ".join(f"{full_after[w]} (d = {w})" for w in widths)
               + f" stages, i.e. log2(d): {'as predicted' if ok else 'NOT as predicted'}. Exact integer counts.")
    return FigureOutput(fig, caption, numbers={"full_after": {str(k): v for k, v in full_after.items()}, "ok": ok})


@figure("grt.param_accounting", title="Parameter accounting: GRT vs dense", source="GRT text",
        claims=("grt.param_accounting",), fast=True)
def param_accounting(ctx) -> FigureOutput:
    from grt_model.accounting import KINDS, param_table

    cfg = GRTConfig()
    rows = [r for r in param_table(cfg) if r.grt or r.dense]
    comps = [r for r in rows if r.component != "total"]
    total = next(r for r in rows if r.component == "total")
    fig, (ax,) = new_panels(1, figsize=(10.0, 4.6))
    x = np.arange(len(comps))
    kind_colors = {"angles": "#fdae6b", "scales": "#e6550d", "coupling": "#756bb1", "other": "#969696"}
    bottom = np.zeros(len(comps))
    for kind in KINDS:
        vals = np.array([getattr(r, kind) for r in comps], dtype=float)
        if vals.any():
            ax.bar(x + 0.2, vals, bottom=bottom, width=0.4, color=kind_colors[kind], label=f"GRT: {kind}")
            bottom += vals
    ax.bar(x - 0.2, [r.dense for r in comps], width=0.4, color="#9ecae1", label="dense")
    for xi, r in zip(x, comps):
        lab = "GRT only" if r.dense == 0 else f"{r.ratio:.2f}×"
        ax.text(xi, max(r.grt, r.dense) * 1.25, lab, ha="center", fontsize=7,
                color="#b00" if (r.ratio or 2) > 1 else "#176d17")
    ax.set_xticks(x, [r.component for r in comps], rotation=20)
    ax.set(yscale="log", ylabel="parameters (whole model, log scale)",
           ylim=(1, max(max(r.grt, r.dense) for r in comps) * 4))
    ax.legend(ncol=3, fontsize=7, loc="upper right")
    ax.set_title(f"reference config: V = {cfg.vocab_size:,}, d = {cfg.d_model}, {cfg.n_heads} heads, "
                 f"{cfg.n_blocks} blocks, d_ff = {cfg.d_ff}; total GRT {total.grt:,} vs dense {total.dense:,} "
                 f"({total.ratio:.3f}×)", fontsize=9)
    fig.suptitle("Parameter accounting: GRT vs a dense transformer of the same widths", weight="bold")
    more = [r.component for r in comps if r.dense == 0 or (r.ratio is not None and r.ratio > 1)]
    less = [r.component for r in comps if r.ratio is not None and r.ratio < 1]
    caption = (f"Parameters per component (summed over all {cfg.n_blocks} blocks) from grt_model.accounting's "
               "closed forms, which its claim checks against the built modules; GRT bars split into angles, "
               "scales, coupling W and other (norm gains, gates, magnitudes). Ratio GRT/dense above each pair of "
               f"bars. GRT costs more in: {', '.join(more)} (every coupled stage of width w stores a w×w coupling "
               f"matrix); less in: {', '.join(less)}. Exact integer counts.")
    return FigureOutput(fig, caption, numbers={r.component: {"grt": r.grt, "dense": r.dense} for r in rows})
