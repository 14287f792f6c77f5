r"""Named comparison presets: an lr sweep that widens itself until each model's best value is interior,
then one long final run per model at its best lr (``python -m studies.compare --preset reference``).

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
from pathlib import Path

from lm.sizing import LR_LADDER, PRESETS, Preset, phase_train_config  # noqa: F401  (the preset's shapes)


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
    from studies.compare_runs import Run, best_run, run_all

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
            best = best_run(info["sweep"]).lr
            nxt = widen(grids[tag], best, {r.lr for r in info["sweep"]})
            if nxt is not None:
                say(f"  {tag}: best lr {best:g} is at the edge of {sorted(grids[tag])}; adding {nxt:g}")
                grids[tag].append(nxt)
                info["widened"].append(nxt)

    finals = []
    for tag, info in result.items():
        info["best_lr"] = best_run(info["sweep"]).lr
        info["lr_grid"] = sorted(grids[tag])
        info["interior"] = is_interior(info["best_lr"], info["lr_grid"])
        info["final"] = make(tag, info["best_lr"], "final")
        finals.append(info["final"])
    say("finals: " + ", ".join(f"{r.name} lr {r.lr:g}" for r in finals)
        + f", {preset.final_tokens:,} tokens each")
    execute(finals)
    return result
