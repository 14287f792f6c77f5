"""Trained-model figures that draw block 0's cascades as pair traces (:func:`grt_model.trace.trace_model`): one pair
and all pairs through Q, each head's Q cascade, Q/K/V at attention, every stage of block 0.  A pair is drawn in its
rebuilt coordinates (x0, x1) with the stage as the third axis; "pair p" at a stage is slot p of that stage's
butterfly pairing.  The helpers here (pair tracks, 3-D drawing, the caption, ``heads_figure``) serve the other
trained-model figure modules too.
"""

from __future__ import annotations

import numpy as np
import torch
from matplotlib.collections import LineCollection
from matplotlib.lines import Line2D
from mpl_toolkits.mplot3d.art3d import Line3DCollection

from figures.interactive import figure3d, line_trace
from figures.model_source import TRACE_WORD, SentenceTrace, sentence_trace
from figures.registry import FigureOutput, figure
from figures.style import COS_CMAP, FADED, STAGE_GROUP_COLORS, head_color, new_figure, new_panels

LIT_PER_HEAD = 4  # the text's interactive view: "4 pairs per head lit in their head color, the other 112 faded"
CASCADE_LABELS = {"q": "Q", "k": "K", "v": "V", "o": "O", "mixer": "mixer", "ffn_expand": "FFN expand",
                  "ffn_contract": "FFN contract"}


def cascade_tracks(casc, token: int) -> np.ndarray:
    """``[heads, P, S+1, 2]``: every pair slot of one token through a cascade (slot p in each stage's pairing)."""
    stages = torch.stack([casc.pairs(i)[0, token] for i in range(casc.n_stages + 1)])  # (S+1, heads, P, 2)
    return stages.permute(1, 2, 0, 3).double().numpy()


def with_stage(tracks: np.ndarray, z0: float = 0.0) -> np.ndarray:
    """``[..., S+1, 2] -> [..., S+1, 3]`` appending the stage index (offset ``z0``) as the third coordinate."""
    S1 = tracks.shape[-2]
    z = np.broadcast_to(z0 + np.arange(S1, dtype=np.float64)[:, None], (*tracks.shape[:-1], 1))
    return np.concatenate((tracks, z), axis=-1)


def _draw3d(ax, tracks3: np.ndarray, color, lw: float = 0.8, alpha: float = 0.9) -> None:
    """Tracks ``[N, S, 3]`` as one Line3DCollection of their ``N*(S-1)`` segments."""
    segments = np.stack((tracks3[:, :-1], tracks3[:, 1:]), axis=2).reshape(-1, 2, 3)
    ax.add_collection3d(Line3DCollection(segments, colors=color, linewidths=lw, alpha=alpha))


def _frame3d(ax, tracks3: np.ndarray, title: str, zlabel: str = "stage") -> None:
    lo, hi = tracks3.reshape(-1, 3).min(0), tracks3.reshape(-1, 3).max(0)
    lim = float(max(abs(lo[:2]).max(), abs(hi[:2]).max())) * 1.05 or 1.0
    ax.set(xlim=(-lim, lim), ylim=(-lim, lim), zlim=(lo[2], hi[2]), xlabel="x0", ylabel="x1", zlabel=zlabel)
    ax.set_title(title, fontsize=9)
    ax.view_init(elev=22, azim=-60)


def _caption(st: SentenceTrace, what: str) -> str:
    return (f"{what} Input: the corpus sentence \"{st.text}\" (byte tokens; the traced token is the last byte of "
            f"'{TRACE_WORD}', position {st.token}). float32. Model: {st.tm.provenance}.")


