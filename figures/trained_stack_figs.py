"""Trained-model figures that read every block at once: attention weights per head, the Q–K angle gap of every pair,
the learned residual gates, and the ring radius with the pair-radius spread (evidence for ``grt.trained_gates`` and
``grt.trained_ring_radius``).
"""

from __future__ import annotations

import numpy as np
import torch
from matplotlib.collections import LineCollection
from matplotlib.colors import PowerNorm

from figures.model_source import TRACE_WORD, sentence_trace
from figures.registry import FigureOutput, figure
from figures.style import COS_CMAP, STAGE_GROUP_COLORS, new_figure, new_panels
from figures.trained_figs import _caption, _output
from studies.trained.claims import STATED_GATES_BLOCK0, STATED_RING_RADIUS  # the text's numbers, once


@figure("grt.fig_attention_heatmaps", title="Attention weights per head on a corpus sentence", source="GRT text",
        trained=True)
def attention_heatmaps(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    blocks = st.trace.blocks
    show = sorted({0, len(blocks) - 1})
    H = blocks[0].attn_weights.shape[1]
    T = len(st.labels)
    fig = new_figure(figsize=(3.1 * H, 3.2 * len(show) + 0.4))
    ent = {}
    for r, b in enumerate(show):
        w = blocks[b].attn_weights[0].double().numpy()  # (H, T, T)
        # mean entropy of each head's rows: low = focused (e.g. on itself), high = spread evenly
        ent[b] = (-(w * np.log(np.where(w > 0, w, 1.0))).sum(-1)).mean(-1)  # (H,)
        for h in range(H):
            ax = fig.add_subplot(len(show), H, r * H + h + 1)
            ax.imshow(w[h], cmap="magma", norm=PowerNorm(0.5, vmin=0.0, vmax=1.0), interpolation="nearest")
            ax.set_xticks(range(T), st.labels, fontsize=4.5)
            ax.set_yticks(range(T), st.labels, fontsize=4.5)
            ax.tick_params(length=0, pad=1)
            ax.grid(False)
            diag = float(np.trace(w[h]) / T)
            ax.set_title(f"block {b}, head {h}: self {diag:.2f}, entropy {ent[b][h]:.2f}", fontsize=7)
    fig.suptitle("Attention weights (row = query byte, column = key byte; causal)", weight="bold")
    cap = _caption(st, f"softmax(QKᵀ/√d_head) of every head in blocks {', '.join(map(str, show))} on the sentence "
                       "(row: query byte, column: key byte; upper triangle masked; colour ∝ √weight so small "
                       "weights stay visible). Titles give each head's mean "
                       "weight on its own token ('self') and its mean row entropy (nats; low = focused, "
                       f"log T = {np.log(T):.2f} would be uniform over the whole sentence). The text reports "
                       "specialised heads (one a self-filter, one spread evenly) for its trained model.")
    return _output(st, fig, cap, entropy={str(b): e.tolist() for b, e in ent.items()})


@figure("grt.fig_qk_angle_gap", title="Q–K angle gap of every pair across all blocks", source="GRT text",
        trained=True)
def qk_angle_gap(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    gaps = st.trace.qk_angle_gaps()  # (n_blocks, 1, T, H, P_head)
    nb, _, T, H, Ph = gaps.shape
    cos = torch.cos(gaps[:, 0]).double().numpy()  # (n_blocks, T, H, Ph)
    tok = cos[:, st.token].reshape(nb, H * Ph)  # (n_blocks, H*Ph)
    mean = cos.mean(axis=1).reshape(nb, H * Ph)
    fig = new_figure(figsize=(11.0, 1.2 + 0.55 * nb * 2 + 1.0))
    for i, (m, title) in enumerate(((tok, f"the traced token ('{TRACE_WORD}', position {st.token})"),
                                    (mean, f"mean over the sentence's {T} tokens"))):
        ax = fig.add_subplot(2, 1, i + 1)
        im = ax.imshow(m, cmap=COS_CMAP, vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
        for h in range(1, H):
            ax.axvline(h * Ph - 0.5, color="k", lw=1)
        ax.set(yticks=range(nb), ylabel="block", xlabel=f"pair (head-major: head h = pairs {Ph}h .. {Ph}h+{Ph - 1})")
        ax.set_title(f"cos(φ_K − φ_Q) per pair: {title}", fontsize=9)
        ax.grid(False)
        fig.colorbar(im, ax=ax, shrink=0.9, label="cos(Q–K gap)")
    fig.suptitle("The Q–K angle gap for every pair across all blocks (blue aligned, red opposed)", weight="bold")
    cap = _caption(st, f"cos of the angle between each pair's Q and K (each token's own query and key) for all "
                       f"{H * Ph} pairs ({H} heads × {Ph}) in each of the {nb} blocks; top: the traced token, "
                       f"bottom: the mean over the sentence. Mean cosine per block: "
                       + ", ".join(f"{v:.2f}" for v in mean.mean(1)) + ".")
    return _output(st, fig, cap, mean_cos_per_block=mean.mean(1).tolist())


@figure("grt.fig_gates", title="Learned residual gates per block", source="GRT text", trained=True,
        claims=("grt.trained_gates",))
def gates(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    g = st.trace.gates().double().numpy()  # (n_blocks, 3): attention, mixer, FFN (the model's own gates)
    nb = g.shape[0]
    init = st.tm.config.gate_init
    fig, (ax,) = new_panels(1, figsize=(8.0, 4.2))
    names = ("attention", "mixer", "FFN")
    colors = (STAGE_GROUP_COLORS["q"], STAGE_GROUP_COLORS["mixer"], STAGE_GROUP_COLORS["ffn_expand"])
    x = np.arange(nb + 1)  # the text's block 0 first, then ours
    w = 0.27
    for j in range(3):
        ax.bar(x[0] + (j - 1) * w, STATED_GATES_BLOCK0[j], width=w, color="none", edgecolor=colors[j], hatch="///",
               lw=1.2)
        bars = ax.bar(x[1:] + (j - 1) * w, g[:, j], width=w, color=colors[j], label=f"{names[j]} gate")
        ax.bar_label(bars, fmt="%.2f", fontsize=6.5, padding=1)
        ax.text(x[0] + (j - 1) * w, STATED_GATES_BLOCK0[j] + 0.01, f"{STATED_GATES_BLOCK0[j]:.2f}", ha="center",
                va="bottom", fontsize=6.5)
    ax.axhline(init, color="k", ls=":", lw=1, label=f"initial value {init:g}")
    ax.axvline(0.5, color="k", lw=0.6)
    ax.set_xticks(x, ["text's\nblock 0"] + [f"ours\nblock {b}" for b in range(nb)])
    ax.set(ylabel="gate g = sigmoid(ℓ)", ylim=(0, 1.1))
    ax.legend(loc="upper right", fontsize=7, ncol=2)
    order = ["attn ≥ mixer ≥ FFN" if r[0] >= r[1] >= r[2] else "not attn ≥ mixer ≥ FFN" for r in g]
    ax.set_title("hatched: the text's trained block 0; filled: this model's measured gates", fontsize=9)
    fig.suptitle("The learned gates of every block", weight="bold")
    cap = (f"The three residual gates g = sigmoid(ℓ) (attention, mixer, FFN) of each of the {nb} blocks, read from "
           f"the trained model (float32 parameters), initialised at {init:g} (dotted). Hatched bars: the source "
           f"text's trained block-0 values {', '.join(map(str, STATED_GATES_BLOCK0))} (its 12-block d = 256 model). "
           "Measured: " + "; ".join(f"block {b}: " + ", ".join(f"{n} {v:.3f}" for n, v in zip(names, g[b]))
                                    + f" ({order[b]})" for b in range(nb))
           + ". The claim grt.trained_gates judges the ordering the text implies (attention written most fully, the "
             f"FFN damped most). Model: {st.tm.provenance}.")
    return _output(st, fig, cap, gates=g.tolist(), text_block0=list(STATED_GATES_BLOCK0))


@figure("grt.fig_radius_spread", title="The ring radius after training, and pair-radius spread across blocks",
        source="GRT text", trained=True, claims=("grt.trained_ring_radius",))
def radius_spread(ctx) -> FigureOutput:
    from grt_model.pearlnorm import safe_pair_radius
    from rmsgauge.corpus import ByteCorpus

    st = sentence_trace(ctx)
    m = st.tm.model
    spread = st.trace.pair_radius_spread()[:, 0].double().numpy()  # (n_blocks+1, T)
    radii = st.trace.pair_radii()[:, 0, st.token].double().numpy()  # (n_blocks+1, P)
    nb1 = spread.shape[0]
    # the learned ring radius |r_v| of every byte the held-out split contains, weighted by its count there
    val = torch.from_numpy(ByteCorpus.load().split("val").astype("int64"))
    counts = torch.bincount(val, minlength=m.config.vocab_size)[: m.config.vocab_size]  # (V,)
    seen = counts > 0
    r_all = m.embed.magnitudes.detach().double().abs()  # (V,)
    r_seen = r_all[seen].numpy()
    w = counts[seen].double().numpy()
    with torch.no_grad():
        pn = safe_pair_radius(m.blocks[0].norm_attn(m.embed(torch.nonzero(seen)[:, 0]))).double().numpy()
    fig = new_figure(figsize=(12.0, 4.0))
    gs = fig.add_gridspec(1, 3, width_ratios=(1.0, 1.0, 1.0))
    ax0 = fig.add_subplot(gs[0, 0])
    bins = np.linspace(0.0, max(float(r_seen.max()), float(pn.max()), STATED_RING_RADIUS) * 1.08, 41)
    ax0.hist(r_seen, bins=bins, weights=w / w.sum(), color="#1f77b4", alpha=0.85,
             label=f"ring radius |r| ({int(seen.sum())} bytes, weighted by count)")
    ax0.hist(pn.ravel(), bins=bins, weights=np.full(pn.size, 1.0 / pn.size), color="#ff7f0e", alpha=0.55,
             label="pair radii after block 0's PearlNorm")
    ax0.axvline(STATED_RING_RADIUS, color="k", ls="--", lw=1, label=f"text: ≈ {STATED_RING_RADIUS}")
    ax0.axvline(st.tm.config.embed_radius_init, color="#2ca02c", ls=":", lw=1.2,
                label=f"init {st.tm.config.embed_radius_init:g}")
    ax0.set(xlabel="radius", ylabel="fraction")
    ax0.set_title("the embedding's ring radius after training", fontsize=9)
    ax0.legend(fontsize=6.5)
    ax = fig.add_subplot(gs[0, 1])
    ax.boxplot(list(spread), positions=range(nb1), widths=0.5)
    ax.plot(range(nb1), spread[:, st.token], marker="o", color="#d62728", label=f"traced token ('{TRACE_WORD}')")
    ax.set_xticks(range(nb1), ["emb"] + [f"after {b}" for b in range(nb1 - 1)])
    ax.set(xlabel="stream (embedding, then after each block)", ylabel="std / mean of a token's pair radii")
    ax.set_title("spread of pair radii per token (box: the sentence)", fontsize=9)
    ax.legend()
    ax2 = fig.add_subplot(gs[0, 2])
    segs = [np.c_[np.arange(nb1), radii[:, p]] for p in range(radii.shape[1])]
    ax2.add_collection(LineCollection(segs, colors="#1f77b4", linewidths=0.5, alpha=0.4))
    ax2.set(xlim=(-0.2, nb1 - 0.8), ylim=(0, float(radii.max()) * 1.05), xlabel="block", ylabel="pair radius")
    ax2.set_xticks(range(nb1), ["emb"] + [str(b) for b in range(nb1 - 1)])
    ax2.set_title(f"the traced token's {radii.shape[1]} pair radii, block by block", fontsize=9)
    fig.suptitle("The ring radius after training; pair radii differentiate across the stack", weight="bold")
    med = float(np.median(r_seen))
    wmean = float((w * r_seen).sum() / w.sum())
    cap = _caption(st, f"Left: the learned ring radius |r_v| (one magnitude per token) of the {int(seen.sum())} byte "
                       f"values in the held-out split, weighted by their count there: median {med:.3f}, "
                       f"count-weighted mean {wmean:.3f}, range {r_seen.min():.3f}–{r_seen.max():.3f}, against the "
                       f"text's ≈ {STATED_RING_RADIUS} (our init is {st.tm.config.embed_radius_init:g}, the text's "
                       "value, so closeness is not by itself learned); orange: the same tokens' pair radii after "
                       f"block 0's PearlNorm (median {np.median(pn):.3f}): one per-token factor, then the learned "
                       "gain leaves them unequal. Middle: for each token of the sentence, the spread (std/mean) "
                       "of its residual-stream pair radii, from the embedding (a ring: spread "
                       f"{np.median(spread[0]):.1e}) through every block (median after the last block "
                       f"{np.median(spread[-1]):.3f}). Right: each of the traced token's pair radii across blocks.")
    return _output(st, fig, cap, median_ring_radius=med, weighted_mean_ring_radius=wmean,
                   median_radius_after_pearlnorm=float(np.median(pn)), median_spread=np.median(spread, axis=1).tolist())
