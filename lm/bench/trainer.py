r"""``python -m lm.bench --trainer``: the GRT against its parameter-matched dense model, trained by the real trainer.

Each run is ``python -m lm.train`` in a fresh process (``torchrun`` for data parallel) on the bundled corpus,
float32, with ``--threads N`` and ``OMP_NUM_THREADS=N``; the GRT and its dense twin run one after the other with the
same settings.  The figure is the trainer's own: the ``tok_per_s`` of its per-step ``train`` records, median over
the steady-state steps (the first ``warmup`` steps load the kernels and touch memory for the first time).  The run
skips the gauge census and evaluates one batch at the start and the end, outside the timed steps.  Peak memory is
the process's maximum resident set (``wait4``), interpreter included.  The fused kernels are compiled (or loaded)
once in this process first, so no run pays numba's compile.

Shapes: **shipped** (width 128, 4 heads, 2 blocks, d_ff 512, context 64, batch 16; dense width 136) and **text**
(256, 4 heads, 12 blocks, d_ff 1024).  Settings: one process at 1 and at 2 threads, and with ``--trainer-parallel``
two processes of one thread, one data-parallel run (``torchrun``) or two independent runs at once (tokens/s summed).
The floor beside each ratio is ``dense FLOPs / GRT FLOPs`` (:func:`lm.bench.cases.flops_per_token`): the ratio if
both ran at the same FLOP rate.

On cores busy with other work a multi-threaded run spends its time in OpenMP's spin-waits unless
``OMP_WAIT_POLICY=PASSIVE`` (measured at load 7 on 2 cores: the shipped GRT's 2-thread step 12.3 s spinning against
1.2 s passive); the runs inherit the environment and the table's header names the policy in effect.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lm.bench.cases import flops_per_token, matched_dense
from lm.models import config_to_dict, param_count

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Shape:
    name: str
    d_model: int
    n_heads: int
    n_blocks: int
    d_ff: int
    block_size: int = 64
    batch_size: int = 16
    warmup: int = 5  # steps dropped before the steady state
    steps: int = 25  # steady-state steps measured


SHAPES = {
    "shipped": Shape("shipped", 128, 4, 2, 512),
    "text": Shape("text", 256, 4, 12, 1024, warmup=2, steps=6),
    "tiny": Shape("tiny", 16, 2, 1, 32, block_size=8, batch_size=4, warmup=1, steps=2),  # for the tests
}


@dataclass(frozen=True)
class Setting:
    threads: int  # torch threads per process
    procs: int = 1  # processes
    mode: str = "single"  # "single" | "ddp" (one run, torchrun) | "jobs" (independent runs at once)

    @property
    def label(self) -> str:
        if self.procs == 1:
            return f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        what = "torchrun" if self.mode == "ddp" else "jobs"
        return f"{self.procs} {what} x {self.threads}t"


SINGLE = (Setting(1), Setting(2))
PARALLEL = (Setting(1, 2, "ddp"), Setting(1, 2, "jobs"))


@dataclass
class TrainerConfig:
    shapes: tuple[str, ...] = ("shipped", "text")
    settings: tuple[Setting, ...] = SINGLE
    steps: dict[str, int] = field(default_factory=dict)  # shape -> steady-state steps (default: the shape's)
    work_dir: str | None = None  # run folders (default: a temporary folder, removed)


@dataclass
class TrainerRow:
    shape: str
    setting: str
    model: str  # "grt" | "dense"
    params: int
    d_model: int
    tok_s: float  # tokens_per_step / median steady-state step time (summed over the jobs of a "jobs" setting)
    step_s: list[float]  # steady-state step times (seconds; the first job's for "jobs")
    flops_per_token: float  # forward
    peak_rss_mb: float  # largest process
    load_before: float  # 1-minute load average when the run started (contention)
    load_after: float
    wall_s: float
    error: str = ""


# ---------------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------------


def model_configs(shape: Shape) -> tuple[Any, Any]:
    """``(GRTConfig, DenseConfig)``: the shipped GRT recipe's model at the shape's sizes, and the dense model
    matched to it in parameters exactly as the recipes and the experiment grid match it."""
    from grt_model.config import GRTConfig
    from lm.recipes import get_recipe

    base = dict(get_recipe("reference-grt").model_config)
    base.update(d_model=shape.d_model, n_heads=shape.n_heads, n_blocks=shape.n_blocks, d_ff=shape.d_ff,
                block_size=shape.block_size)
    gcfg = GRTConfig(**base)
    return gcfg, matched_dense(gcfg)


def train_config(shape: Shape, setting: Setting, steps: int, out_dir: Path) -> dict[str, Any]:
    """The recipe's training configuration, shortened to ``steps`` steps, a log record per step, one evaluation
    batch at the start and the end, no checkpoints in between, no gauge census."""
    from lm.recipes import get_recipe

    tc = dict(get_recipe("reference-grt").train_config)
    tc.update(max_steps=steps, max_tokens=0, batch_size=shape.batch_size, log_interval=1, eval_interval=0,
              eval_batches=1, ckpt_interval=0, probe_gauges=False, threads=setting.threads, dtype="float32",
              device="cpu", out_dir=str(out_dir))
    return tc


# ---------------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------------


def _command(setting: Setting, cfg_path: Path, out: Path) -> list[str]:
    train = ["-m", "lm.train", "--config", str(cfg_path), "--out-dir", str(out), "--quiet",
             "--threads", str(setting.threads)]
    if setting.mode == "ddp":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                str(setting.procs), *train]
    return [sys.executable, *train]


def _env(threads: int) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def _steady_steps(log: Path, tokens_per_step: int, warmup: int) -> list[float]:
    """Seconds of each logged step after the first ``warmup`` (one ``train`` record per step)."""
    recs = [json.loads(ln) for ln in log.read_text().splitlines() if ln.strip()]
    steps = [tokens_per_step / r["tok_per_s"] for r in recs if r.get("event") == "train" and r.get("tok_per_s")]
    return steps[warmup:]


def _launch(cmd: list[str], env: dict[str, str], err_path: Path) -> subprocess.Popen:
    with open(err_path, "wb") as err:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)


def _wait(p: subprocess.Popen) -> tuple[int, float]:
    """``(exit status, peak RSS in MB)`` of a child and its waited-for descendants (``wait4``)."""
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, usage.ru_maxrss / 1024.0


def run_one(kind: str, mcfg: Any, shape: Shape, setting: Setting, steps: int, work: Path) -> TrainerRow:
    """Train ``kind`` for ``shape.warmup + steps`` steps under ``setting``; its steady-state tokens/s."""
    n_jobs = setting.procs if setting.mode == "jobs" else 1
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    procs, outs = [], []
    for j in range(n_jobs):
        out = work / f"{shape.name}-{kind}-{setting.threads}t{setting.procs}{setting.mode[0]}-{j}"
        cfg_path = work / f"{out.name}.json"
        cfg_path.write_text(json.dumps({"model": kind, "model_config": config_to_dict(mcfg),
                                        "train": train_config(shape, setting, shape.warmup + steps, out)}))
        procs.append(_launch(_command(setting, cfg_path, out), _env(setting.threads), work / f"{out.name}.err"))
        outs.append(out)
    results = [_wait(p) for p in procs]
    wall, load1 = time.perf_counter() - t0, os.getloadavg()[0]
    row = TrainerRow(shape.name, setting.label, kind, param_count(kind, mcfg), mcfg.d_model, float("nan"), [],
                     flops_per_token(kind, mcfg), max(r[1] for r in results), load0, load1, wall)
    bad = [(o, code) for o, (code, _) in zip(outs, results) if code != 0]
    if bad:
        text = (work / f"{bad[0][0].name}.err").read_text(errors="replace").strip().splitlines()
        row.error = f"exit {bad[0][1]}: {text[-1] if text else 'no output'}"
        return row
    tps = shape.batch_size * shape.block_size
    per_job = [_steady_steps(o / "log.jsonl", tps, shape.warmup) for o in outs]
    if not all(per_job):
        row.error = "no steady-state steps logged"
        return row
    row.step_s = per_job[0]
    row.tok_s = sum(tps / sorted(s)[len(s) // 2] for s in per_job)
    return row


def prewarm_kernels() -> float:
    """Compile (first time) or load the fused float32 kernels with one shipped-shape GRT training step, so no
    timed run pays numba's compile; the seconds it took."""
    import torch

    from grt_model.model import GRT

    t0 = time.perf_counter()
    gcfg, _ = model_configs(SHAPES["shipped"])
    torch.manual_seed(0)
    model = GRT(gcfg)
    ids = torch.randint(0, gcfg.vocab_size, (16, gcfg.block_size + 1))
    _, loss = model(ids[:, :-1], ids[:, 1:])
    loss.backward()
    return time.perf_counter() - t0


