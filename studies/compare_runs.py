"""The comparison's runs (:mod:`studies.compare`, :mod:`studies.compare_preset`): one training job per
(model, lr), ``python -m studies.train`` in its own process (one torch thread, ``--jobs`` at a time) or in this
process (``--jobs 0``); an unfinished run resumes from its checkpoint, a run without one is set aside, never
overwritten."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lm.preflight import run_files, set_aside
from lm.trainconfig import TrainConfig
from rmsgauge import atomic_write_json


@dataclass
class Run:
    name: str  # run folder name
    model: str  # "grt" | "dense"
    match: str  # "-" | "params" | "wall-clock"
    model_config: dict
    lr: float
    out_dir: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    summary: dict = field(default_factory=dict)
    returncode: int | None = None
    train_config: dict | None = None  # set: this run's own TrainConfig dict (the reference preset's phases)


def train_config_for(args: argparse.Namespace, block_size: int, out_dir: Path, lr: float) -> dict:
    steps = max(1, math.ceil(args.budget_tokens / (args.batch_size * block_size)))
    return TrainConfig(
        lr=lr, batch_size=args.batch_size, max_tokens=args.budget_tokens, warmup_steps=min(50, max(1, steps // 10)),
        eval_interval=max(1, steps // args.evals), eval_batches=args.eval_batches, log_interval=max(1, steps // 50),
        gauge_interval=max(1, steps // 50), ckpt_interval=0, seed=args.seed, device=args.device, threads=1,
        data=args.data or "", out_dir=str(out_dir)).to_dict()


def _resume_or_set_aside(run: Run, say=None) -> bool:
    """True when ``run`` has a checkpoint to continue; otherwise a partial run left in its folder (a log without
    a checkpoint: killed before its first one) is moved aside, never overwritten."""
    if (run.out_dir / "ckpt.pt").exists() and not (run.out_dir / "summary.json").exists():
        return True
    if run.out_dir.exists() and run_files(run.out_dir):
        moved = set_aside(run.out_dir)
        if say is not None:
            say(f"  {run.name}: an unfinished run without a checkpoint was moved to {moved}")
    return False


def _launch(run: Run, tcfg: dict, env: dict) -> None:
    resume = _resume_or_set_aside(run)
    run.out_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run.out_dir / "config.json"
    if not resume:
        atomic_write_json(cfg_path, {"model": run.model, "model_config": run.model_config, "train": tcfg})
    log = (run.out_dir / "stderr.txt").open("a" if resume else "w")
    start = ["--resume"] if resume else ["--config", str(cfg_path)]
    run.proc = subprocess.Popen(
        [sys.executable, "-m", "studies.train", *start, "--out-dir", str(run.out_dir),
         "--quiet", "--json", str(run.out_dir / "result.json")],
        stdout=subprocess.DEVNULL, stderr=log, env=env)
    run.started = time.perf_counter()


def _last_step(run: Run) -> int:
    path = run.out_dir / "log.jsonl"
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    for ln in reversed(lines):
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError:  # a line being written right now
            continue
        if rec.get("event") == "train":
            return int(rec["step"])
    return 0


def run_inprocess(runs: list[Run], args: argparse.Namespace, say) -> None:
    """``--jobs 0``: the runs one after another in this process (no interpreter start-up per run)."""
    from lm.loop import train
    from lm.models import config_from_dict
    from studies.train import monitor_hooks

    prev = torch.get_num_threads()
    try:
        for run in runs:
            tcfg = TrainConfig(**(run.train_config or train_config_for(args, int(run.model_config["block_size"]),
                                                                    run.out_dir, run.lr)))
            resume = _resume_or_set_aside(run, say)
            # the hooks python -m lm.train attaches (the subprocess runs get them from its main): same records
            run.summary = train(run.model, config_from_dict(run.model, run.model_config), tcfg, resume=resume,
                                progress=False, hooks=monitor_hooks(tcfg))
            run.returncode = 0
            say(f"  done {run.name}: val {run.summary['final_val_bpb']:.4f} bits/byte, "
                f"{run.summary['tokens_per_s']:.0f} tok/s, {run.summary['wall_time_s']:.0f}s")
    finally:
        torch.set_num_threads(prev)


def run_all(runs: list[Run], args: argparse.Namespace, say) -> None:
    """Run every training job, ``args.jobs`` at a time, with a progress line on stderr."""
    if args.jobs == 0:
        run_inprocess(runs, args, say)
        return
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)  # each run is its own one-process job
    pending, active, done = list(runs), [], []
    last_print = 0.0
    try:
        _loop(pending, active, done, runs, args, env, say, last_print)
    finally:  # an error or Ctrl-C here: stop the children too (they checkpoint on SIGTERM)
        for run in active:
            if run.proc is not None and run.proc.poll() is None:
                run.proc.terminate()
        for run in active:
            if run.proc is not None:
                try:
                    run.proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    run.proc.kill()


def _loop(pending: list[Run], active: list[Run], done: list[Run], runs: list[Run], args: argparse.Namespace,
          env: dict, say, last_print: float) -> None:
    while pending or active:
        while pending and len(active) < args.jobs:
            run = pending.pop(0)
            block = int(run.model_config["block_size"])
            _launch(run, run.train_config or train_config_for(args, block, run.out_dir, run.lr), env)
            active.append(run)
        time.sleep(0.5)
        for run in list(active):
            rc = run.proc.poll()
            if rc is None:
                continue
            run.returncode = rc
            active.remove(run)
            done.append(run)
            summ = run.out_dir / "summary.json"
            if rc != 0 or not summ.exists():
                tail = [ln for ln in (run.out_dir / "stderr.txt").read_text().splitlines() if ln.strip()]
                raise RuntimeError(f"run {run.name} failed (exit {rc}): {tail[-1] if tail else 'no message'} "
                                   f"(its log: {run.out_dir / 'stderr.txt'})")
            run.summary = json.loads(summ.read_text())
            say(f"  done {run.name}: val {run.summary['final_val_bpb']:.4f} bits/byte, "
                f"{run.summary['tokens_per_s']:.0f} tok/s, {run.summary['wall_time_s']:.0f}s")
        now = time.perf_counter()
        if active and now - last_print > args.progress_every:
            last_print = now
            parts = [f"{r.name} {_last_step(r)}/{_total_steps(r, args)}" for r in active]
            say(f"[{len(done)}/{len(runs)} done] " + ", ".join(parts))


def _total_steps(run: Run, args: argparse.Namespace) -> int:
    tokens = run.train_config["max_tokens"] if run.train_config else args.budget_tokens
    batch = run.train_config["batch_size"] if run.train_config else args.batch_size
    return math.ceil(tokens / (batch * int(run.model_config["block_size"])))


def best_run(runs: list[Run]) -> Run:
    def key(r: Run) -> float:
        v = r.summary.get("final_val_bpb")
        return v if isinstance(v, (int, float)) and math.isfinite(v) else math.inf

    return min(runs, key=key)
