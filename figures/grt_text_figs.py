"""The GRT text's figures of storage, one stage's activation, K/V/O per head and the 16-pair overview.

``grt.fig_storage`` is drawn from the reference configuration's modules (no training, float64 values); the others
trace the corpus sentence of :mod:`figures.model_source` through the trained GRT in float32 (one stage is recomputed
by hand in float64 on a copy).  Pair traces are highlighted pairs over faint context with 2-D projections beside the
3-D view; the rotatable versions go to ``index.html``.
"""

from __future__ import annotations

import copy
import math
from functools import partial

import numpy as np
import torch
from matplotlib.collections import LineCollection

from figures.interactive import figure3d, line_trace
from figures.model_source import sentence_trace
from figures.registry import FigureOutput, figure
from figures.style import FADED, HEAD_COLORS, STAGE_GROUP_COLORS, head_color, new_figure
from figures.trained_figs import (
    CASCADE_LABELS,
    _caption,
    _draw3d,
    _frame3d,
    _lit,
    _output,
    cascade_tracks,
    heads_figure,
    lit_mask,
    with_stage,
)
from rmsgauge import seed_everything, tolerance

FEATURE_COLORS = ("#6a51a3", "#1f77b4", "#2ca02c", "#d62728")  # f0 energy, f1 x0, f2 x1, f3 signed area
STAGE_SHOWN = 1  # the stage fig_stage_activation opens: stride 2, so the butterfly re-pairs its input


@figure("grt.fig_storage", title="What is stored: dense layer vs phase storage", source="GRT text",
        claims=("grt.param_accounting",), fast=True)
def storage(ctx) -> FigureOutput:
    from grt_model.cascade import RotationCascade
    from grt_model.config import GRTConfig
    from grt_model.model import GRTBlock

    cfg = GRTConfig()  # the text's reference config: V 50,000, d 256, 4 heads, d_ff 1024
    V, D, H, dh = cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.d_head
    blk = GRTBlock(cfg, device="meta")  # shapes only, no memory
    q = blk.attn.qkv  # heads 0..H-1 of it are Q
    dense_rows = [(f"W_{n}  [{D}, {D}]", D * D) for n in "QKVO"] + [(f"embedding  [{V:,}, {D}]", V * D)]
    grt_rows = [
        (f"angles θ  [{H}, {cfg.qkvo_stages}, {dh // 2}]", q.angles[:H].numel()),
        (f"scales (s0, s1)  [{H}, {cfg.qkvo_stages}, {dh // 2}, 2]", q.raw_scales[:H].numel()),
        (f"coupling W  [{H}, {cfg.qkvo_stages}, {2 * dh}, {dh // 2}]", q.coupling[:H].numel()),
        (f"phases θ  [{V:,}, {cfg.pairs}]", V * cfg.pairs),
        (f"magnitude r  [{V:,}]", V),
    ]
    fig = new_figure(figsize=(12.0, 5.2))
    gs = fig.add_gridspec(1, 2, width_ratios=(1.4, 1.0))
    ax = fig.add_subplot(gs[0, 0])
    labels = [r[0] for r in dense_rows] + [r[0] for r in grt_rows]
    vals = np.array([r[1] for r in dense_rows] + [r[1] for r in grt_rows], dtype=float)
    cols = ["#9ecae1"] * len(dense_rows) + ["#fdae6b"] * 3 + ["#d94801"] * 2
    # bars top to bottom, one empty row between the groups: each group's heading sits in a gap of its own
    gap = 1.0
    y = np.concatenate([np.arange(len(dense_rows))[::-1] + len(grt_rows) + gap, np.arange(len(grt_rows))[::-1]])
    ax.barh(y, vals, color=cols, edgecolor="k", lw=0.5)
    for yi, v in zip(y, vals):
        ax.text(v * 1.15, yi, f"{int(v):,}", va="center", fontsize=7)
    ax.set_yticks(y, labels, fontsize=7.5)
    ax.set(xscale="log", xlim=(1, vals.max() * 30), ylim=(-0.6, y[0] + 1.1), xlabel="numbers stored (log scale)")
    ax.axhline(len(grt_rows) - 0.5 + gap, color="k", lw=0.8)
    ax.text(1.3, y[0] + 0.5, "standard layer (one block) + embedding", fontsize=8, weight="bold", va="bottom")
    ax.text(1.3, y[len(dense_rows)] + 0.5, "GRT: each of Q, K, V, O (one block) + phase embedding", fontsize=8,
            weight="bold", va="bottom")
    ax.grid(axis="y", visible=False)
    # one stored weight, sliced out of a freshly initialized Q cascade at the reference size (float64)
    seed_everything(ctx.seed)
    c = RotationCascade(dh, cfg.qkvo_stages, coupling=True, heads=H, dtype=torch.float64)
    p = 5
    c.requires_grad_(False)  # a drawing, not training
    theta = float(c.angles[0, 0, p])
    s0, s1 = (float(v) for v in c.scales()[0, 0, p])
    col = c.coupling[0, 0, :, p].numpy()  # (4P,)
    ax2 = fig.add_subplot(gs[0, 1])
    P = dh // 2
    ax2.bar(np.arange(4 * P), col, color=np.repeat(FEATURE_COLORS, P), width=1.0)
    for b in range(4):
        ax2.bar([b * P + p], [col[b * P + p]], color="k", width=1.0)
    ax2.set(xlabel=f"row of W[:, {p}], feature-major: f0 | f1 | f2 | f3\n({P} rows each; black: the self 1×4)",
            ylabel="coupling value (init)")
    ax2.set_title(f"block 0, stage 0, head 0, pair {p}:\nθ = {theta:+.3f} rad, (s0, s1) = ({s0:.3f}, {s1:.3f}),\n"
                  f"and its coupling column W[:, {p}] ({4 * P} numbers)", fontsize=8.5)
    fig.suptitle("Storage half: what a dense layer keeps vs what GRT keeps", weight="bold")
    per_proj = sum(r[1] for r in grt_rows[:3])
    cap = (f"Reference config (V = {V:,}, d = {D}, {H} heads of {dh}, {cfg.qkvo_stages} stages). Left: numbers "
           f"stored by a standard block's four dense {D}×{D} projections ({D * D:,} each) and a [{V:,}, {D}] "
           f"embedding ({V * D:,}), against GRT's per-projection angle, scale and coupling tensors ({per_proj:,} "
           f"per projection, read from the modules built on the meta device) and its phase embedding "
           f"({V * cfg.pairs + V:,} = (P+1)/d of dense). Right: slicing block 0, stage 0, head 0 down to one pair's "
           f"stored weight: a phase θ, a scale pair (softplus-positive) and one column of the coupling W, whose "
           f"self 1×4 (rows p, P+p, 2P+p, 3P+p) is black. Values are a float64 initialization (seed {ctx.seed}), "
           "not trained weights: this figure is about what is stored.")
    return FigureOutput(fig, cap, numbers={"dense_per_projection": D * D, "grt_per_projection": per_proj,
                                           "embedding_dense": V * D, "embedding_grt": V * cfg.pairs + V})


