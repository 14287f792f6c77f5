r"""Model sizing and the comparison presets: what the recipes, the comparison, the benchmark and the experiment grid
all size models by (one place, so they cannot drift apart).

* :func:`grt_config` -- the comparison's GRT at a CPU size (the source text's stage counts unchanged);
* :func:`dense_params` -- the closed-form parameter count of :class:`lm.dense.DenseTransformer`:
  :math:`Vd\,(\times 2 \text{ untied}) + L\,(4d^2 + 2 d\,d_{ff} + 2d + 2 d_h [\text{QK-norm}]) + d`;
* :func:`param_matched_width` -- the dense width whose parameter count is nearest a target;
* :func:`measure_tok_s`, :func:`wall_matched_width` -- training throughput on this machine, and the dense width
  whose throughput equals the GRT's;
* :data:`PRESETS` and :func:`phase_train_config` -- the comparison presets' shapes and phases (the shipped
  reference models are the ``reference`` preset's finals: :mod:`lm.recipes`).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lm.dense import DenseConfig
from lm.models import build_model

DEFAULT_BATCH_SIZE = 16  # windows per step (--quick: 8)


def grt_config(quick: bool = False, **overrides: Any):
    """The compare's GRT: the source's stage counts at a width the CPU budget can train."""
    from grt_model.config import GRTConfig

    if quick:
        base = {"d_model": 32, "n_heads": 2, "n_blocks": 1, "d_ff": 64, "block_size": 32}
    else:
        base = {"d_model": 64, "n_heads": 2, "n_blocks": 2, "d_ff": 256, "block_size": 64}
    return GRTConfig.small(**{**base, **overrides})


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def dense_params(d_model: int, n_heads: int, n_layers: int, d_ff: int, vocab: int = 256, qk_norm: bool = True,
                 tied: bool = True) -> int:
    r"""Closed-form parameter count of :class:`DenseTransformer`:
    :math:`Vd\,(\times 2 \text{ untied}) + L\,(4d^2 + 2 d\,d_{ff} + 2d + 2 d_h [\text{QK-norm}]) + d`."""
    per_layer = 4 * d_model * d_model + 2 * d_model * d_ff + 2 * d_model + (2 * (d_model // n_heads) if qk_norm else 0)
    return vocab * d_model * (1 if tied else 2) + n_layers * per_layer + d_model


def dense_family(grt_cfg, d_model: int) -> DenseConfig:
    """The dense baseline at width ``d_model`` with the GRT's depth, heads, context and vocabulary."""
    return DenseConfig(vocab_size=grt_cfg.vocab_size, block_size=grt_cfg.block_size, d_model=d_model,
                       n_heads=grt_cfg.n_heads, n_layers=grt_cfg.n_blocks, d_ff=4 * d_model, qk_norm=True,
                       rope=grt_cfg.rope, tie_embeddings=grt_cfg.tie_head)


def widths(n_heads: int, hi: int = 2048) -> list[int]:
    step = 2 * n_heads  # head dim must be even (rotary pairs)
    return list(range(step, hi + 1, step))


def param_matched_width(grt_cfg, target: int) -> int:
    """The dense width whose parameter count is nearest ``target`` (ties: the smaller width)."""
    return min(widths(grt_cfg.n_heads), key=lambda d: (abs(dense_params(
        d, grt_cfg.n_heads, grt_cfg.n_blocks, 4 * d, grt_cfg.vocab_size, True, grt_cfg.tie_head) - target), d))


def measure_tok_s(kind: str, cfg, batch_size: int, steps: int = 3, threads: int = 1) -> float:
    """Training throughput (fwd + bwd + AdamW) of a fresh model on random bytes, after one warm-up step."""
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        model = build_model(kind, cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(0, 256, (batch_size, cfg.block_size), generator=torch.Generator().manual_seed(0))
        for i in range(steps + 1):
            if i == 1:
                t0 = time.perf_counter()
            _, loss = model(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return steps * batch_size * cfg.block_size / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(prev)


def wall_matched_width(grt_cfg, start_width: int, batch_size: int, progress=None) -> tuple[int, list[dict]]:
    """Widen the dense model by factors of sqrt(2) until it trains slower than the GRT, then interpolate
    log(speed ratio) against log(width) between the last two points and round to an allowed width.

    Each dense timing is taken right after a GRT timing and compared as a *ratio*, so a machine whose
    load drifts (shared cores) biases both alike.
    """
    allowed = widths(grt_cfg.n_heads)
    probes: list[dict] = []
    d = start_width
    while True:
        grt_rate = measure_tok_s("grt", grt_cfg, batch_size)
        rate = measure_tok_s("dense", dense_family(grt_cfg, d), batch_size)
        probes.append({"d_model": d, "dense_tok_per_s": rate, "grt_tok_per_s": grt_rate, "ratio": rate / grt_rate})
        if progress:
            progress(f"calibrating wall-clock match: dense d_model={d}: {rate:.0f} tok/s vs GRT {grt_rate:.0f} "
                     f"(ratio {rate / grt_rate:.2f})")
        if rate <= grt_rate or d >= allowed[-1]:
            break
        d = min(allowed, key=lambda w: abs(w - d * math.sqrt(2)) if w > d else math.inf)
    if len(probes) == 1:
        return probes[0]["d_model"], probes
    (d0, r0), (d1, r1) = [(p["d_model"], p["ratio"]) for p in probes[-2:]]
    if r1 >= 1.0:  # never got slower (largest width reached)
        return d1, probes
    slope = (math.log(r1) - math.log(r0)) / (math.log(d1) - math.log(d0))
    d_star = math.exp(math.log(d0) - math.log(r0) / slope) if slope < 0 else d1  # where the ratio crosses 1
    return min(allowed, key=lambda w: (abs(w - d_star), w)), probes


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


def phase_train_config(args: argparse.Namespace, block_size: int, out_dir: Path, lr: float, tokens: int,
                       evals: int, eval_batches: int, ckpt_steps: int) -> dict:
    from lm.trainconfig import TrainConfig

    steps = max(1, math.ceil(tokens / (args.batch_size * block_size)))
    return TrainConfig(
        lr=lr, batch_size=args.batch_size, max_tokens=tokens, warmup_steps=min(50, max(1, steps // 10)),
        eval_interval=max(1, steps // evals), eval_batches=eval_batches, log_interval=max(1, steps // 100),
        gauge_interval=max(1, steps // 50), ckpt_interval=ckpt_steps, seed=args.seed, device=args.device, threads=1,
        data=args.data or "", out_dir=str(out_dir)).to_dict()
