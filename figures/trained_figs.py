"""Trained-model figures of the GRT text's figure list, drawn from :meth:`grt_model.model.GRT.trace`.

All of them trace one real corpus sentence (:data:`figures.model_source.SENTENCE`)
through the figure model (``--checkpoint`` or the cached auto-trained one); every
caption names the checkpoint and its training budget.  The model runs in float32
(as it trains).  Axes follow the text: a pair is drawn in its rebuilt Cartesian
coordinates (x0, x1); the stage index is the third axis; "pair p" at a stage is
slot p of that stage's butterfly pairing (``CascadeTrace.pairs``).

The pair-trace figures also carry a drag-to-rotate 3-D view (``figures.interactive``).
"""

from __future__ import annotations

import numpy as np
import torch
from matplotlib.collections import LineCollection
from matplotlib.colors import PowerNorm
from mpl_toolkits.mplot3d.art3d import Line3DCollection

from figures.interactive import PlotlyMissing, figure3d, line_trace
from figures.model_source import TRACE_WORD, SentenceTrace, sentence_trace
from figures.registry import FigureOutput, figure
from figures.style import COS_CMAP, FADED, HEAD_COLORS, STAGE_GROUP_COLORS, new_figure

LIT_PER_HEAD = 4  # the text's interactive view: "4 pairs per head lit in their head color, the other 112 faded"
CASCADE_LABELS = {"q": "Q", "k": "K", "v": "V", "o": "O", "mixer": "mixer", "ffn_expand": "FFN expand",
                  "ffn_contract": "FFN contract"}
STATED_GATES_BLOCK0 = (0.99, 0.97, 0.79)  # the text: "attention ... about 0.99. The mixer at about 0.97. The FFN 0.79"


def cascade_tracks(casc, token: int) -> np.ndarray:
    """``[heads, P, S+1, 2]``: every pair slot of one token through a cascade (slot p in each stage's pairing)."""
    stages = torch.stack([casc.pairs(i)[0, token] for i in range(casc.n_stages + 1)])  # (S+1, heads, P, 2)
    return stages.permute(1, 2, 0, 3).double().numpy()


def with_stage(tracks: np.ndarray, z0: float = 0.0) -> np.ndarray:
    """``[..., S+1, 2] -> [..., S+1, 3]`` appending the stage index (offset ``z0``) as the third coordinate."""
    S1 = tracks.shape[-2]
    z = np.broadcast_to(z0 + np.arange(S1, dtype=np.float64)[:, None], (*tracks.shape[:-1], 1))
    return np.concatenate((tracks, z), axis=-1)


def _segments(tracks3: np.ndarray) -> np.ndarray:
    """``[N, S, 3] -> [N*(S-1), 2, 3]`` line segments for a Line3DCollection."""
    return np.stack((tracks3[:, :-1], tracks3[:, 1:]), axis=2).reshape(-1, 2, 3)


def _draw3d(ax, tracks3: np.ndarray, color, lw: float = 0.8, alpha: float = 0.9) -> None:
    ax.add_collection3d(Line3DCollection(_segments(tracks3), colors=color, linewidths=lw, alpha=alpha))


def _frame3d(ax, tracks3: np.ndarray, title: str, zlabel: str = "stage") -> None:
    lo, hi = tracks3.reshape(-1, 3).min(0), tracks3.reshape(-1, 3).max(0)
    lim = float(max(abs(lo[:2]).max(), abs(hi[:2]).max())) * 1.05 or 1.0
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_zlim(lo[2], hi[2])
    ax.set_xlabel("x0")
    ax.set_ylabel("x1")
    ax.set_zlabel(zlabel)
    ax.set_title(title, fontsize=9)
    ax.view_init(elev=22, azim=-60)


def _caption(st: SentenceTrace, what: str) -> str:
    return (f"{what} Input: the corpus sentence \"{st.text}\" (byte tokens; the traced token is the last byte of "
            f"'{TRACE_WORD}', position {st.token}). float32. Model: {st.tm.provenance}.")


def _interactive(build):
    """Build a plotly view; a checkout without plotly gets the static figure and a note instead."""
    try:
        return build(), ""
    except PlotlyMissing as e:
        return None, f" (No 3-D view: {e}.)"


