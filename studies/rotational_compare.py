"""Base optimizer vs its rotational variant on the bundled corpus (same tokens, same seeds, float32, CPU).

    python -m studies.rotational_compare [--steps 300] [--out-dir results/rotational] [--threads 1]

A small dense QK-norm transformer (lm.dense, per-head RMSNorm on q and k, eps = 0: the q_proj/k_proj row
blocks are exact gauges, found by gauge.census on the float64 copy before training) is trained from the same
initial weights on the same batches by AdamW and SGD with momentum, each against its rotational variant
(dynamics.rotational).  An EquilibriumMonitor records every gauge group's norm and per-step angle.  Writes
``OUT/compare.json`` (curves and summaries), ``OUT/table.md`` and ``OUT/rotational_compare.png``.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from dynamics.monitor import EquilibriumMonitor
from dynamics.rotational import rotational_adamw, rotational_sgd
from gauge.census import census
from lm.dense import DenseConfig, DenseTransformer
from rmsgauge import atomic_write_json, atomic_write_text, check_output_dir, check_range, seed_everything
from rmsgauge.cli import make_parser, run_main
from rmsgauge.corpus import ByteCorpus

MODEL = {"d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 256, "block_size": 64}
BATCH = 16
SETTINGS = {  # the usual small-model hyperparameters
    "adamw": {"lr": 3e-3, "weight_decay": 0.1, "betas": (0.9, 0.95)},
    "sgdm": {"lr": 0.05, "weight_decay": 0.01, "momentum": 0.9},
}
# kind -> (base optimizer, rotational variant), each called with the same hyperparameters
OPTIMIZERS = {"adamw": (torch.optim.AdamW, rotational_adamw), "sgdm": (torch.optim.SGD, rotational_sgd)}
VAL_BATCHES = 8


def run(kind: str, rotational: bool, steps: int, corpus: ByteCorpus, seed: int, gauges) -> dict:
    seed_everything(seed)
    model = DenseTransformer(DenseConfig(**MODEL))
    base, rot = OPTIMIZERS[kind]
    opt = rot(model, gauges, **SETTINGS[kind]) if rotational else base(model.parameters(), **SETTINGS[kind])
    mon = EquilibriumMonitor(model, opt, gauges)
    gen = torch.Generator().manual_seed(seed)  # the same token stream for every run
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        x, y = corpus.batch("train", BATCH, MODEL["block_size"], generator=gen)
        loss = model(x, y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    wall = time.perf_counter() - t0
    vgen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        val = float(np.mean([float(model(*corpus.batch("val", BATCH, MODEL["block_size"], generator=vgen))[1])
                             for _ in range(VAL_BATCHES)]))
    names = [g.name for g in mon.groups]
    angles, norms = (np.array([[h["groups"][n][key] for n in names] for h in mon.history])  # (steps, groups)
                     for key in ("angle", "norm"))
    return {"optimizer": kind, "rotational": rotational, "losses": losses, "val_loss": val, "wall_s": wall,
            "angle_mean": angles.mean(1).tolist(), "angle_min": angles.min(1).tolist(),
            "angle_max": angles.max(1).tolist(), "norm_mean": norms.mean(1).tolist(),
            "angle_eq": mon.history[-1]["groups"][names[0]]["angle_eq"], "summary": mon.summary()}


def table(runs: list[dict], steps: int) -> str:
    lines = ["| optimizer | variant | final train loss (mean last 10%) | val loss | angle step 1 / pred | "
             "angle last 10% / pred | gauge norm first -> last | wall s |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    k = max(1, steps // 10)
    for r in runs:
        a1 = r["angle_mean"][0] / r["angle_eq"]
        al = float(np.mean(r["angle_mean"][-k:])) / r["angle_eq"]
        lines.append(f"| {r['optimizer']} | {'rotational' if r['rotational'] else 'base'} | "
                     f"{np.mean(r['losses'][-k:]):.4f} | {r['val_loss']:.4f} | {a1:.3f} | {al:.3f} | "
                     f"{r['norm_mean'][0]:.3f} -> {r['norm_mean'][-1]:.3f} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.0))
    for i, r in enumerate(runs):
        col, ls = f"C{i // 2}", "-" if r["rotational"] else ":"
        lab = f"{r['optimizer']} {'rotational' if r['rotational'] else 'base'}"
        w = max(1, len(r["losses"]) // 30)
        sm = np.convolve(r["losses"], np.ones(w) / w, mode="valid")
        axes[0].plot(np.arange(len(sm)) + w, sm, color=col, ls=ls, label=lab)
        axes[1].plot(np.arange(1, len(r["angle_mean"]) + 1), r["angle_mean"], color=col, ls=ls, label=lab)
        axes[1].axhline(r["angle_eq"], color=col, lw=0.6, ls="--")
    axes[0].set(xlabel="step", ylabel=f"train loss (nats, running mean of {w})", title="loss, same tokens and seed")
    axes[1].set(xlabel="step", ylabel="mean gauge-group angle per step (rad)", yscale="log",
                title="rotation (dashed: equilibrium angle)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(str(path), dpi=120)
    plt.close(fig)


def build_parser():
    ap = make_parser("python -m studies.rotational_compare", __doc__)
    ap.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    ap.add_argument("--out-dir", default="results/rotational", help="output folder (default results/rotational)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="seed for weights and batches (default 0)")
    return ap


def _check(args) -> None:
    check_range("--steps", args.steps, 1, None)
    check_range("--threads", args.threads, 1, None)
    check_range("--seed", args.seed, 0, 2**32 - 1)
    check_output_dir("--out-dir", args.out_dir)


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, _work, check=_check)


def _work(args, _checked) -> int:
    torch.set_num_threads(args.threads)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = ByteCorpus.load()
    seed_everything(args.seed)
    probe = DenseTransformer(DenseConfig(**MODEL))
    gen = torch.Generator().manual_seed(args.seed)
    res = census(probe, batch=corpus.batch("train", 2, 32, generator=gen))
    gauges = {t.name: [(b.axis, b.start, b.stop) for b in t.blocks] for t in res.tensors if t.blocks}
    print(f"census: {len(gauges)} gauge tensors, {sum(len(v) for v in gauges.values())} groups", flush=True)
    runs = []
    for kind in SETTINGS:
        for rot in (False, True):
            r = run(kind, rot, args.steps, corpus, args.seed, gauges)
            print(f"{kind:6s} {'rotational' if rot else 'base':10s} val {r['val_loss']:.4f}  "
                  f"angle step1 {r['angle_mean'][0]:.3e}  pred {r['angle_eq']:.3e}  {r['wall_s']:.0f}s", flush=True)
            runs.append(r)
    tab = table(runs, args.steps)
    meta = {"model": MODEL, "batch": BATCH, "steps": args.steps, "seed": args.seed, "dtype": "float32",
            "threads": args.threads, "settings": SETTINGS, "gauge_groups": gauges,
            "corpus_sha256": corpus.sha256, "torch": torch.__version__}
    atomic_write_json(out / "compare.json", {**meta, "runs": runs})
    atomic_write_text(out / "table.md", tab + "\n")
    plot(runs, out / "rotational_compare.png")
    print(tab)
    return 0 if all(math.isfinite(r["val_loss"]) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