def _output(st: SentenceTrace, fig, cap: str, interactive=None, **numbers) -> FigureOutput:
    """A trained-model figure's output: its sidecar's numbers lead with the model's provenance."""
    return FigureOutput(fig, cap, interactive, {"provenance": st.tm.provenance, **numbers})


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
    ax.set(xlabel="Q stage (0 = the cascade's input, after PearlNorm)", ylabel="coordinate", xticks=range(S + 1),
           title=f"block 0, head {h}, pair slot {p}: x0, x1 against stage")
    ax.legend()
    ax3 = fig.add_subplot(1, 2, 2, projection="3d")
    t3 = with_stage(one[None])  # (1, S+1, 3)
    _draw3d(ax3, t3, head_color(h), lw=2.0)
    ax3.scatter(t3[0, :, 0], t3[0, :, 1], t3[0, :, 2], color=head_color(h), s=12)
    _frame3d(ax3, t3, "the same pair in 3-D (x0, x1, stage)")
    fig.suptitle(f"One pair through the {S} Q stages", weight="bold")
    inter = figure3d([line_trace(t3, name=f"head {h}, pair {p}", color=head_color(h), width=5, markers=True)],
                     title=f"One pair through the {S} Q stages (block 0, head {h}, pair {p})")
    cap = _caption(st, f"One pair (block 0, head {h}, slot {p}) of the Q projection through its {S} stages: each "
                       f"stage rotates the pair by its learned angle plus the Clifford nudge and scales x0, x1; the "
                       f"butterfly hands slot {p} a new coordinate pair between stages. Radius from {r[0]:.3f} at "
                       f"the input to {r[-1]:.3f} after stage {S}.")
    return _output(st, fig, cap, inter, radius_in=r[0], radius_out=r[-1])


@figure("grt.fig_q_all_pairs", title="All pairs through the Q stages", source="GRT text", trained=True,
        interactive=True)
def q_all_pairs(ctx) -> FigureOutput:
    st = sentence_trace(ctx)
    q = st.trace.blocks[0].q
    tracks = cascade_tracks(q, st.token)  # (H, P, S+1, 2)
    H, P, S1, _ = tracks.shape
    emb = st.trace.embedding[0, st.token].double().numpy().reshape(-1, 2)  # (D/2, 2) the embedding's ring
    fig, (ax,) = new_panels(1, figsize=(7.0, 6.0), projection="3d")
    for h in range(H):
        _draw3d(ax, with_stage(tracks[h]), head_color(h), lw=0.6, alpha=0.75)
    ax.scatter(emb[:, 0], emb[:, 1], np.full(len(emb), -1.0), s=4, color="k", label="embedding ring (z = -1)")
    allt = np.concatenate([with_stage(tracks.reshape(H * P, S1, 2)).reshape(-1, 3),
                           np.c_[emb, np.full(len(emb), -1.0)]])
    _frame3d(ax, allt[None], f"all {H * P} pairs ({H} heads × {P}), coloured by head; z = -1: the token's "
                             "embedding ring")
    fig.suptitle(f"Q projection: all pairs through {S1 - 1} stages", weight="bold")
    r_emb = np.hypot(emb[:, 0], emb[:, 1])
    r_out = np.hypot(tracks[..., -1, 0], tracks[..., -1, 1])
    traces = [line_trace(with_stage(tracks[h]), name=f"head {h}", color=head_color(h), width=2) for h in range(H)]
    ring = with_stage(emb[:, None, :], z0=-1.0)  # (P, 1, 3)
    traces.append(line_trace(ring, name="embedding ring (z = -1)", color="#000000", markers=True))
    inter = figure3d(traces, title=f"Q projection: all {H * P} pairs through {S1 - 1} stages")
    cap = _caption(st, f"All {H * P} pairs of block 0's Q projection ({H} heads × {P} pairs) through its "
                       f"{S1 - 1} stages, one colour per head. Below them (z = -1) the token's embedding: every "
                       f"pair at radius {r_emb.mean():.3f} (std {r_emb.std():.1e}), the text's uniform ring. After "
                       f"the cascade the radii spread to mean {r_out.mean():.3f}, std {r_out.std():.3f}.")
    return _output(st, fig, cap, inter, ring_radius=r_emb.mean(), out_std=r_out.std())


def _lit(P: int) -> np.ndarray:
    """The LIT_PER_HEAD pair slots highlighted per head: evenly spaced across the head."""
    return np.linspace(0, P - 1, min(LIT_PER_HEAD, P)).round().astype(int)


def lit_mask(H: int, P: int) -> np.ndarray:
    """``[H, P]`` bool: the :data:`LIT_PER_HEAD` highlighted slots of every head."""
    return np.tile(np.isin(np.arange(P), _lit(P)), (H, 1))


