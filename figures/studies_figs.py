r"""Figures of the GRT experiment grid (:mod:`studies.experiments`), drawn from its committed records
(``results/grt-experiments/runs.json``, and ``logs/`` for the gate trajectories), never rerun.  Not in the
``--quick`` set; a group with no record yet is "unavailable" (determinism is tested on synthetic records in
``tests/test_studies_figs.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from figures.registry import FigureOutput, FigureUnavailable, figure
from figures.style import new_panels
from studies.trained import STATED_GATES_BLOCK0

RESULTS = Path(__file__).resolve().parent.parent / "results" / "grt-experiments"
GATE_NAMES = ("attention", "mixer", "FFN")


def _records() -> list[dict[str, Any]]:
    path = RESULTS / "runs.json"
    if not path.is_file():
        raise FigureUnavailable(f"{path} is missing: run python -m studies.experiments run")
    return json.loads(path.read_text())


def _rows(rows_of: Callable[[list[dict[str, Any]]], Any], what: str) -> Any:
    """``rows_of`` (a table of :mod:`studies.experiments_report`) of the records; unavailable while it is empty."""
    if not (rows := rows_of(_records())):
        raise FigureUnavailable(f"no {what} is recorded yet")
    return rows


@figure("studies.content_adaptive", title="Ablations: what each GRT choice is worth (1M tokens, 2 seeds)",
        source="GRT text", claims=("studies.content_adaptive",))
def content_adaptive_fig(ctx) -> FigureOutput:
    from studies.experiments_report import ablation_rows

    rows = sorted(_rows(ablation_rows, "ablation run"), key=lambda r: r["mean"])
    fig, (ax,) = new_panels(1, figsize=(8.0, 0.45 * len(rows) + 1.5))
    y = np.arange(len(rows))
    for i, r in enumerate(rows):
        ax.plot(r["bpb"], [i] * len(r["bpb"]), "o", color="C0" if r["model"] == "grt" else "C1", ms=4)
        ax.plot([min(r["bpb"]), max(r["bpb"])], [i, i], color="0.5", lw=1)
    ship = next((r["mean"] for r in rows if r["variant"] == "shipped"), None)
    if ship is not None:
        ax.axvline(ship, color="C0", lw=0.8, ls="--")
    ax.set_yticks(y, [f"{r['variant']} ({r['params']:,})" for r in rows], fontsize=7)
    ax.set(xlabel="validation bits/byte, whole split (each seed; line: range)",
           title="dashed: shipped GRT mean; blue GRT, orange dense (parameters in brackets)")
    cap = ("Ablations of the GRT at the shipped shape (d 128, 4 heads, 2 blocks), 1,000,000 tokens at lr 3e-3, "
           "seeds 0 and 1, float32 training; whole-split validation bits/byte. coupling-off-wallclock trains the "
           "coupling-off model for the shipped model's training seconds.")
    return FigureOutput(fig=fig, caption=cap, numbers={r["variant"]: r["mean"] for r in rows})


@figure("studies.stable_by_construction", title="Final loss against learning rate at 12 blocks",
        source="GRT text", claims=("studies.stable_by_construction",))
def stability_fig(ctx) -> FigureOutput:
    from studies.experiments_report import stability_rows

    rows = _rows(stability_rows, "stability run")
    fig, (ax,) = new_panels(1, figsize=(7.0, 4.2))
    numbers = {}
    finite = [r["final_val_loss"] for rs in rows.values() for r in rs if r.get("final_val_loss") is not None]
    top = max(finite) * 1.05 if finite else 1.0  # where a diverged run (no final loss) is marked
    for i, (variant, rs) in enumerate(sorted(rows.items())):
        lrs = [r["lr"] for r in rs]
        loss = [r["final_val_loss"] if r.get("final_val_loss") is not None else np.nan for r in rs]
        ax.plot(lrs, loss, color=f"C{i}", lw=1, label=variant)
        for r, lv in zip(rs, loss):
            if r.get("nonfinite_step") is not None:
                ax.plot(r["lr"], top * (1 + 0.015 * i), "x", color=f"C{i}", ms=6)  # offset: models can coincide
            else:
                ax.plot(r["lr"], lv, "o", color=f"C{i}", mfc=f"C{i}" if r.get("stable") else "none", ms=5)
        numbers[variant] = dict(zip(map(str, lrs), loss))
    ax.axhline(top, color="0.8", lw=0.5, zorder=0)
    ax.annotate("diverged", (0.01, top), xycoords=("axes fraction", "data"), fontsize=7, va="bottom", color="0.4")
    ax.set(xscale="log", xlabel="peak learning rate (AdamW, 200 steps)", ylabel="final validation loss (nats)",
           title="hollow: unstable (not below its start, or blew up); x: diverged (non-finite)")
    ax.legend(fontsize=7)
    cap = ("12 blocks, width 128, 4 heads, context 64, batch 16, 200 AdamW steps (warmup 20, cosine, clip 1.0), "
           "float32: the GRT, the dense QK-norm baseline, the dense model without norms, and the same with "
           "zero-initialized residual writes. Final loss on the 16-batch validation sample.")
    return FigureOutput(fig=fig, caption=cap, numbers=numbers)


@figure("studies.space_efficient", title="Bits per byte against parameters and training seconds",
        source="GRT text", claims=("studies.space_efficient",))
def depth_fig(ctx) -> FigureOutput:
    from studies.experiments_report import depth_rows

    rows = _rows(depth_rows, "depth or text-shape final run")
    fig, axes = new_panels(2, figsize=(10.0, 4.0))
    numbers: dict[str, Any] = {}
    for j, kind in enumerate(("grt", "dense")):
        pts = [(r[kind]["params"]["total"], r[kind]["wall_s"], r[kind]["val_bpb_full"], r["shape"])
               for r in rows if r[kind] is not None]
        depth = [p for p in pts if p[3] != "text"]
        for ax, x in zip(axes, (0, 1)):
            ax.plot([p[x] for p in depth], [p[2] for p in depth], "o-", color=f"C{j}", label=kind)
            for p in pts:
                if p[3] == "text":
                    ax.plot(p[x], p[2], "*", color=f"C{j}", ms=10, label=f"{kind} text shape")
                ax.annotate(p[3], (p[x], p[2]), fontsize=6, xytext=(3, 3), textcoords="offset points")
        numbers[kind] = {p[3]: {"params": p[0], "train_s": p[1], "bpb": p[2]} for p in pts}
    axes[0].set(xscale="log", xlabel="parameters", ylabel="validation bits/byte (whole split)")
    axes[1].set(xscale="log", xlabel="training seconds (2 shared cores, 1 thread each)")
    axes[0].legend(fontsize=7)
    cap = ("GRT and parameter-matched dense QK-norm models at 2, 4 and 8 blocks (width 128) and at the text's "
           "shape (d 256, 12 blocks; stars), 3M tokens each at its sweep's best lr, float32 training.")
    return FigureOutput(fig=fig, caption=cap, numbers=numbers)


def _eval_curve(name: str, field: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(tokens, ``field``) at every evaluation of run ``name``'s committed log that carries it; None without one."""
    path = RESULTS / "logs" / f"{name}.log.jsonl"
    if not path.is_file():
        return None
    evals = [json.loads(x) for x in path.read_text().splitlines() if '"eval"' in x]
    evals = [e for e in evals if e.get("event") == "eval" and e.get(field)]
    if not evals:
        return None
    return np.array([e["tokens"] for e in evals]), np.array([e[field] for e in evals])