def run_trainer(cfg: TrainerConfig, log=print) -> list[TrainerRow]:
    """Every (shape, setting): the GRT, then its dense twin."""
    plans = {name: dict(zip(("grt", "dense"), model_configs(SHAPES[name]))) for name in cfg.shapes}  # all first
    log(f"trainer: fused kernels ready in {prewarm_kernels():.1f} s (compiled or loaded from numba's cache)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        work = Path(cfg.work_dir) if cfg.work_dir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name, models in plans.items():
            shape = SHAPES[name]
            steps = cfg.steps.get(name, shape.steps)
            for setting in cfg.settings:
                for kind, mcfg in models.items():
                    log(f"trainer: {name} {kind} ({setting.label}), {shape.warmup} + {steps} steps ...")
                    rows.append(run_one(kind, mcfg, shape, setting, steps, work))
                    r = rows[-1]
                    log(f"trainer: {name} {kind} ({setting.label}): {r.tok_s:,.0f} tokens/s"
                        + (f"  [{r.error}]" if r.error else ""))
    return rows


# ---------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------


def ratios(rows: list[TrainerRow]) -> list[dict[str, Any]]:
    """Per (shape, setting): GRT and dense tokens/s, GRT/dense, the FLOP floor, the peak-memory ratio."""
    out = []
    keys = list(dict.fromkeys((r.shape, r.setting) for r in rows))
    for shape, setting in keys:
        m = {r.model: r for r in rows if (r.shape, r.setting) == (shape, setting)}
        if {"grt", "dense"} <= m.keys():
            g, d = m["grt"], m["dense"]
            out.append({"shape": shape, "setting": setting, "grt_tok_s": g.tok_s, "dense_tok_s": d.tok_s,
                        "ratio": g.tok_s / d.tok_s, "floor": d.flops_per_token / g.flops_per_token,
                        "rss_ratio": g.peak_rss_mb / d.peak_rss_mb, "grt_rss_mb": g.peak_rss_mb,
                        "dense_rss_mb": d.peak_rss_mb, "load": max(g.load_before, g.load_after, d.load_before,
                                                                    d.load_after),
                        "grt_params": g.params, "dense_params": d.params, "dense_d": d.d_model,
                        "error": "; ".join(e for e in (g.error, d.error) if e)})
    return out


def format_trainer(rows: list[TrainerRow], target: float) -> str:
    lines = ["trainer (python -m lm.train; tokens/s = median of the steady-state steps; GRT vs the dense model "
             "matched in parameters, one after the other; OMP_WAIT_POLICY="
             f"{os.environ.get('OMP_WAIT_POLICY', 'unset')})", ""]
    hdr = (f"{'shape':<8}{'setting':<18}{'GRT tok/s':>10}{'dense tok/s':>12}{'GRT/dense':>10}{'target':>8}"
           f"{'floor':>7}{'peak RSS MB':>16}{'load':>6}")
    lines += [hdr, "-" * len(hdr)]
    for q in ratios(rows):
        rss = f"{q['grt_rss_mb']:.0f}/{q['dense_rss_mb']:.0f}"
        lines.append(f"{q['shape']:<8}{q['setting']:<18}{q['grt_tok_s']:>10,.0f}{q['dense_tok_s']:>12,.0f}"
                     f"{q['ratio']:>9.2f}x{'>=' + format(target, '.1f'):>8}{q['floor']:>6.2f}x{rss:>16}"
                     f"{q['load']:>6.1f}" + (f"  {q['error']}" if q["error"] else ""))
    lines.append("floor: dense FLOPs/token over the GRT's (the ratio if both ran at the same FLOP rate); peak RSS: "
                 "the largest process, interpreter included; load: the highest 1-minute load average around the "
                 "pair of runs (contention: the run itself adds its threads)")
    return "\n".join(lines)
