"""The GRT text's sublayer figures: attention with the residual add and the mixer, the FFN around RadialGELU, and
the normalize-process-gate-add cycle, following the traced sentence's residual stream (float32; the mixer's Jacobian
in float64 on a copy).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from matplotlib.colors import LogNorm
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from figures.model_source import sentence_trace
from figures.registry import FigureOutput, figure
from figures.style import FADED, head_color, new_figure
from figures.trained_figs import _caption, _output
from rmsgauge import tolerance


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
    heads = np.arange(P) // (P // H)  # (P,) the head owning each adjacent pair (coordinates h*d_head ..)
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
        ax.scatter(p[:, 0], p[:, 1], s=9, c=[head_color(h) for h in heads])
        ax.set(xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal", xlabel="x0", ylabel="x1" if k == 0 else "")
        ax.set_title(title, fontsize=8)
    ax = fig.add_subplot(gs[0, -1])
    im = ax.imshow(cross, cmap="viridis", norm=LogNorm(vmin=max(float(cross[cross > 0].min()), 1e-12),
                                                       vmax=float(cross.max())), interpolation="nearest")
    ax.set(xlabel="input head", ylabel="output head", xticks=range(H), yticks=range(H))
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
    return _output(st, fig, cap, cross_head_norms=cross.tolist(), gates=dict(g))


@figure("grt.fig_ffn_radial_gelu", title="FFN: expand, RadialGELU, contract", source="GRT text", trained=True)
def ffn_radial_gelu(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    b0 = st.trace.blocks[0]
    t = st.token
    ex, co = b0.ffn_expand, b0.ffn_contract
    D = b0.ffn_in.shape[-1]
    rex, rco = (np.stack([np.hypot(*np.moveaxis(c.pairs(i)[0, t, 0].double().numpy(), -1, 0))
                          for i in range(c.n_stages + 1)]) for c in (ex, co))  # (S+1, P_ff) each
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
        ax.set(xlabel=f"pair slot (of {Pff}; each stage's own pairing)", ylabel="stage (0 = input)")
        ax.set_title(f"FFN {name}: pair radius per stage (blank: exactly empty)", fontsize=9)
        ax.grid(False)
        fig.colorbar(im, ax=ax, shrink=0.85)
    ax = fig.add_subplot(gs[1, 0])
    ax.plot(range(ex.n_stages + 1), filled, marker="o")
    ax.set(xlabel="expand stage", ylabel="fraction of pairs carrying signal", ylim=(0, 1.05))
    ax.set_title(f"the {Pff - D // 2} empty pairs fill up", fontsize=9)
    ax = fig.add_subplot(gs[1, 1])
    rr = np.linspace(0, float(r_in.max()) * 1.05, 200)
    phi_cdf = 0.5 * (1 + np.vectorize(math.erf)(rr / math.sqrt(2)))
    ax.plot(rr, rr * phi_cdf, color="k", lw=1, label="GELU(r) = r Φ(r)")
    ax.plot(rr, rr, color=FADED, ls="--", lw=1, label="identity")
    ax.scatter(r_in, r_out, s=6, color="#8c564b", label="pairs of this token")
    ax.set(xlabel="radius in", ylabel="radius out")
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
    return _output(st, fig, cap, filled=filled.tolist(), max_angle_change=float(np.abs(dphi).max()))


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
    ax.set(xlim=(-0.1, 8.6), ylim=(-0.4, 1.0))
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
    ax.set(xticks=x, xticklabels=[r[0].replace(".", "\n") for r in rows], xlabel="block / sublayer (cycle)",
           ylabel="RMS per token (mean over the sentence)")
    ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Normalize a copy, process, gate, add: the cycle every sublayer runs", weight="bold")
    cap = _caption(st, f"Top: the four-step cycle the text describes (PearlNorm normalizes a copy of the stream, the "
                       f"sublayer processes it, a learned gate scales the result, the residual add accumulates it), "
                       f"run three times per block; this model has {nb} blocks ({3 * nb} cycles; the text's has 12, "
                       "36 cycles). Bottom, for every cycle in order: the RMS of the normalized copy, of the "
                       "sublayer's output, of the gated write, and (line) of the stream after each add, each the mean "
                       "over the sentence's tokens of a token's RMS; gate values above the bars. Stream RMS from "
                       f"{arr[0, 0]:.3f} (the embedding) to {arr[-1, 5]:.3f} after the last cycle.")
    keys = ("cycle", "stream_before", "normalized", "processed", "gate", "write", "stream_after")
    return _output(st, fig, cap, cycles=[dict(zip(keys, r)) for r in rows])