@figure("studies.fig_gate_trajectories", title="Residual gates during training, against the text's ordering",
        source="GRT text", claims=("grt.trained_gates",))
def gate_trajectories(ctx) -> FigureOutput:
    runs = [r for r in _records() if r["model"] == "grt" and r.get("phase") in ("final", "grid")
            and r["group"] in ("text_shape", "depth", "ablation") and r.get("variant") in
            ("shipped", "text-grt", "depth4-grt", "depth8-grt")]
    curves = {r["name"]: c for r in runs if (c := _eval_curve(r["name"], "gates")) is not None}  # (E,), (E, L, 3)
    if not curves:
        raise FigureUnavailable("no GRT run with gate logs is recorded yet")
    fig, axes = new_panels(3, figsize=(11.0, 3.6))
    numbers = {}
    for i, (name, (tok, g)) in enumerate(sorted(curves.items())):
        for k, ax in enumerate(axes):
            ax.plot(tok, g[:, 0, k], color=f"C{i}", lw=1, label=f"{name} block 0")
            if g.shape[1] > 1:
                ax.plot(tok, g[:, -1, k], color=f"C{i}", lw=1, ls=":", label=f"{name} block {g.shape[1] - 1}")
        numbers[name] = {"final_block0": g[-1, 0].tolist(), "final_last_block": g[-1, -1].tolist()}
    for ax, gate, stated in zip(axes, GATE_NAMES, STATED_GATES_BLOCK0):
        ax.axhline(stated, color="k", lw=0.7, ls="--")
        ax.set(xlabel="training tokens", ylim=(0, 1), title=f"{gate} gate (dashed: text {stated})")
    axes[0].set_ylabel("gate sigmoid(logit)")
    axes[0].legend(fontsize=6)
    cap = ("Residual gates at every evaluation of the grid's GRT runs (solid: block 0, dotted: the last block), "
           "float32 training, against the text's trained block-0 gates 0.99 / 0.97 / 0.79 (attention >= mixer >= "
           "FFN). Shipped shape: 2 blocks; text shape: 12 blocks.")
    return FigureOutput(fig=fig, caption=cap, numbers=numbers)


