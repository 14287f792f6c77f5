r"""``python -m lm.bench --profile``: where a training step's time goes, GRT beside its parameter-matched dense twin.

The trainer's step (:func:`lm.bench.cases.training_step`) on one batch of the bundled corpus at a shape of
:data:`lm.bench.trainer.SHAPES`, timed by ``torch.profiler`` over ``steps`` steps after ``warmup`` untimed ones.
Each operator's *self* CPU time goes to the first category of :data:`CATEGORIES` whose pattern matches its name,
so the rows add up to the profiled time: the fused kernels, the dense GEMMs, attention, the optimizer, and the
per-operator glue around them (norms, gates, RoPE, embedding and head, autograd bookkeeping: many small operators
whose cost is their count, not their FLOPs).  The profiler adds a few microseconds per operator, so the wall time
per step is measured without it and printed beside the profiled sum.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from lm.bench.cases import median_time, training_step
from lm.bench.trainer import SHAPES, model_configs
from lm.models import build_model, param_count
from rmsgauge import seed_everything
from rmsgauge.corpus import ByteCorpus

# (category, regex on the profiler's operator name); first match wins; "other" takes the rest
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("cascade forward", r"^_CascadeFn$"),
    ("cascade backward", r"^_CascadeFnBackward"),
    ("fused FFN forward", r"^_FFNFn$"),
    ("fused FFN backward", r"^_FFNFnBackward"),
    ("matmul (dense GEMMs)", r"^aten::(mm|addmm|bmm|matmul|linear)$"),
    ("attention (SDPA)", r"scaled_dot_product|flash_attention"),
    ("optimizer (AdamW)", r"^Optimizer\.|_foreach_|^aten::(addcdiv_|addcmul_|lerp_)$"),
    ("elementwise + glue", r"^aten::"),
    ("autograd engine", r"^autograd::|Backward[0-9]*$|^detach"),
)


@dataclass
class StepProfile:
    shape: str
    model: str
    params: int
    threads: int
    steps: int
    wall_ms_per_step: float  # median step time without the profiler
    profiled_ms_per_step: float  # the categories' sum (self CPU time, profiler on)
    ms_per_step: dict[str, float] = field(default_factory=dict)  # category -> self CPU ms per step
    ops_per_step: dict[str, float] = field(default_factory=dict)  # category -> operator calls per step
    load_average: float = 0.0


@contextlib.contextmanager
def _without_profiler_chatter() -> Any:
    """The profiler's backend (kineto) writes ``USDT: ... profiler_start/stop`` lines straight to file descriptor 2
    (no setting turns them off): stderr goes to a temporary file meanwhile and every other line is replayed."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            rest = [ln for ln in tmp.read().decode(errors="replace").splitlines() if not ln.startswith("USDT:")]
            if rest:
                sys.stderr.write("\n".join(rest) + "\n")


def categorize(name: str) -> str:
    for cat, pattern in CATEGORIES:
        if re.search(pattern, name):
            return cat
    return "other"


def profile_model(shape_name: str, kind: str, model_cfg: Any, *, steps: int, warmup: int, threads: int,
                  batch_size: int, seed: int = 0) -> StepProfile:
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        seed_everything(seed)
        model = build_model(kind, model_cfg).train()
        x, y = ByteCorpus.load().batch("train", batch_size, int(model_cfg.block_size),
                                       generator=torch.Generator().manual_seed(seed))
        step = training_step(model, x, y)
        wall = median_time(step, steps, warmup)  # seconds, the profiler off
        with _without_profiler_chatter(), profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step()
    finally:
        torch.set_num_threads(prev)
    ms: dict[str, float] = {}
    ops: dict[str, float] = {}
    for ev in prof.key_averages():
        cat = categorize(ev.key)
        ms[cat] = ms.get(cat, 0.0) + ev.self_cpu_time_total / 1e3 / steps
        ops[cat] = ops.get(cat, 0.0) + ev.count / steps
    order = [c for c, _ in CATEGORIES] + ["other"]
    ms = {c: ms[c] for c in order if c in ms}
    return StepProfile(shape_name, kind, param_count(kind, model_cfg), threads, steps, 1e3 * wall,
                       sum(ms.values()), ms, {c: ops[c] for c in ms}, os.getloadavg()[0])


def profile_shape(shape_name: str, *, steps: int = 0, threads: int = 1, log: Any = None) -> list[StepProfile]:
    """The GRT and its parameter-matched dense model at ``shape_name`` (:data:`lm.bench.trainer.SHAPES`)."""
    shape = SHAPES[shape_name]
    n = steps or shape.steps
    out = []
    for kind, cfg in zip(("grt", "dense"), model_configs(shape)):
        if log:
            log(f"profile: {shape_name} {kind}, {n} steps at {threads} thread(s) ...")
        out.append(profile_model(shape_name, kind, cfg, steps=n, warmup=shape.warmup, threads=threads,
                                 batch_size=shape.batch_size))
    return out


def format_profiles(profiles: list[StepProfile]) -> str:
    """One table per shape: ms per step by category, GRT beside dense, with the operator calls."""
    lines = []
    for shape in dict.fromkeys(p.shape for p in profiles):
        ps = [p for p in profiles if p.shape == shape]
        cats = list(dict.fromkeys(c for p in ps for c in p.ms_per_step))
        hdr = f"{'step profile: ' + shape:<30}" + "".join(f"{p.model + ' ms':>11}{'ops':>7}{'share':>7}" for p in ps)
        lines += [hdr, "-" * len(hdr)]
        for c in cats:
            cells = "".join(f"{p.ms_per_step.get(c, 0.0):>11.1f}{p.ops_per_step.get(c, 0.0):>7.0f}"
                            f"{p.ms_per_step.get(c, 0.0) / p.profiled_ms_per_step:>7.0%}" for p in ps)
            lines.append(f"{c:<30}{cells}")
        lines.append(f"{'profiled sum':<30}" + "".join(f"{p.profiled_ms_per_step:>11.1f}{'':>14}" for p in ps))
        lines.append(f"{'wall, profiler off':<30}" + "".join(f"{p.wall_ms_per_step:>11.1f}{'':>14}" for p in ps))
        lines.append(f"({ps[0].threads} thread(s), {ps[0].steps} steps, float32; self CPU time per operator "
                     f"category; load average {max(p.load_average for p in ps):.1f})")
        lines.append("")
    return "\n".join(lines).rstrip()
