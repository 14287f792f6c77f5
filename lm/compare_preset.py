r"""Named comparison presets: an lr sweep that widens itself until each model's best value is interior,
then one long final run per model at its best lr (``python -m lm.compare --preset reference``).

Phases (every run is ``python -m lm.train`` in its own folder, so an interrupted preset resumes:
a finished run is reused, a checkpointed one continues bit-exactly with ``--resume``):

1. **sweep** -- each model (GRT; dense matched in parameters; dense matched in wall-clock) trains
   ``sweep_tokens`` at each lr of its start grid, a ladder of half-decades (1e-3, 3e-3, 1e-2, ...).
   While a model's best final validation bits per byte sits at the smallest or largest lr of its grid, the
   next ladder value beyond that edge is added and trained (at most ``max_widen`` times), so the reported
   best lr is **interior**: it has a worse neighbour on both sides.
2. **final** -- each model trains ``final_tokens`` at its best sweep lr on the same bytes in the same
   order (batches are a function of ``(seed, step)``), checkpointing every ``ckpt_steps`` steps.

The sweep uses a smaller budget than the finals (the table says which); the best lr of a short run is
an estimate of the best lr of the long one, usually on the high side (a longer cosine schedule anneals
more), which is why the grid is kept interior rather than trusted at an edge.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

LR_LADDER = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)  # half-decades


@dataclass(frozen=True)
class Preset:
    name: str
    sweep_tokens: int
    final_tokens: int
    start_lrs: dict[str, tuple[float, ...]] = field(default_factory=dict)  # per model tag, values of LR_LADDER
    sweep_evals: int = 4
    final_evals: int = 30  # evaluations of each final run: the learning curves
    sweep_eval_batches: int = 8
    final_eval_batches: int = 16  # 16 x 16 x 64 = 16,384 held-out bytes per evaluation
    ckpt_steps: int = 100  # a final run interrupted by a session's end loses at most this many steps
    max_widen: int = 3  # ladder steps added per model at most, beyond the start grid
    quick: bool = False  # the tiny models of --quick (tests)
    grt: dict = field(default_factory=dict)  # GRTConfig overrides of compare's GRT (grt_config)


PRESETS = {
    "reference": Preset(
        "reference", sweep_tokens=250_000, final_tokens=3_000_000,
        # 4 heads (head roles are a claim of the text) at d 128; 2 blocks keep a 3M-token final near 30 min
        grt={"d_model": 128, "n_heads": 4, "n_blocks": 2, "d_ff": 512, "block_size": 64},
        # start grids from the 80k-token sweep (GRT best 3e-2, dense 3e-3 / 1e-3): centred, one step each side
        start_lrs={"grt": (1e-2, 3e-2, 1e-1), "dense_params": (1e-3, 3e-3, 1e-2),
                   "dense_wallclock": (3e-4, 1e-3, 3e-3)}),
    "smoke": Preset(
        "smoke", sweep_tokens=2_048, final_tokens=4_096,
        start_lrs={"grt": (3e-3, 1e-2, 3e-2), "dense_params": (3e-3, 1e-2, 3e-2),
                   "dense_wallclock": (3e-3, 1e-2, 3e-2)},
        sweep_evals=1, final_evals=4, sweep_eval_batches=1, final_eval_batches=2, ckpt_steps=2, max_widen=1,
        quick=True),
}


def widen(lrs: list[float], best: float, tried: set[float]) -> float | None:
    """The ladder value just beyond the edge where ``best`` sits, if ``best`` is an edge of ``lrs``."""
    grid = sorted(lrs)
    if len(grid) < 2 or best not in (grid[0], grid[-1]):
        return None
    i = min(range(len(LR_LADDER)), key=lambda k: abs(math.log(LR_LADDER[k]) - math.log(best)))
    j = i - 1 if best == grid[0] else i + 1
    if not 0 <= j < len(LR_LADDER) or LR_LADDER[j] in tried:
        return None
    return LR_LADDER[j]


def is_interior(lr: float, lrs: list[float]) -> bool:
    grid = sorted(lrs)
    return len(grid) >= 3 and grid[0] < lr < grid[-1]


def phase_train_config(args: argparse.Namespace, block_size: int, out_dir: Path, lr: float, tokens: int,
                       evals: int, eval_batches: int, ckpt_steps: int) -> dict:
    from lm.trainconfig import TrainConfig

    steps = max(1, math.ceil(tokens / (args.batch_size * block_size)))
    return TrainConfig(
        lr=lr, batch_size=args.batch_size, max_tokens=tokens, warmup_steps=min(50, max(1, steps // 10)),
        eval_interval=max(1, steps // evals), eval_batches=eval_batches, log_interval=max(1, steps // 100),
        gauge_interval=max(1, steps // 50), ckpt_interval=ckpt_steps, seed=args.seed, device=args.device, threads=1,
        data=args.data or "", out_dir=str(out_dir)).to_dict()


def finished_summary(run) -> dict | None:
    """The run's summary if it already completed with exactly this configuration; a folder holding a
    *different* finished run is refused rather than overwritten."""
    path = run.out_dir / "summary.json"
    if not path.exists():
        return None
    s = json.loads(path.read_text())
    want = {k: run.train_config[k] for k in ("lr", "max_tokens", "batch_size", "seed", "data", "val_fraction")}
    have = {k: s.get("train_config", {}).get(k) for k in want}
    if have != want or s.get("model_config") != run.model_config:
        raise ValueError(f"{run.out_dir} holds a finished run with another configuration ({have} vs {want}); "
                         f"choose a fresh --out-dir")
    return s if s.get("complete") else None


def run_preset(args: argparse.Namespace, gcfg, preset: Preset, specs: list[tuple[str, str, dict]], say) -> dict:
    """Sweep (widening to an interior best), then the finals. Returns ``{tag: {"sweep": [Run], "final": Run}}``."""
    from lm.compare import Run, _best, run_all

    out = Path(args.out)
    result: dict[str, dict] = {}
    grids: dict[str, list[float]] = {}
    for kind, match, mcfg in specs:
        tag = kind if match == "-" else f"dense_{match.replace('-', '')}"
        result[tag] = {"kind": kind, "match": match, "model_config": mcfg, "sweep": [], "widened": []}
        grids[tag] = list(preset.start_lrs[tag])

    def make(tag: str, lr: float, phase: str) -> Run:
        info = result[tag]
        name = f"{tag}_lr{lr:g}" if phase == "sweep" else f"{tag}_final"
        folder = out / phase / name
        tokens, evals, batches = ((preset.sweep_tokens, preset.sweep_evals, preset.sweep_eval_batches)
                                  if phase == "sweep" else
                                  (preset.final_tokens, preset.final_evals, preset.final_eval_batches))
        tc = phase_train_config(args, int(info["model_config"]["block_size"]), folder, lr, tokens, evals, batches,
                                preset.ckpt_steps if phase == "final" else 0)
        return Run(name, info["kind"], info["match"], info["model_config"], lr, folder, train_config=tc)

    def execute(runs: list[Run]) -> None:
        todo = []
        for r in runs:
            s = finished_summary(r)
            if s is None:
                todo.append(r)
            else:
                r.summary, r.returncode = s, 0
        if len(todo) < len(runs):
            say(f"reusing {len(runs) - len(todo)} finished run(s) in {out}")
        if todo:
            run_all(todo, args, say)

    for round_ in range(preset.max_widen + 1):
        new = []
        for tag, info in result.items():
            have = {r.lr for r in info["sweep"]}
            for lr in grids[tag]:
                if lr not in have:
                    run = make(tag, lr, "sweep")
                    info["sweep"].append(run)
                    new.append(run)
        if not new:
            break
        say(f"sweep round {round_}: {len(new)} run(s) x {preset.sweep_tokens:,} tokens")
        execute(new)
        if round_ == preset.max_widen:
            break
        for tag, info in result.items():
            best = _best(info["sweep"]).lr
            nxt = widen(grids[tag], best, {r.lr for r in info["sweep"]})
            if nxt is not None:
                say(f"  {tag}: best lr {best:g} is at the edge of {sorted(grids[tag])}; adding {nxt:g}")
                grids[tag].append(nxt)
                info["widened"].append(nxt)

    finals = []
    for tag, info in result.items():
        info["best_lr"] = _best(info["sweep"]).lr
        info["lr_grid"] = sorted(grids[tag])
        info["interior"] = is_interior(info["best_lr"], info["lr_grid"])
        info["final"] = make(tag, info["best_lr"], "final")
        finals.append(info["final"])
    say("finals: " + ", ".join(f"{r.name} lr {r.lr:g}" for r in finals)
        + f", {preset.final_tokens:,} tokens each")
    execute(finals)
    return result
