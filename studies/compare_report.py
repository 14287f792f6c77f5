r"""What a finished comparison reports (:mod:`studies.compare`): one row per model from its runs, the text table,
and the loss-curve figures (the sweep's, and the preset's final runs against tokens and training seconds).

Separate from the command line: these only read finished runs and format them (no flags, no checks, no
training), and with them inside :mod:`studies.compare` that module passed the house limit of 500 lines.  The
runs are :mod:`studies.compare_runs`, the preset's phases :mod:`studies.compare_preset`.  Figures are written
with deterministic bytes (fixed SVG hash salt, no dates, PNG metadata stripped) and atomically.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

from rmsgauge import atomic_write_bytes
from studies.compare_runs import Run

SVG_HASH_SALT = "rmsgauge-compare"  # fixed: SVG element ids stop depending on a random salt


def _full_split_bpb(run: Run) -> float | None:
    """Whole-validation-split bits/byte of a finished run (every byte scored once: :mod:`lm.scoring`); the
    summary's ``final_val_bpb`` is the training log's sample.  ``None`` when the run left no checkpoint."""
    from lm.checkpoint import load_checkpoint, model_from_checkpoint
    from lm.scoring import full_split_bpb
    from rmsgauge.corpus import ByteCorpus

    ckpt = run.out_dir / "ckpt.pt"
    if not ckpt.is_file():
        return None
    model = model_from_checkpoint(load_checkpoint(ckpt))
    tcfg = run.summary["train_config"]  # the data and split the run trained on
    return full_split_bpb(model, ByteCorpus.load(tcfg["data"] or None, tcfg["val_fraction"]))["bpb"]


def result_row(run: Run, sweep: list[Run]) -> dict:
    """One model's row of the table and of ``compare.json``: its best run (``run``) with the whole sweep's final
    bits per byte, its curve and its monitors."""
    s = run.summary
    p = dict(s["params"])
    return {
        "model": run.model, "match": run.match, "run": run.name, "lr": run.lr,
        "model_config": run.model_config,
        "params": {"embedding": p.get("embedding", 0), "attention": p.get("attention", 0),
                   "mixer": p.get("mixer", 0), "ffn": p.get("ffn", 0),
                   "norm_gate": p.get("norm", 0) + p.get("gate", 0), "other": p.get("other", 0) + p.get("head", 0),
                   "total": p["total"]},
        "tokens_seen": s["tokens_seen"], "tokens_per_s": s["tokens_per_s"],
        "final_val_bpb_full": _full_split_bpb(run), "final_val_bpb": s["final_val_bpb"],
        "final_val_loss": s["final_val_loss"],
        "wall_time_s": s["wall_time_s"], "train_time_s": s["train_time_s"],
        "sweep": {f"{r.lr:g}": r.summary.get("final_val_bpb") for r in sweep},
        "equilibrium": s.get("equilibrium", {}), "gauge_census": s.get("gauge_census", {}),
        "curve": [(e["tokens"], e["val_bpb"]) for e in s.get("evals", [])],
        "evals_full": s.get("evals", []),
    }


def at_edge(row: dict, lrs: list[float]) -> bool:
    """The best lr is the smallest or largest of a sweep of 3+ points (the optimum may lie outside the grid)."""
    return len(lrs) > 2 and row["lr"] in (min(lrs), max(lrs))


def format_table(rows: list[dict], meta: dict) -> str:
    head = (f"GRT vs dense (QK-norm) on {meta['corpus']}: {meta['dtype']}, {meta['device']}, "
            f"{meta['budget_tokens']:,} tokens each (batch {meta['batch_size']} x {meta['block_size']}), "
            f"lr sweep {meta['lrs']} (best shown), seed {meta['seed']}")
    cols = ("model", "match", "d", "embed", "attn", "mixer", "ffn", "norm+gate", "total", "lr", "tokens",
            "tok/s", "bpb full", "sample", "wall s")
    lines = [head, "(bpb full: validation bits/byte on the whole split, every byte scored once; sample: the "
                   "training log's 16-batch sample)", ""]
    fmt = "{:<6} {:<10} {:>4} {:>8} {:>9} {:>8} {:>9} {:>9} {:>10} {:>7} {:>9} {:>7} {:>8} {:>7} {:>7}"
    lines.append(fmt.format(*cols))
    for r in rows:
        p = r["params"]
        lines.append(fmt.format(
            r["model"], r["match"], r["model_config"]["d_model"], f"{p['embedding']:,}", f"{p['attention']:,}",
            f"{p['mixer']:,}", f"{p['ffn']:,}", f"{p['norm_gate']:,}", f"{p['total']:,}",
            f"{r['lr']:g}" + ("*" if at_edge(r, r.get("lr_grid", meta["lrs"])) else ""),
            f"{r['tokens_seen']:,}", f"{r['tokens_per_s']:.0f}",
            "-" if r.get("final_val_bpb_full") is None else f"{r['final_val_bpb_full']:.4f}",
            f"{r['final_val_bpb']:.4f}", f"{r['wall_time_s']:.0f}"))
    if any(at_edge(r, r.get("lr_grid", meta["lrs"])) for r in rows):
        lines.append("* best lr at the edge of the sweep: the optimum may lie outside it (widen --lrs)")
    sweep_tokens = meta.get("sweep_tokens")
    lines += ["", "lr sweep, final validation bits per byte"
              + (f" (sweep runs: {sweep_tokens:,} tokens each; table above: the final runs):" if sweep_tokens else ":")]
    lrs = meta["lrs"]
    lines.append("{:<20}".format("model") + "".join(f"{lr:>10g}" for lr in lrs))
    for r in rows:
        vals = [r["sweep"].get(f"{lr:g}") for lr in lrs]
        lines.append(f"{r['model'] + ' (' + r['match'] + ')':<20}" + "".join(
            f"{v:>10.4f}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{'-':>10}" for v in vals))
    return "\n".join(lines)


def plot_curves(rows: list[dict], all_runs: dict[str, list[Run]], out_dir: Path, title: str) -> list[Path]:
    """Validation bits per byte against tokens: best lr of each model bold, the other sweep points faint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = SVG_HASH_SALT
    colors = {"-": "#c0392b", "params": "#2471a3", "wall-clock": "#229954"}
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in rows:
        key = f"{r['model']} ({r['match']})"
        c = colors.get(r["match"], "k")
        for other in all_runs[key]:
            if other.name == r["run"]:
                continue
            xs = [e["tokens"] for e in other.summary.get("evals", [])]
            ys = [e["val_bpb"] for e in other.summary.get("evals", [])]
            ax.plot(xs, ys, color=c, alpha=0.25, lw=1)
        xs, ys = zip(*r["curve"]) if r["curve"] else ((), ())
        label = f"{'GRT' if r['model'] == 'grt' else 'dense'} {'' if r['match'] == '-' else r['match'] + '-matched '}" \
                f"({r['params']['total']:,} params, lr {r['lr']:g})"
        ax.plot(xs, ys, color=c, lw=2, marker="o", ms=3, label=label)
    ax.set_xlabel("training tokens (bytes)")
    ax.set_ylabel("validation bits per byte")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths = []
    for ext, meta in (("svg", {"Date": None}), ("png", {"Software": None})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, metadata=meta, dpi=120)
        paths.append(atomic_write_bytes(out_dir / f"loss_curves.{ext}", buf.getvalue()))
    plt.close(fig)
    return paths