@figure("studies.fig_tuning_search", title="Structure-aware learning rates: the coordinate search, run by run",
        source="GRT text")
def tuning_search_fig(ctx) -> FigureOutput:
    from studies.experiments_report import tuning_rows

    rows = _rows(tuning_rows, "tuning run")
    fig, (ax, bx) = new_panels(2, figsize=(10.0, 3.8))
    numbers = {}
    for i, r in enumerate(rows):
        scores = np.array([t["score"] for t in r["trace"]])  # (runs,) in the order the search trained them
        accepted = np.array([t["accepted"] for t in r["trace"]])
        x = np.arange(len(scores))
        ax.plot(x, scores, "o", color=f"C{i}", ms=3, alpha=0.5)
        ax.plot(x[accepted], scores[accepted], "o", color=f"C{i}", ms=5, label=f"{r['model']} (filled: current)")
        ax.plot(x, np.minimum.accumulate(scores), color=f"C{i}", lw=1)
        for k, key in enumerate(("global", "tuned")):
            s = r[key]
            if s["mean"] is not None:
                bx.errorbar(2 * i + k, s["mean"], yerr=(s["range"] or 0.0) / 2, fmt="o", color=f"C{i}", capsize=3)
        numbers[r["search"]] = {"best": r["best"], "global_mean": r["global"]["mean"],
                                "tuned_mean": r["tuned"]["mean"]}
    ax.set(xlabel="search run (0: the global-lr point)", ylabel="validation bits/byte, whole split",
           title="line: best so far")
    ax.legend(fontsize=7)
    bx.set_xticks(range(2 * len(rows)), [f"{r['model']} {k}" for r in rows for k in ("global lr", "tuned")],
                  fontsize=7)
    bx.set(ylabel="bits/byte, 2-seed mean (bar: range)", title="global lr (seeds 0, 1) vs tuned (fresh seeds 1, 2)")
    cap = ("The tuning group: at the shipped shape (d 128, 2 blocks), 1,000,000 tokens at lr 3e-3, float32 "
           "training, a coordinate search over each lr group's multiplier on a half-decade grid, the same number of "
           "runs for the GRT and its parameter-matched dense twin; then the best point at two fresh seeds, beside "
           "the global-lr runs.")
    return FigureOutput(fig=fig, caption=cap, numbers=numbers)