# ------------------------------------------------------------------------------------------------ Q traces


@figure("grt.fig_q_pair_trace", title="One pair traced through the Q stages", source="GRT text", trained=True,
        interactive=True)
def q_pair_trace(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    q = st.trace.blocks[0].q
    tracks = cascade_tracks(q, st.token)  # (H, P, S+1, 2)
    h, p = 0, 0
    one = tracks[h, p]  # (S+1, 2)
    S = q.n_stages
    r = np.hypot(one[:, 0], one[:, 1])
    fig = new_figure(figsize=(10.0, 4.4))
    ax = fig.add_subplot(1, 2, 1)
    ax.plot(range(S + 1), one[:, 0], marker="o", label="x0 = r cos φ")
    ax.plot(range(S + 1), one[:, 1], marker="s", label="x1 = r sin φ")
    ax.plot(range(S + 1), r, color="k", ls="--", lw=1, label="r")
    ax.set_xlabel("Q stage (0 = the cascade's input, after PearlNorm)")
    ax.set_ylabel("coordinate")
    ax.set_xticks(range(S + 1))
    ax.legend()
    ax.set_title(f"block 0, head {h}, pair slot {p}: x0, x1 against stage")
    ax3 = fig.add_subplot(1, 2, 2, projection="3d")
    t3 = with_stage(one[None])  # (1, S+1, 3)
    _draw3d(ax3, t3, HEAD_COLORS[h], lw=2.0)
    ax3.scatter(t3[0, :, 0], t3[0, :, 1], t3[0, :, 2], color=HEAD_COLORS[h], s=12)
    _frame3d(ax3, t3, "the same pair in 3-D (x0, x1, stage)")
    fig.suptitle(f"One pair through the {S} Q stages", weight="bold")

    def build():
        return figure3d([line_trace(t3, name=f"head {h}, pair {p}", color=HEAD_COLORS[h], width=5, markers=True)],
                        title=f"One pair through the {S} Q stages (block 0, head {h}, pair {p})")

    inter, note = _interactive(build)
    cap = _caption(st, f"One pair (block 0, head {h}, slot {p}) of the Q projection through its {S} stages: each "
                       f"stage rotates the pair by its learned angle plus the Clifford nudge and scales x0, x1; the "
                       f"butterfly hands slot {p} a new coordinate pair between stages. Radius from {r[0]:.3f} at "
                       f"the input to {r[-1]:.3f} after stage {S}.") + note
    return FigureOutput(fig, cap, interactive=inter, numbers={"provenance": st.tm.provenance,
                                                               "radius_in": r[0], "radius_out": r[-1]})


@figure("grt.fig_q_all_pairs", title="All pairs through the Q stages", source="GRT text", trained=True,
        interactive=True)
def q_all_pairs(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    q = st.trace.blocks[0].q
    tracks = cascade_tracks(q, st.token)  # (H, P, S+1, 2)
    H, P, S1, _ = tracks.shape
    emb = st.trace.embedding[0, st.token].double().numpy().reshape(-1, 2)  # (D/2, 2) the embedding's ring
    fig = new_figure(figsize=(7.0, 6.0))
    ax = fig.add_subplot(1, 1, 1, projection="3d")
    for h in range(H):
        _draw3d(ax, with_stage(tracks[h]), HEAD_COLORS[h % len(HEAD_COLORS)], lw=0.6, alpha=0.75)
    ax.scatter(emb[:, 0], emb[:, 1], np.full(len(emb), -1.0), s=4, color="k", label="embedding ring (z = -1)")
    allt = np.concatenate([with_stage(tracks.reshape(H * P, S1, 2)).reshape(-1, 3),
                           np.c_[emb, np.full(len(emb), -1.0)]])
    _frame3d(ax, allt[None], f"all {H * P} pairs ({H} heads × {P}), coloured by head; z = -1: the token's "
                             "embedding ring")
    fig.suptitle(f"Q projection: all pairs through {S1 - 1} stages", weight="bold")
    r_emb = np.hypot(emb[:, 0], emb[:, 1])
    r_out = np.hypot(tracks[..., -1, 0], tracks[..., -1, 1])

    def build():
        traces = [line_trace(with_stage(tracks[h]), name=f"head {h}", color=HEAD_COLORS[h % len(HEAD_COLORS)],
                             width=2) for h in range(H)]
        ring = with_stage(emb[:, None, :], z0=-1.0)  # (P, 1, 3)
        traces.append(line_trace(ring, name="embedding ring (z = -1)", color="#000000", markers=True))
        return figure3d(traces, title=f"Q projection: all {H * P} pairs through {S1 - 1} stages")

    inter, note = _interactive(build)
    cap = _caption(st, f"All {H * P} pairs of block 0's Q projection ({H} heads × {P} pairs) through its "
                       f"{S1 - 1} stages, one colour per head. Below them (z = -1) the token's embedding: every "
                       f"pair at radius {r_emb.mean():.3f} (std {r_emb.std():.1e}), the text's uniform ring. After "
                       f"the cascade the radii spread to mean {r_out.mean():.3f}, std {r_out.std():.3f}.") + note
    return FigureOutput(fig, cap, interactive=inter, numbers={"provenance": st.tm.provenance,
                                                               "ring_radius": r_emb.mean(), "out_std": r_out.std()})


def _lit(P: int) -> np.ndarray:
    """The LIT_PER_HEAD pair slots highlighted per head: evenly spaced across the head."""
    return np.linspace(0, P - 1, min(LIT_PER_HEAD, P)).round().astype(int)


@figure("grt.fig_q_heads", title="Each head's Q cascade alone, then combined", source="GRT text", trained=True,
        interactive=True)
def q_heads(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    q = st.trace.blocks[0].q
    tracks = cascade_tracks(q, st.token)  # (H, P, S+1, 2)
    H, P, S1, _ = tracks.shape
    fig = new_figure(figsize=(3.0 * (H + 1), 3.6))
    allt = with_stage(tracks.reshape(H * P, S1, 2))
    for h in range(H + 1):
        ax = fig.add_subplot(1, H + 1, h + 1, projection="3d")
        for g in range(H):
            if h < H and g != h:
                continue
            _draw3d(ax, with_stage(tracks[g]), HEAD_COLORS[g % len(HEAD_COLORS)], lw=0.6)
        _frame3d(ax, allt if h == H else with_stage(tracks[h]), "combined" if h == H else f"head {h}")
    fig.suptitle(f"Each head's Q projection ({S1 - 1} stages): identical wiring, its own angles, coupling, scales",
                 weight="bold")
    lit = _lit(P)

    def build():
        traces = []
        mask = np.ones((H, P), dtype=bool)
        mask[:, lit] = False
        traces.append(line_trace(with_stage(tracks[mask]), name=f"other {int(mask.sum())} pairs", color=FADED,
                                 width=1, opacity=0.35))
        for h in range(H):
            traces.append(line_trace(with_stage(tracks[h, lit]), name=f"head {h}: pairs {list(lit)}",
                                     color=HEAD_COLORS[h % len(HEAD_COLORS)], width=5, markers=True))
        return figure3d(traces, title=f"{len(lit)} pairs per head lit, the other {H * P - H * len(lit)} faded")

    inter, note = _interactive(build)
    # how different are the heads? mean |angle| turned per stage, per head
    phi = np.unwrap(np.arctan2(tracks[..., 1], tracks[..., 0]), axis=-1)  # (H, P, S+1)
    turn = np.abs(np.diff(phi, axis=-1)).mean(axis=(1, 2))  # (H,)
    cap = _caption(st, f"Block 0's Q cascade of each of the {H} heads drawn alone, then all combined. The wiring is "
                       f"the same; the learned parameters differ: mean |turn| per stage by head "
                       + ", ".join(f"{t:.3f}" for t in turn) + " rad. The 3-D view lights "
                       f"{len(lit)} pairs per head (slots {list(lit)}) and fades the rest, as the text's "
                       "interactive view does.") + note
    return FigureOutput(fig, cap, interactive=inter, numbers={"provenance": st.tm.provenance,
                                                               "mean_turn_per_head": turn.tolist()})


@figure("grt.fig_qkv_attention", title="Q, K, V meeting at attention, coloured by the Q–K angle cosine",
        source="GRT text", trained=True)
def qkv_attention(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    b0 = st.trace.blocks[0]
    q, k, v = (cascade_tracks(c, st.token) for c in (b0.q, b0.k, b0.v))  # (H, P, S+1, 2) each
    H, P, S1, _ = q.shape
    cos_gap = torch.cos(b0.qk_angle_gap()[0, st.token]).double().numpy()  # (H, P): own Q vs own K
    fig = new_figure(figsize=(11.0, 5.0))
    gs = fig.add_gridspec(1, 2, width_ratios=(1.3, 1.0))
    ax = fig.add_subplot(gs[0, 0], projection="3d")
    # Q, K, V side by side along x0 (offsets), stage upward; final markers coloured by cos(Q-K gap)
    span = float(np.abs(np.concatenate([q, k, v])).max()) * 2.4
    for j, (name, t) in enumerate((("Q", q), ("K", k), ("V", v))):
        t3 = with_stage(t.reshape(H * P, S1, 2))
        t3[..., 0] += (j - 1) * span
        _draw3d(ax, t3, STAGE_GROUP_COLORS[name.lower()], lw=0.4, alpha=0.45)
        if name != "V":
            sc = ax.scatter(t3[:, -1, 0], t3[:, -1, 1], t3[:, -1, 2], c=cos_gap.ravel(), cmap=COS_CMAP, vmin=-1,
                            vmax=1, s=14, edgecolors="k", linewidths=0.2)
        ax.text(t3[:, 0, 0].mean(), 0, -1.5, name, ha="center", weight="bold")
    _frame3d(ax, np.array([[[-1.6 * span, -span / 2, 0], [1.6 * span, span / 2, S1 - 1]]]),
             "Q (left), K (middle), V (right) cascades; Q/K end markers: cos(Q–K angle)")
    fig.colorbar(sc, ax=ax, shrink=0.6, pad=0.12, label="cos(φ_K − φ_Q)")
    ax2 = fig.add_subplot(gs[0, 1])
    im = ax2.imshow(cos_gap, cmap=COS_CMAP, vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax2.set_xlabel("pair slot p (per head)")
    ax2.set_ylabel("head")
    ax2.set_yticks(range(H))
    ax2.grid(False)
    ax2.set_title("cos of each pair's Q–K angle gap (blue aligned, red opposed)", fontsize=9)
    fig.colorbar(im, ax=ax2, shrink=0.8)
    fig.suptitle("Q, K, V meeting at attention (block 0)", weight="bold")
    # the score this geometry feeds: q.k / sqrt(d_head) = sum_p r_q r_k cos(gap) / sqrt(d_head)
    rq, rk = np.hypot(*np.moveaxis(q[..., -1, :], -1, 0)), np.hypot(*np.moveaxis(k[..., -1, :], -1, 0))
    cap = _caption(st, f"Block 0's Q, K and V cascades for the traced token ({H} heads × {P} pairs, {S1 - 1} stages "
                       "each), and the colour of each Q and K end point: the cosine of that pair's Q–K angle gap "
                       "(RdBu: blue aligned, red opposed). The token's self-score per head is "
                       "Σ_p r_q r_k cos(gap)/√d_head = " + ", ".join(f"{s:.2f}" for s in
                                                                        (rq * rk * cos_gap).sum(1) / np.sqrt(2 * P))
                       + " (heads 0..). Angles after rotary position; for a token with itself the rotary angles "
                         "cancel.")
    return FigureOutput(fig, cap, numbers={"provenance": st.tm.provenance, "mean_cos": float(cos_gap.mean())})


# ------------------------------------------------------------------------------------------------ block 0


@figure("grt.fig_block0_stages", title="All stages of block 0 stacked", source="GRT text",
        claims=("grt.stage_counts",), trained=True, interactive=True)
def block0_stages(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    b0 = st.trace.blocks[0]
    emb = st.trace.embedding[0, st.token].double().numpy().reshape(-1, 2)  # (P, 2)
    groups = []  # (name, tracks3 [N, S+1, 3]) with z continuing across cascades
    z = 0.0
    for c in b0.cascades():
        t = cascade_tracks(c, st.token)  # (heads, P, S+1, 2)
        t = t.reshape(-1, t.shape[-2], 2)  # (N, S+1, 2)
        groups.append((c.name, with_stage(t, z0=z)))
        z += c.n_stages
    n_total = int(z)
    fig = new_figure(figsize=(7.5, 7.0))
    ax = fig.add_subplot(1, 1, 1, projection="3d")
    ax.scatter(emb[:, 0], emb[:, 1], np.zeros(len(emb)), s=4, color="k")
    for name, t3 in groups:
        _draw3d(ax, t3, STAGE_GROUP_COLORS[name], lw=0.3, alpha=0.5)
    allt = np.concatenate([t3.reshape(-1, 3) for _, t3 in groups])
    _frame3d(ax, allt[None], "z = 0: the embedding ring; then " + " → ".join(
        f"{CASCADE_LABELS[n]} ({t3.shape[1] - 1})" for n, t3 in groups), zlabel="stage (stacked)")
    from matplotlib.lines import Line2D

    ax.legend(handles=[Line2D([], [], color=STAGE_GROUP_COLORS[n], label=CASCADE_LABELS[n]) for n, _ in groups],
              loc="upper left", fontsize=7)
    fig.suptitle(f"All {n_total} rotation stages of block 0", weight="bold")

    def build():
        traces = [line_trace(with_stage(emb[:, None, :]), name="embedding ring (z = 0)", color="#000000",
                             markers=True)]
        traces += [line_trace(t3, name=f"{CASCADE_LABELS[n]} ({t3.shape[1] - 1} stages, {t3.shape[0]} pairs)",
                              color=STAGE_GROUP_COLORS[n], width=1.5, opacity=0.6) for n, t3 in groups]
        return figure3d(traces, title=f"All {n_total} stages of block 0 (drag to rotate)", z_title="stage (stacked)",
                        height=640)

    inter, note = _interactive(build)
    counts = ", ".join(f"{CASCADE_LABELS[n]} {t3.shape[1] - 1}" for n, t3 in groups)
    cap = _caption(st, f"Every rotation stage of block 0 stacked upward: {counts} = {n_total} stages (the text's 87 "
                       "per block: this trace counts them from the model's own cascades). z = 0 is the token's "
                       "embedding ring (one shared magnitude). Q, K, V run in parallel in the model and are stacked "
                       "here as the text stacks them; the FFN stages carry d_ff/2 pairs, most of them zero-padded at "
                       "the expand's input.") + note
    return FigureOutput(fig, cap, interactive=inter, numbers={"provenance": st.tm.provenance, "stages": n_total})


# ------------------------------------------------------------------------------------------------ across blocks


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
            ax.set_xticks(range(T))
            ax.set_yticks(range(T))
            ax.set_xticklabels(st.labels, fontsize=4.5)
            ax.set_yticklabels(st.labels, fontsize=4.5)
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
    return FigureOutput(fig, cap, numbers={"provenance": st.tm.provenance,
                                           "entropy": {str(b): e.tolist() for b, e in ent.items()}})


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
        ax.set_yticks(range(nb))
        ax.set_ylabel("block")
        ax.set_xlabel(f"pair (head-major: head h = pairs {Ph}h .. {Ph}h+{Ph - 1})")
        ax.set_title(f"cos(φ_K − φ_Q) per pair: {title}", fontsize=9)
        ax.grid(False)
        fig.colorbar(im, ax=ax, shrink=0.9, label="cos(Q–K gap)")
    fig.suptitle("The Q–K angle gap for every pair across all blocks (blue aligned, red opposed)", weight="bold")
    cap = _caption(st, f"cos of the angle between each pair's Q and K (each token's own query and key) for all "
                       f"{H * Ph} pairs ({H} heads × {Ph}) in each of the {nb} blocks; top: the traced token, "
                       f"bottom: the mean over the sentence. Mean cosine per block: "
                       + ", ".join(f"{v:.2f}" for v in mean.mean(1)) + ".")
    return FigureOutput(fig, cap, numbers={"provenance": st.tm.provenance, "mean_cos_per_block": mean.mean(1).tolist()})


@figure("grt.fig_gates", title="Learned residual gates per block", source="GRT text", trained=True)
def gates(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    g = st.trace.gates().double().numpy()  # (n_blocks, 3): attention, mixer, FFN
    nb = g.shape[0]
    init = st.tm.config.gate_init
    fig = new_figure(figsize=(7.0, 4.0))
    ax = fig.add_subplot(1, 1, 1)
    names = ("attention", "mixer", "FFN")
    colors = (STAGE_GROUP_COLORS["q"], STAGE_GROUP_COLORS["mixer"], STAGE_GROUP_COLORS["ffn_expand"])
    x = np.arange(nb)
    for j in range(3):
        ax.bar(x + (j - 1) * 0.27, g[:, j], width=0.27, color=colors[j], label=f"{names[j]} gate")
        ax.scatter([-0.6], [STATED_GATES_BLOCK0[j]], marker="<", s=50, color=colors[j], zorder=4)
    ax.axhline(init, color="k", ls=":", lw=1, label=f"initial value {init:g}")
    ax.text(-0.55, 1.0, "text's trained\nblock 0", fontsize=7, ha="left", va="bottom")
    ax.set_xticks(x)
    ax.set_xlabel("block")
    ax.set_ylabel("gate g = sigmoid(ℓ)")
    ax.set_ylim(0, 1.12)
    ax.set_xlim(-0.9, nb - 0.5)
    ax.legend(loc="lower right", fontsize=7)
    fig.suptitle("The learned gates of every block", weight="bold")
    cap = (f"The three residual gates (attention, mixer, FFN) of each of the {nb} blocks of the figure model, "
           f"initialised at {init:g}. Triangles: the source text's trained block-0 values "
           f"{', '.join(map(str, STATED_GATES_BLOCK0))} (its 12-block reference model; our model is smaller and "
           f"trained briefly, so agreement is not expected). Block 0 here: "
           + ", ".join(f"{n} {v:.3f}" for n, v in zip(names, g[0])) + f". float32. Model: {st.tm.provenance}.")
    return FigureOutput(fig, cap, numbers={"provenance": st.tm.provenance, "gates": g.tolist()})


@figure("grt.fig_radius_spread", title="Pair-radius spread across blocks", source="GRT text", trained=True)
def radius_spread(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    spread = st.trace.pair_radius_spread()[:, 0].double().numpy()  # (n_blocks+1, T)
    radii = st.trace.pair_radii()[:, 0, st.token].double().numpy()  # (n_blocks+1, P)
    nb1 = spread.shape[0]
    fig = new_figure(figsize=(10.0, 4.0))
    ax = fig.add_subplot(1, 2, 1)
    ax.boxplot(list(spread), positions=range(nb1), widths=0.5)
    ax.plot(range(nb1), spread[:, st.token], marker="o", color="#d62728", label=f"traced token ('{TRACE_WORD}')")
    ax.set_xticks(range(nb1))
    ax.set_xticklabels(["emb"] + [f"after {b}" for b in range(nb1 - 1)])
    ax.set_xlabel("stream (embedding, then after each block)")
    ax.set_ylabel("std / mean of a token's pair radii")
    ax.set_title("spread of pair radii per token (box: all tokens of the sentence)", fontsize=9)
    ax.legend()
    ax2 = fig.add_subplot(1, 2, 2)
    segs = [np.c_[np.arange(nb1), radii[:, p]] for p in range(radii.shape[1])]
    ax2.add_collection(LineCollection(segs, colors="#1f77b4", linewidths=0.5, alpha=0.4))
    ax2.set_xlim(-0.2, nb1 - 0.8)
    ax2.set_ylim(0, float(radii.max()) * 1.05)
    ax2.set_xticks(range(nb1))
    ax2.set_xticklabels(["emb"] + [str(b) for b in range(nb1 - 1)])
    ax2.set_xlabel("block")
    ax2.set_ylabel("pair radius")
    ax2.set_title(f"the traced token's {radii.shape[1]} pair radii, block by block", fontsize=9)
    fig.suptitle("Pair radii differentiate across the stack", weight="bold")
    cap = _caption(st, "Left: for each token of the sentence, the spread (std/mean) of its residual-stream pair "
                       "radii, from the embedding (a ring: spread " + f"{np.median(spread[0]):.1e}) through every "
                       "block (median after the last block " + f"{np.median(spread[-1]):.3f}). Right: each of the "
                       "traced token's pair radii across blocks. The text: 'across the stack, pair radii "
                       "differentiate: some pairs grow, some shrink'.")
    return FigureOutput(fig, cap, numbers={"provenance": st.tm.provenance,
                                           "median_spread": np.median(spread, axis=1).tolist()})