def plot_final_curves(rows: list[dict], out_dir: Path, title: str) -> list[Path]:
    """Validation bits per byte of each final run against training tokens (left) and training seconds (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = SVG_HASH_SALT
    colors = {"-": "#c0392b", "params": "#2471a3", "wall-clock": "#229954"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for r in rows:
        evals = r.get("evals_full") or []
        label = f"{'GRT' if r['model'] == 'grt' else 'dense'} {'' if r['match'] == '-' else r['match'] + '-matched '}" \
                f"({r['params']['total']:,} params, lr {r['lr']:g})"
        c = colors.get(r["match"], "k")
        axes[0].plot([e["tokens"] for e in evals], [e["val_bpb"] for e in evals], color=c, lw=2, marker="o", ms=2.5,
                     label=label)
        axes[1].plot([e.get("train_time_s", math.nan) for e in evals], [e["val_bpb"] for e in evals], color=c, lw=2,
                     marker="o", ms=2.5)
    axes[0].set_xlabel("training tokens (bytes)")
    axes[1].set_xlabel("training seconds (this machine, 1 thread per run)")
    axes[0].set_ylabel("validation bits per byte")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.set_ylim(top=min(5.0, ax.get_ylim()[1]))
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    paths = []
    for ext, meta in (("svg", {"Date": None}), ("png", {"Software": None})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, metadata=meta, dpi=120)
        paths.append(atomic_write_bytes(out_dir / f"final_curves.{ext}", buf.getvalue()))
    plt.close(fig)
    return paths