@figure("studies.fig_vocab", title="A real vocabulary: GRT against parameter-matched dense on byte-level BPE",
        source="GRT text", claims=("studies.space_efficient_bpe",))
def vocab_fig(ctx) -> FigureOutput:
    recs = [r for r in _records() if r["group"] in ("vocab", "long") and r.get("val_bpb_full") is not None]
    if not recs:
        raise FigureUnavailable("no BPE run is recorded yet")
    fig, (ax, bx, cx) = new_panels(3, figsize=(12.0, 3.8))
    numbers: dict[str, Any] = {}
    sweeps = sorted({r["variant"] for r in recs if r.get("phase") == "sweep"})
    for tag in sweeps:  # e.g. bpe-small-grt: colour by model, line style by size
        pts = sorted((r["lr"], r["val_bpb_full"]) for r in recs if r["variant"] == tag and r["phase"] == "sweep")
        kind, size = tag.split("-")[2], tag.split("-")[1]
        ax.plot(*zip(*pts), "o-" if size == "small" else "s--", color="C0" if kind == "grt" else "C1", ms=4,
                lw=1, label=f"{kind} {size}")
        numbers[f"{tag}-sweep"] = dict((f"{lr:g}", b) for lr, b in pts)
    ax.set(xscale="log", xlabel="peak learning rate (1M-token sweep)", ylabel="validation bits/byte, whole split",
           title="lr sweeps")
    if sweeps:
        ax.legend(fontsize=7)
    finals = [r for r in recs if r["group"] == "vocab" and r.get("phase") == "final"]
    for r in finals:
        bx.plot(r["params"]["total"], r["val_bpb_full"], "o", color="C0" if r["model"] == "grt" else "C1", ms=5)
        numbers[r["name"]] = r["val_bpb_full"]
    bx.set_xlim(0, 1.1 * max((r["params"]["total"] for r in finals), default=1.0))  # from 0: sizes stay apart
    bx.xaxis.set_major_formatter(lambda v, _: f"{v / 1e6:g}M")
    bx.set(xlabel="parameters (tied head)", ylabel="validation bits/byte, whole split",
           title="3M-token finals (each seed)" if finals else "3M-token finals: none recorded yet")
    top = 0.0
    for kind in ("grt", "dense"):
        curve = _eval_curve(f"long-{kind}", "val_bpb")  # the 16-batch sample the loop logs
        if curve is not None:
            cx.plot(*curve, color="C0" if kind == "grt" else "C1", lw=1, label=kind)
            numbers[f"long-{kind}-last"] = float(curve[1][-1])
            top = max(top, float(curve[1][min(np.searchsorted(curve[0], 5e5), len(curve[0]) - 1)]))
    has_long = any(f"long-{k}-last" in numbers for k in ("grt", "dense"))
    cx.set(xlabel="training tokens", ylabel="validation bits/byte (16-batch sample)",
           title="the long pair, 20 tokens/parameter" if has_long else "the long pair: not run yet")
    if has_long:
        cx.legend(fontsize=7)
        cx.set_ylim(top=top)  # the first 0.5M tokens' drop (4.1 to 2.0 bits) runs off the top: left in, the gap is flat
    cap = ("Byte-level BPE (vocabulary 8,192, trained on the GCIDE training split only), float32 training, both "
           "models at their tuning search's multipliers; blue GRT (phase embedding, tied head), orange its "
           "parameter-matched dense twin (tied head). Bits per byte: every validation token's loss in bits over "
           "the bytes it stands for, so they compare with the byte-level runs.")
    return FigureOutput(fig=fig, caption=cap, numbers=numbers)
