"""The GRT text's remaining figures: storage, one stage's activation, K/V/O per head, the 16-pair overview, the
attention sublayer with the mixer, the FFN around RadialGELU, and the normalize-process-gate-add cycle.

Source: ``../shared/seeds/001_cfb910613b442095.txt`` (its figure list).  ``grt.fig_storage`` is drawn from the
reference configuration's modules (no training, float64 where values are shown); every other figure traces the
corpus sentence of :mod:`figures.model_source` through the trained GRT (the shipped reference model, or
``--checkpoint``) in float32, the dtype it trains in, and its caption names the checkpoint and the tokens it saw.
Recomputations (one stage by hand, the mixer's Jacobian) run in float64 on a copy.

The 3-D pair traces are legible as static images: highlighted pairs over faint context, with 2-D projections
(radius against stage, the (x0, x1) plane) beside the 3-D view; the rotatable versions go to ``index.html``.

Over 500 lines on purpose: one self-contained function per figure of the text's list (no shared state
between them).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from matplotlib.collections import LineCollection
from matplotlib.colors import LogNorm
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from figures.interactive import figure3d, line_trace
from figures.model_source import sentence_trace
from figures.registry import FigureOutput, FigureUnavailable, figure
from figures.style import FADED, HEAD_COLORS, STAGE_GROUP_COLORS, new_figure
from figures.trained_figs import (
    CASCADE_LABELS,
    _caption,
    _draw3d,
    _frame3d,
    _interactive,
    _lit,
    cascade_tracks,
    heads_figure,
    with_stage,
)
from rmsgauge import seed_everything, tolerance

FEATURE_COLORS = ("#6a51a3", "#1f77b4", "#2ca02c", "#d62728")  # f0 energy, f1 x0, f2 x1, f3 signed area
STAGE_SHOWN = 1  # the stage fig_stage_activation opens: stride 2, so the butterfly re-pairs its input


def _head_of_pair(P: int, H: int) -> np.ndarray:
    """``[P]`` head of each adjacent pair of the stream (head h owns coordinates h*d_head .. (h+1)*d_head-1)."""
    return np.arange(P) // (P // H)


# ------------------------------------------------------------------------------------------------ storage


@figure("grt.fig_storage", title="What is stored: dense layer vs phase storage", source="GRT text",
        claims=("grt.param_accounting",), fast=True)
def storage(ctx) -> FigureOutput:
    try:
        from grt_model.config import GRTConfig
        from grt_model.model import GRTBlock
    except ModuleNotFoundError:
        raise FigureUnavailable("grt_model is not in this checkout") from None
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
    fig = new_figure(figsize=(12.0, 4.8))
    gs = fig.add_gridspec(1, 2, width_ratios=(1.5, 1.0))
    ax = fig.add_subplot(gs[0, 0])
    labels = [r[0] for r in dense_rows] + [r[0] for r in grt_rows]
    vals = np.array([r[1] for r in dense_rows] + [r[1] for r in grt_rows], dtype=float)
    cols = ["#9ecae1"] * len(dense_rows) + ["#fdae6b"] * 3 + ["#d94801"] * 2
    y = np.arange(len(labels))[::-1]
    ax.barh(y, vals, color=cols, edgecolor="k", lw=0.5)
    for yi, v in zip(y, vals):
        ax.text(v * 1.15, yi, f"{int(v):,}", va="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=7.5)
    ax.set_xlim(1, vals.max() * 30)
    ax.set_xlabel("numbers stored (log scale)")
    ax.axhline(len(grt_rows) - 0.5, color="k", lw=0.8)
    ax.text(1.3, y[0] + 0.45, "standard layer (one block) + embedding", fontsize=8, weight="bold", va="bottom")
    ax.text(1.3, y[len(dense_rows)] + 0.45, "GRT: each of Q, K, V, O (one block) + phase embedding", fontsize=8,
            weight="bold", va="bottom")
    ax.grid(axis="y", visible=False)
    # one stored weight, sliced out of a freshly initialized Q cascade at the reference size (float64)
    from grt_model.cascade import RotationCascade

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
    ax2.set_xlabel(f"row of W[:, {p}] (feature-major: f0 | f1 | f2 | f3, {P} rows each; black: the self 1×4)")
    ax2.set_ylabel("coupling value (init)")
    ax2.set_title(f"block 0, stage 0, head 0, pair {p}: θ = {theta:+.3f} rad, (s0, s1) = ({s0:.3f}, {s1:.3f}),\n"
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


# ------------------------------------------------------------------------------------------------ one stage


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
    ax.set_yticks([])
    ax.set_xlabel(f"coordinate i of head 0 (d_head = {w})")
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
    ax.set_xlabel("pair slot p")
    ax.set_ylabel("rad")
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
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_aspect("equal")
        ax.set_xlabel("x0")
        ax.set_ylabel("x1")
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
    return FigureOutput(fig, cap, numbers={"provenance": st.tm.provenance, "stage": s, "max_abs_error": err,
                                           "agrees": ok, "mean_abs_nudge": float(nudge.abs().mean())})


# ------------------------------------------------------------------------------------------------ K, V, O heads


@figure("grt.fig_k_heads", title="Each head's K cascade alone, then combined", source="GRT text", trained=True,
        interactive=True)
def k_heads(ctx) -> FigureOutput:
    return heads_figure(ctx, "k")


@figure("grt.fig_v_heads", title="Each head's V cascade alone, then combined", source="GRT text", trained=True,
        interactive=True)
def v_heads(ctx) -> FigureOutput:
    return heads_figure(ctx, "v")


@figure("grt.fig_o_heads", title="Each head's O cascade alone, then combined", source="GRT text", trained=True,
        interactive=True)
def o_heads(ctx) -> FigureOutput:
    return heads_figure(ctx, "o")


# ------------------------------------------------------------------------------------------------ 16 pairs


@figure("grt.fig_pairs_overview", title="16 pairs through Q, K, V, attention and O", source="GRT text",
        trained=True, interactive=True)
def pairs_overview(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    b0 = st.trace.blocks[0]
    tr = {n: cascade_tracks(getattr(b0, n), st.token) for n in "qkvo"}  # (H, P, S+1, 2) each
    H, P, S1, _ = tr["q"].shape
    slots = _lit(P)
    lit = np.zeros((H, P), dtype=bool)
    lit[:, slots] = True
    # stacked z: Q at 0..S, K, V after it, then O, whose stage-0 input is the attention output
    offsets = {n: j * (S1 + 1) for j, n in enumerate("qkvo")}
    fig = new_figure(figsize=(13.0, 6.2))
    gs = fig.add_gridspec(2, 2, width_ratios=(1.35, 1.0))
    ax = fig.add_subplot(gs[:, 0], projection="3d")
    allpts = []
    for n in "qkvo":
        t3 = with_stage(tr[n], z0=offsets[n])  # (H, P, S+1, 3)
        allpts.append(t3.reshape(-1, 3))
        _draw3d(ax, t3[~lit], FADED, lw=0.3, alpha=0.3)
        for h in range(H):
            _draw3d(ax, t3[h, slots], HEAD_COLORS[h % len(HEAD_COLORS)], lw=1.6, alpha=1.0)
    for h in range(H):  # V's output feeds attention, whose output is O's input: dashed links
        v_end = with_stage(tr["v"], z0=offsets["v"])[h, slots, -1]
        o_start = with_stage(tr["o"], z0=offsets["o"])[h, slots, 0]
        for a, b in zip(v_end, o_start):
            ax.plot(*np.c_[a, b], color=HEAD_COLORS[h % len(HEAD_COLORS)], ls="--", lw=0.7)
    _frame3d(ax, np.concatenate(allpts)[None], f"{H * len(slots)} pairs ({len(slots)} per head) lit, "
             f"{H * P - H * len(slots)} faded", zlabel="Q | K | V | attention → O")
    ax.set_zticks([offsets[n] + (S1 - 1) / 2 for n in "qkvo"])
    ax.set_zticklabels(["Q", "K", "V", "O"])
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
                    a2.plot(z, v, color=HEAD_COLORS[h % len(HEAD_COLORS)], lw=1.0, marker="o", ms=1.8)
            a2.axvspan(offsets[n] - 0.5, offsets[n] + S1 - 0.5, color=STAGE_GROUP_COLORS[n], alpha=0.06)
            a2.text(offsets[n] + (S1 - 1) / 2, 1.0, CASCADE_LABELS[n], transform=a2.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=8, weight="bold")
        a2.set_xlim(-0.5, offsets["o"] + S1 - 0.5)
        lo = min(float(v.min()) for v in vals.values())
        hi = max(float(v.max()) for v in vals.values())
        a2.set_ylim(lo - 0.05 * abs(hi - lo), hi + 0.05 * abs(hi - lo))
        a2.set_ylabel(ylabel)
        a2.set_xlabel("stacked stage (O's stage 0 is the attention output)")
    fig.suptitle("16 pairs through Q, K, V, attention and O (block 0), in their head colours", weight="bold")

    def build():
        traces = []
        for n in "qkvo":
            t3 = with_stage(tr[n], z0=offsets[n])
            traces.append(line_trace(t3[~lit], name=f"{CASCADE_LABELS[n]}: other pairs", color=FADED, width=1,
                                     opacity=0.3))
            traces += [line_trace(t3[h, slots], name=f"{CASCADE_LABELS[n]} head {h}",
                                  color=HEAD_COLORS[h % len(HEAD_COLORS)], width=5, markers=True) for h in range(H)]
        return figure3d(traces, title="16 pairs through Q, K, V, attention and O", z_title="Q | K | V | O")

    inter, note = _interactive(build)
    cap = _caption(st, f"The attention sublayer distilled: {len(slots)} pair slots per head ({list(slots)}; "
                       f"{H * len(slots)} in all) carried through block 0's Q, K and V cascades, attention, and the O "
                       f"cascade, stacked upward ({S1 - 1} stages each; O's stage 0 is the attention output for that "
                       f"slot, dashed from V), in their head colours over the other {H * P - H * len(slots)} pairs "
                       "faint. Right: the same lit pairs' radius and phase against the stacked stage, so the static "
                       "image reads without rotation; the rotatable view is in index.html.") + note
    return FigureOutput(fig, cap, interactive=inter, numbers={"provenance": st.tm.provenance,
                                                               "slots": [int(v) for v in slots]})


# ------------------------------------------------------------------------------------------------ attention + mixer


@figure("grt.fig_attention_mixer_sublayer", title="The attention sublayer, the residual add, and the mixer",
        source="GRT text", claims=("grt.mixer_crosses_heads",), trained=True)
def attention_mixer_sublayer(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    b0 = st.trace.blocks[0]
    blk = st.tm.model.blocks[0]
    t = st.token
    g = b0.gates
    H = b0.q.acts.shape[-2]
    steps = [("block input x", b0.stream_in), (f"write g_attn·O (g = {g['attn']:.2f})", b0.after_attn - b0.stream_in),
             ("x + g_attn·O", b0.after_attn), (f"write g_mix·M (g = {g['mixer']:.2f})", b0.after_mixer - b0.after_attn),
             ("x + g_attn·O + g_mix·M", b0.after_mixer)]
    pts = [v[0, t].double().numpy().reshape(-1, 2) for _, v in steps]  # each (P, 2) adjacent pairs
    P = pts[0].shape[0]
    heads = _head_of_pair(P, H)
    # the mixer's Jacobian at this token (float64 copy): how strongly each head's output reads each head's input
    mix = copy.deepcopy(blk.mixer.cascade).double()
    z = b0.mixer_in[0, t].double()
    J = torch.func.jacrev(lambda v: mix(v.unsqueeze(0)).squeeze(0))(z)  # (D, D)
    dh = J.shape[0] // H
    cross = torch.linalg.matrix_norm(J.view(H, dh, H, dh).permute(0, 2, 1, 3)).numpy()  # (H_out, H_in) Frobenius
    fig = new_figure(figsize=(14.0, 3.6))
    gs = fig.add_gridspec(1, len(steps) + 1)
    lim = max(float(np.abs(p).max()) for p in pts) * 1.08
    for k, ((title, _), p) in enumerate(zip(steps, pts)):
        ax = fig.add_subplot(gs[0, k])
        ax.scatter(p[:, 0], p[:, 1], s=9, c=[HEAD_COLORS[h % len(HEAD_COLORS)] for h in heads])
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_aspect("equal")
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("x0")
        if k == 0:
            ax.set_ylabel("x1")
    ax = fig.add_subplot(gs[0, -1])
    im = ax.imshow(cross, cmap="viridis", norm=LogNorm(vmin=max(float(cross[cross > 0].min()), 1e-12),
                                                       vmax=float(cross.max())), interpolation="nearest")
    ax.set_xlabel("input head")
    ax.set_ylabel("output head")
    ax.set_xticks(range(H))
    ax.set_yticks(range(H))
    ax.grid(False)
    ax.set_title("mixer: ‖∂M_out/∂z_in‖_F per head pair", fontsize=8)
    fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle("Attention sublayer: residual add of O, then the mixer's one stage across all heads (block 0)",
                 weight="bold")
    off = cross[~np.eye(H, dtype=bool)]
    cap = _caption(st, f"The traced token's {P} residual-stream pairs (adjacent pairing, coloured by the head that "
                       "owns them) at each step of block 0's first two normalize-process-gate-add cycles: the block "
                       "input, the gated O write, the stream after the residual add, the gated mixer write, and the "
                       "stream after it. Right: the Frobenius norm of each head-to-head block of the mixer's "
                       "Jacobian at this token (float64): off-diagonal blocks are non-zero (smallest "
                       f"{off.min():.2e}, largest {off.max():.2e}; diagonal {np.diag(cross).min():.2e} .. "
                       f"{np.diag(cross).max():.2e}), so what one head wrote reaches the others through the mixer's "
                       "coupling (its stride-1 stage never pairs across heads).")
    return FigureOutput(fig, cap, numbers={"provenance": st.tm.provenance, "cross_head_norms": cross.tolist(),
                                           "gates": dict(g)})


# ------------------------------------------------------------------------------------------------ FFN


@figure("grt.fig_ffn_radial_gelu", title="FFN: expand, RadialGELU, contract", source="GRT text", trained=True)
def ffn_radial_gelu(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    b0 = st.trace.blocks[0]
    t = st.token
    ex, co = b0.ffn_expand, b0.ffn_contract
    D = b0.ffn_in.shape[-1]
    rex = np.stack([np.hypot(*np.moveaxis(ex.pairs(i)[0, t, 0].double().numpy(), -1, 0))
                    for i in range(ex.n_stages + 1)])  # (S+1, P_ff)
    rco = np.stack([np.hypot(*np.moveaxis(co.pairs(i)[0, t, 0].double().numpy(), -1, 0))
                    for i in range(co.n_stages + 1)])
    Pff = rex.shape[1]
    h_in = ex.acts[-1][0, t, 0].double().numpy().reshape(-1, 2)  # (P_ff, 2) RadialGELU's input, adjacent pairs
    h_out = b0.gelu_out[0, t].double().numpy().reshape(-1, 2)
    r_in, r_out = np.hypot(h_in[:, 0], h_in[:, 1]), np.hypot(h_out[:, 0], h_out[:, 1])
    live = r_in > 0
    dphi = np.angle(np.exp(1j * (np.arctan2(h_out[live, 1], h_out[live, 0]) - np.arctan2(h_in[live, 1],
                                                                                         h_in[live, 0]))))
    tiny = tolerance(torch.float32, size=2 * Pff, depth=ex.n_stages).bound(float(r_in.max()))
    filled = (rex > tiny).mean(1)  # (S+1,) fraction of pairs carrying signal
    fig = new_figure(figsize=(13.0, 7.0))
    gs = fig.add_gridspec(2, 3, height_ratios=(1.0, 1.0))
    top = gs[0, :].subgridspec(1, 2)
    vmax = max(float(rex.max()), float(rco.max()))
    vmin = max(min(float(rex[rex > tiny].min()), float(rco[rco > tiny].min())), tiny)
    for k, (rr, name) in enumerate(((rex, "expand"), (rco, "contract"))):
        ax = fig.add_subplot(top[0, k])
        im = ax.imshow(np.where(rr > tiny, rr, np.nan), aspect="auto", cmap="magma", interpolation="nearest",
                       norm=LogNorm(vmin=vmin, vmax=vmax))
        ax.set_xlabel(f"pair slot (of {Pff}; each stage's own pairing)")
        ax.set_ylabel("stage (0 = input)")
        ax.set_title(f"FFN {name}: pair radius per stage (blank: exactly empty)", fontsize=9)
        ax.grid(False)
        fig.colorbar(im, ax=ax, shrink=0.85)
    ax = fig.add_subplot(gs[1, 0])
    ax.plot(range(ex.n_stages + 1), filled, marker="o")
    ax.set_xlabel("expand stage")
    ax.set_ylabel("fraction of pairs carrying signal")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"the {Pff - D // 2} empty pairs fill up", fontsize=9)
    ax = fig.add_subplot(gs[1, 1])
    rr = np.linspace(0, float(r_in.max()) * 1.05, 200)
    phi_cdf = 0.5 * (1 + np.vectorize(math.erf)(rr / math.sqrt(2)))
    ax.plot(rr, rr * phi_cdf, color="k", lw=1, label="GELU(r) = r Φ(r)")
    ax.plot(rr, rr, color=FADED, ls="--", lw=1, label="identity")
    ax.scatter(r_in, r_out, s=6, color="#8c564b", label="pairs of this token")
    ax.set_xlabel("radius in")
    ax.set_ylabel("radius out")
    ax.legend(fontsize=7)
    ax.set_title("RadialGELU: each pair's radius gated", fontsize=9)
    ax = fig.add_subplot(gs[1, 2])
    ax.hist(dphi, bins=31, color="#8c564b")
    ax.set_xlabel("angle out − angle in (rad)")
    ax.set_title(f"... its angle kept: max |Δφ| = {np.abs(dphi).max():.1e}", fontsize=9)
    fig.suptitle(f"The FFN of block 0: expand ({ex.n_stages} stages) → RadialGELU → contract ({co.n_stages} stages), "
                 f"keep the first {D} coordinates", weight="bold")
    cap = _caption(st, f"Block 0's FFN for the traced token. Top: every pair's radius through the expand cascade "
                       f"(the {D}-wide normalized input zero-padded to {2 * Pff}: {D // 2} of {Pff} pairs carry "
                       f"signal at stage 0) and the contract cascade, log colour; blank cells are exactly empty. "
                       f"Bottom left: the fraction of pairs carrying signal (radius above the float32 round-off "
                       f"{tiny:.1e}) per expand stage: {filled[0]:.2f} at the input, {filled[-1]:.2f} after the last "
                       f"stage. Bottom middle: RadialGELU maps each radius r to rΦ(r) (the only nonlinearity of the "
                       f"FFN); right: the angle change it makes, zero up to round-off ({np.abs(dphi).max():.1e} rad). "
                       f"The contract's output keeps its first {D} coordinates.")
    return FigureOutput(fig, cap, numbers={"provenance": st.tm.provenance, "filled": filled.tolist(),
                                           "max_angle_change": float(np.abs(dphi).max())})


# ------------------------------------------------------------------------------------------------ block cycle


@figure("grt.fig_block_cycle", title="Normalize, process, gate, add: every cycle of every block", source="GRT text",
        claims=("grt.stage_counts",), trained=True)
def block_cycle(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    blocks = st.trace.blocks
    nb = len(blocks)

    def rms(x: torch.Tensor) -> float:  # mean over the sentence of each token's RMS
        return float(x[0].double().pow(2).mean(-1).sqrt().mean())

    rows = []  # (label, stream before, normalized copy, processed, gate, write, stream after)
    for b, bt in enumerate(blocks):
        cyc = (("attn", bt.stream_in, bt.attn_in, bt.after_attn), ("mixer", bt.after_attn, bt.mixer_in, bt.after_mixer),
               ("ffn", bt.after_mixer, bt.ffn_in, bt.stream_out))
        for name, before, normed, after in cyc:
            write = after - before
            g = bt.gates[name]
            rows.append((f"{b}.{name}", rms(before), rms(normed), rms(write) / g, g, rms(write), rms(after)))
    n = len(rows)
    fig = new_figure(figsize=(max(9.0, 1.1 * n + 3.0), 6.2))
    gs = fig.add_gridspec(2, 1, height_ratios=(0.8, 2.2))
    ax = fig.add_subplot(gs[0, 0])
    ax.set_axis_off()
    steps = ("stream x", "PearlNorm\n(a copy)", "process\n(attention | mixer | FFN)", "gate g ∈ (0, 1)",
             "add:\nx + g·f")
    for i, label in enumerate(steps):
        ax.add_patch(FancyBboxPatch((i * 1.25, 0.15), 1.0, 0.7, boxstyle="round,pad=0.03", fc="#f0f0f0", ec="k"))
        ax.text(i * 1.25 + 0.5, 0.5, label, ha="center", va="center", fontsize=8)
        if i:
            ax.add_patch(FancyArrowPatch(((i - 1) * 1.25 + 1.0, 0.5), (i * 1.25, 0.5), arrowstyle="->",
                                         mutation_scale=10))
    # a shallow arc: the residual path must stay inside this panel, above the bar chart
    ax.add_patch(FancyArrowPatch((0.5, 0.15), (4 * 1.25 + 0.5, 0.15), connectionstyle="arc3,rad=0.06",
                                 arrowstyle="->", mutation_scale=10, ls="--"))
    ax.text(2.75, -0.08, "the raw stream passes straight to the add (residual)", ha="center", va="top", fontsize=7)
    ax.text(6.6, 0.5, f"× 3 per block (attention, mixer, FFN)\n× {nb} blocks = {3 * nb} cycles here\n"
            "(the text: × 12 = 36)", fontsize=8, va="center")
    ax.set_xlim(-0.1, 8.6)
    ax.set_ylim(-0.4, 1.0)
    ax = fig.add_subplot(gs[1, 0])
    x = np.arange(n)
    arr = np.array([r[1:] for r in rows])  # (n, 6)
    wdt = 0.2
    ax.bar(x - 1.5 * wdt, arr[:, 1], width=wdt, color="#9ecae1", label="RMS of the normalized copy")
    ax.bar(x - 0.5 * wdt, arr[:, 2], width=wdt, color="#fdae6b", label="RMS of the processed copy f")
    ax.bar(x + 0.5 * wdt, arr[:, 4], width=wdt, color="#d94801", label="RMS of the gated write g·f")
    ax.plot(np.r_[x - 0.5, x[-1] + 0.5], np.r_[arr[0, 0], arr[:, 5]], color="k", marker="o", ms=3,
            label="RMS of the stream (before the first cycle, then after each add)")
    for xi, r in zip(x, rows):
        ax.text(xi + 0.5 * wdt, r[5] * 1.02, f"g={r[4]:.2f}", fontsize=7, ha="center", va="bottom")
    ax.set_xticks(x)
    ax.set_xticklabels([r[0].replace(".", "\n") for r in rows])
    ax.set_xlabel("block / sublayer (cycle)")
    ax.set_ylabel("RMS per token (mean over the sentence)")
    ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Normalize a copy, process, gate, add: the cycle every sublayer runs", weight="bold")
    cap = _caption(st, f"Top: the four-step cycle the text describes (PearlNorm normalizes a copy of the stream, the "
                       f"sublayer processes it, a learned gate scales the result, the residual add accumulates it), "
                       f"run three times per block; this model has {nb} blocks ({3 * nb} cycles; the text's has 12, "
                       "36 cycles). Bottom, for every cycle in order: the RMS of the normalized copy, of the "
                       "sublayer's output, of the gated write, and (line) of the stream after each add, each the mean "
                       "over the sentence's tokens of a token's RMS; gate values above the bars. Stream RMS from "
                       f"{arr[0, 0]:.3f} (the embedding) to {arr[-1, 5]:.3f} after the last cycle.")
    return FigureOutput(fig, cap, numbers={"provenance": st.tm.provenance,
                                           "cycles": [dict(zip(("cycle", "stream_before", "normalized", "processed",
                                                                "gate", "write", "stream_after"), r)) for r in rows]})