def draw_legible(fig, spec, tracks: np.ndarray, lit: np.ndarray, colors: list[str], title: str) -> None:
    """One row of three panels for pair tracks ``[N, S+1, 2]``: a 3-D view (x0, x1, stage) with the ``lit``
    pairs bold in ``colors[i]`` over the others faint, and beside it the radius against the stage and the (x0, x1)
    plane (start: circle, end: square), so the static image reads without rotating it."""
    sub = spec.subgridspec(1, 3, width_ratios=(1.25, 1.0, 1.0))
    ax, ax2, ax3 = fig.add_subplot(sub[0, 0], projection="3d"), fig.add_subplot(sub[0, 1]), fig.add_subplot(sub[0, 2])
    t3 = with_stage(tracks)  # (N, S+1, 3)
    r = np.hypot(tracks[..., 0], tracks[..., 1])  # (N, S+1)
    S1 = tracks.shape[1]
    if (~lit).any():  # in each panel the faint pairs first, under the lit ones
        _draw3d(ax, t3[~lit], FADED, lw=0.35, alpha=0.35)
        ax2.add_collection(LineCollection([np.c_[np.arange(S1), r[i]] for i in np.flatnonzero(~lit)],
                                          colors=FADED, linewidths=0.4, alpha=0.5))
        ax3.add_collection(LineCollection(list(tracks[~lit]), colors=FADED, linewidths=0.35, alpha=0.4))
    for i in np.flatnonzero(lit):
        _draw3d(ax, t3[i:i + 1], colors[i], lw=1.8, alpha=1.0)
        ax2.plot(range(S1), r[i], color=colors[i], lw=1.5, marker="o", ms=2.5)
        ax3.plot(tracks[i, :, 0], tracks[i, :, 1], color=colors[i], lw=1.3)
        ax3.scatter(tracks[i, 0, 0], tracks[i, 0, 1], marker="o", s=14, color=colors[i], zorder=3)
        ax3.scatter(tracks[i, -1, 0], tracks[i, -1, 1], marker="s", s=14, color=colors[i], zorder=3,
                    edgecolors="k", linewidths=0.4)
    _frame3d(ax, t3, title)
    ax2.set(xlim=(-0.3, S1 - 0.7), ylim=(0, float(r.max()) * 1.05 or 1.0), xlabel="stage", ylabel="pair radius r")
    ax2.set_title("radius against stage", fontsize=8)
    lim = float(np.abs(tracks).max()) * 1.05 or 1.0
    ax3.set(xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal", xlabel="x0", ylabel="x1")
    ax3.set_title("(x0, x1) plane: ○ input, □ output", fontsize=8)


def heads_figure(ctx, name: str) -> FigureOutput:
    """Block 0's ``name`` cascade (q, k, v or o) per head, drawn alone then combined, legible as a static image."""
    st = sentence_trace(ctx)
    casc = getattr(st.trace.blocks[0], name)
    tracks = cascade_tracks(casc, st.token)  # (H, P, S+1, 2)
    H, P, S1, _ = tracks.shape
    lit = lit_mask(H, P)
    label = CASCADE_LABELS[name]
    fig = new_figure(figsize=(11.0, 2.9 * (H + 1) + 0.5))
    gs = fig.add_gridspec(H + 1, 1)
    for h in range(H):
        draw_legible(fig, gs[h, 0], tracks[h], lit[h], [head_color(h)] * P,
                     f"head {h} alone: {lit[h].sum()} pairs lit, {P - lit[h].sum()} faint")
    colors = [head_color(h) for h in range(H) for _ in range(P)]
    draw_legible(fig, gs[H, 0], tracks.reshape(H * P, S1, 2), lit.reshape(-1), colors,
                 f"all {H} heads combined: {lit.sum()} lit, {H * P - lit.sum()} faint")
    fig.suptitle(f"Each head's {label} projection ({S1 - 1} stages, block 0): identical wiring, its own angles, "
                 "coupling, scales", weight="bold")
    slots = list(_lit(P))
    traces = [line_trace(with_stage(tracks[~lit]), name=f"other {int((~lit).sum())} pairs", color=FADED, width=1,
                         opacity=0.35)]
    traces += [line_trace(with_stage(tracks[h, slots]), name=f"head {h}: pairs {slots}", color=head_color(h),
                          width=5, markers=True) for h in range(H)]
    inter = figure3d(traces, title=f"{label}: {len(slots)} pairs per head lit, the other {H * P - lit.sum()} faded")
    phi = np.unwrap(np.arctan2(tracks[..., 1], tracks[..., 0]), axis=-1)  # (H, P, S+1)
    turn = np.abs(np.diff(phi, axis=-1)).mean(axis=(1, 2))  # (H,)
    r = np.hypot(tracks[..., 0], tracks[..., 1])
    gain = r[..., -1].sum(-1) / np.maximum(r[..., 0].sum(-1), np.finfo(np.float64).tiny)
    cap = _caption(st, f"Block 0's {label} cascade of each of the {H} heads drawn alone (one row each), then all "
                       f"combined (last row). Each row: a 3-D view (x0, x1, stage) with {len(slots)} pairs per head "
                       f"(slots {slots}) bold in the head's colour over the head's other pairs faint, and two "
                       "projections beside it: the pair radius against the stage, and the (x0, x1) plane (circle: "
                       "the cascade's input, square: its output). The wiring is the same for every head; the "
                       "learned parameters differ: mean |turn| per stage by head "
                       + ", ".join(f"{t:.3f}" for t in turn) + " rad; summed radius out/in by head "
                       + ", ".join(f"{g:.3f}" for g in gain) + ". The rotatable view is in index.html.")
    return _output(st, fig, cap, inter, mean_turn_per_head=turn.tolist(), radius_gain_per_head=gain.tolist())


@figure("grt.fig_q_heads", title="Each head's Q cascade alone, then combined", source="GRT text", trained=True,
        interactive=True)
def q_heads(ctx) -> FigureOutput:
    return heads_figure(ctx, "q")


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
    ax2.set(xlabel="pair slot p (per head)", ylabel="head", yticks=range(H))
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
    return _output(st, fig, cap, mean_cos=float(cos_gap.mean()))


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
    fig, (ax,) = new_panels(1, figsize=(7.5, 7.0), projection="3d")
    ax.scatter(emb[:, 0], emb[:, 1], np.zeros(len(emb)), s=4, color="k")
    for name, t3 in groups:
        _draw3d(ax, t3, STAGE_GROUP_COLORS[name], lw=0.3, alpha=0.5)
    allt = np.concatenate([t3.reshape(-1, 3) for _, t3 in groups])
    _frame3d(ax, allt[None], "z = 0: the embedding ring; then " + " → ".join(
        f"{CASCADE_LABELS[n]} ({t3.shape[1] - 1})" for n, t3 in groups), zlabel="stage (stacked)")
    ax.legend(handles=[Line2D([], [], color=STAGE_GROUP_COLORS[n], label=CASCADE_LABELS[n]) for n, _ in groups],
              loc="upper left", fontsize=7)
    fig.suptitle(f"All {n_total} rotation stages of block 0", weight="bold")
    traces = [line_trace(with_stage(emb[:, None, :]), name="embedding ring (z = 0)", color="#000000", markers=True)]
    traces += [line_trace(t3, name=f"{CASCADE_LABELS[n]} ({t3.shape[1] - 1} stages, {t3.shape[0]} pairs)",
                          color=STAGE_GROUP_COLORS[n], width=1.5, opacity=0.6) for n, t3 in groups]
    inter = figure3d(traces, title=f"All {n_total} stages of block 0 (drag to rotate)", z_title="stage (stacked)",
                     height=640)
    counts = ", ".join(f"{CASCADE_LABELS[n]} {t3.shape[1] - 1}" for n, t3 in groups)
    cap = _caption(st, f"Every rotation stage of block 0 stacked upward: {counts} = {n_total} stages (the text's 87 "
                       "per block: this trace counts them from the model's own cascades). z = 0 is the token's "
                       "embedding ring (one shared magnitude). Q, K, V run in parallel in the model and are stacked "
                       "here as the text stacks them; the FFN stages carry d_ff/2 pairs, most of them zero-padded at "
                       "the expand's input.")
    return _output(st, fig, cap, inter, stages=n_total)