@figure("grt.fig_stage_activation", title="One stage: shuffle, features, nudge, rotate, scale", source="GRT text",
        trained=True)
def stage_activation(ctx) -> FigureOutput:
    from grt_model.butterfly import butterfly_pairs, stage_stride, to_pairs
    from grt_model.cascade import clifford_features

    st = sentence_trace(ctx)
    m = st.tm.model
    casc = copy.deepcopy(m.blocks[0].attn.qkv).double()  # head 0 of the Q/K/V cascade is Q of head 0
    q = st.trace.blocks[0].q
    s = min(STAGE_SHOWN, q.n_stages - 1)
    w = casc.width
    P = w // 2
    h = stage_stride(w, casc.first_stage + s)
    x = q.acts[s][0, st.token, 0].double()  # (w,) stage s's input, head 0
    x0, x1 = to_pairs(x, h)  # (P,) each: the shuffle is this re-pairing
    F = clifford_features(x0, x1)  # (4P,)
    W = casc.coupling[0, s].detach()  # (4P, P)
    nudge = torch.tanh(F @ W)  # (P,)
    base = casc.angles[0, s].detach()  # (P,)
    th = base + nudge
    r0 = torch.cos(th) * x0 - torch.sin(th) * x1
    r1 = torch.sin(th) * x0 + torch.cos(th) * x1
    sc = casc.scales()[0, s].detach()  # (P, 2)
    y0, y1 = r0 * sc[:, 0], r1 * sc[:, 1]
    ref0, ref1 = to_pairs(q.acts[s + 1][0, st.token, 0].double(), h)
    err = float(torch.maximum((y0 - ref0).abs().max(), (y1 - ref1).abs().max()))
    tol = tolerance(torch.float32, size=4 * P, depth=s + 2)  # the traced acts are float32
    ok = tol.holds(err, float(torch.hypot(ref0, ref1).max()))

    fig = new_figure(figsize=(13.0, 7.0))
    gs = fig.add_gridspec(2, 3)
    ax = fig.add_subplot(gs[0, 0])
    pairs = butterfly_pairs(w, casc.first_stage + s)
    for pi, (i0, i1) in enumerate(pairs):
        ax.plot([i0, i1], [pi % h * 0.15, pi % h * 0.15], color=HEAD_COLORS[pi % 4], lw=1.2)
        ax.scatter([i0, i1], [pi % h * 0.15] * 2, s=8, color=HEAD_COLORS[pi % 4], zorder=3)
    ax.set(yticks=[], xlabel=f"coordinate i of head 0 (d_head = {w})")
    ax.set_title(f"1. shuffle: stage {s} pairs i with i + {h} (butterfly stride {h})", fontsize=9)
    ax.grid(False)
    ax = fig.add_subplot(gs[0, 1])
    ax.bar(np.arange(4 * P), F.numpy(), color=np.repeat(FEATURE_COLORS, P), width=1.0)
    for b, n in enumerate(("f0 energy/m", "f1 x0/√m", "f2 x1/√m", "f3 area/m")):
        ax.text(b * P + P / 2, float(F.max()) * 1.05, n, ha="center", fontsize=7, color=FEATURE_COLORS[b])
    ax.set_xlabel("feature row (feature-major)")
    ax.set_title("2. features: four Clifford features per pair, normalized", fontsize=9)
    ax = fig.add_subplot(gs[0, 2])
    idx = np.arange(P)
    ax.bar(idx, nudge.numpy(), color="#9467bd", label="nudge Δθ = tanh(F·W)")
    ax.scatter(idx, ((base + math.pi) % (2 * math.pi) - math.pi).numpy(), s=10, color="k", label="base θ (wrapped)")
    ax.set(xlabel="pair slot p", ylabel="rad")
    ax.legend(fontsize=7)
    ax.set_title("3. nudge: θ_used = θ + Δθ", fontsize=9)
    lim = float(torch.stack((x0, x1, r0, r1, y0, y1)).abs().max()) * 1.1
    for k, (a0, a1, b0, b1, title) in enumerate(((x0, x1, r0, r1, "4. rotate: each pair turned by θ_used"),
                                                  (r0, r1, y0, y1, "5. scale: x0 by s0, x1 by s1"))):
        ax = fig.add_subplot(gs[1, k])
        ax.add_collection(LineCollection(np.stack((np.c_[a0, a1], np.c_[b0, b1]), axis=1), colors=FADED,
                                         linewidths=0.8))
        ax.scatter(a0, a1, s=12, color="#1f77b4", label="before")
        ax.scatter(b0, b1, s=12, color="#d62728", marker="s", label="after")
        ax.set(xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal", xlabel="x0", ylabel="x1")
        ax.legend(fontsize=7)
        ax.set_title(title, fontsize=9)
    ax = fig.add_subplot(gs[1, 2])
    ax.hist(np.log(sc.numpy().ravel()), bins=24, color="#8c564b")
    ax.set_xlabel("log scale (log s0, log s1) of this stage's pairs")
    ax.set_title(f"the stage's learned scales: {float(sc.min()):.3f} .. {float(sc.max()):.3f}", fontsize=9)
    fig.suptitle(f"One stage of block 0's Q cascade, head 0, stage {s}: shuffle → features → nudge → rotate → scale",
                 weight="bold")
    cap = _caption(st, f"The activation half of one stored weight. Head 0's Q input to stage {s} for the traced "
                       f"token is re-paired by the butterfly (stride {h}); the coupling reads the four normalized "
                       f"Clifford features of all {P} pairs and nudges each base angle by tanh(F·W); each pair is "
                       f"rotated by θ + Δθ, then x0 and x1 are stretched by the pair's softplus scales. Recomputed by "
                       f"hand in float64 from the stored parameters: matches the model's own stage output to "
                       f"{err:.2g} ({'within' if ok else 'OUTSIDE'} the float32 tolerance {tol.bound(1.0):.2g}, "
                       f"relative). Mean |Δθ| = {float(nudge.abs().mean()):.3f} rad.")
    return _output(st, fig, cap, stage=s, max_abs_error=err, agrees=ok, mean_abs_nudge=float(nudge.abs().mean()))


for _cascade in "kvo":  # grt.fig_k_heads, grt.fig_v_heads, grt.fig_o_heads: grt.fig_q_heads for K, V and O
    figure(f"grt.fig_{_cascade}_heads", title=f"Each head's {_cascade.upper()} cascade alone, then combined",
           source="GRT text", trained=True, interactive=True)(partial(heads_figure, name=_cascade))


@figure("grt.fig_pairs_overview", title="16 pairs through Q, K, V, attention and O", source="GRT text",
        trained=True, interactive=True)
def pairs_overview(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    b0 = st.trace.blocks[0]
    tr = {n: cascade_tracks(getattr(b0, n), st.token) for n in "qkvo"}  # (H, P, S+1, 2) each
    H, P, S1, _ = tr["q"].shape
    slots, lit = _lit(P), lit_mask(H, P)
    # stacked z: Q at 0..S, K, V after it, then O, whose stage-0 input is the attention output
    offsets = {n: j * (S1 + 1) for j, n in enumerate("qkvo")}
    fig = new_figure(figsize=(13.0, 6.2))
    gs = fig.add_gridspec(2, 2, width_ratios=(1.35, 1.0))
    ax = fig.add_subplot(gs[:, 0], projection="3d")
    t3 = {n: with_stage(tr[n], z0=offsets[n]) for n in "qkvo"}  # (H, P, S+1, 3) each
    for t in t3.values():
        _draw3d(ax, t[~lit], FADED, lw=0.3, alpha=0.3)
        for h in range(H):
            _draw3d(ax, t[h, slots], head_color(h), lw=1.6, alpha=1.0)
    for h in range(H):  # V's output feeds attention, whose output is O's input: dashed links
        for a, b in zip(t3["v"][h, slots, -1], t3["o"][h, slots, 0]):
            ax.plot(*np.c_[a, b], color=head_color(h), ls="--", lw=0.7)
    _frame3d(ax, np.concatenate([t.reshape(-1, 3) for t in t3.values()])[None], f"{H * len(slots)} pairs "
             f"({len(slots)} per head) lit, {H * P - H * len(slots)} faded", zlabel="Q | K | V | attention → O")
    ax.set_zticks([offsets[n] + (S1 - 1) / 2 for n in "qkvo"], ["Q", "K", "V", "O"])
    r = {n: np.hypot(tr[n][..., 0], tr[n][..., 1]) for n in "qkvo"}  # (H, P, S+1)
    phi = {n: np.arctan2(tr[n][..., 1], tr[n][..., 0]) for n in "qkvo"}
    for row, (vals, ylabel) in enumerate(((r, "pair radius"), (phi, "pair phase φ (rad)"))):
        a2 = fig.add_subplot(gs[row, 1])
        for n in "qkvo":
            z = offsets[n] + np.arange(S1)
            a2.add_collection(LineCollection([np.c_[z, v] for v in vals[n][~lit]], colors=FADED, linewidths=0.3,
                                             alpha=0.35))
            for h in range(H):
                for v in vals[n][h, slots]:
                    a2.plot(z, v, color=head_color(h), lw=1.0, marker="o", ms=1.8)
            a2.axvspan(offsets[n] - 0.5, offsets[n] + S1 - 0.5, color=STAGE_GROUP_COLORS[n], alpha=0.06)
            a2.text(offsets[n] + (S1 - 1) / 2, 1.0, CASCADE_LABELS[n], transform=a2.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=8, weight="bold")
        a2.set_xlim(-0.5, offsets["o"] + S1 - 0.5)
        lo = min(float(v.min()) for v in vals.values())
        hi = max(float(v.max()) for v in vals.values())
        a2.set(ylim=(lo - 0.05 * abs(hi - lo), hi + 0.05 * abs(hi - lo)), ylabel=ylabel,
               xlabel="stacked stage (O's stage 0 is the attention output)")
    fig.suptitle("16 pairs through Q, K, V, attention and O (block 0), in their head colours", weight="bold")
    traces = []
    for n, t in t3.items():
        traces.append(line_trace(t[~lit], name=f"{CASCADE_LABELS[n]}: other pairs", color=FADED, width=1, opacity=0.3))
        traces += [line_trace(t[h, slots], name=f"{CASCADE_LABELS[n]} head {h}", color=head_color(h), width=5,
                              markers=True) for h in range(H)]
    inter = figure3d(traces, title="16 pairs through Q, K, V, attention and O", z_title="Q | K | V | O")
    cap = _caption(st, f"The attention sublayer distilled: {len(slots)} pair slots per head ({list(slots)}; "
                       f"{H * len(slots)} in all) carried through block 0's Q, K and V cascades, attention, and the O "
                       f"cascade, stacked upward ({S1 - 1} stages each; O's stage 0 is the attention output for that "
                       f"slot, dashed from V), in their head colours over the other {H * P - H * len(slots)} pairs "
                       "faint. Right: the same lit pairs' radius and phase against the stacked stage, so the static "
                       "image reads without rotation; the rotatable view is in index.html.")
    return _output(st, fig, cap, inter, slots=[int(v) for v in slots])
