"""Checks before any work: model-config values, a memory estimate against the machine, the run folder
(never overwritten: refused, or moved aside with ``--force``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from lm.checkpoint import (
    build_model,
    config_to_dict,
)
from lm.trainconfig import RUN_FILES, TrainConfig
from rmsgauge import (
    check_output_dir,
    check_range,
)
from rmsgauge.corpus import VOCAB_SIZE

# ---------------------------------------------------------------------------------------------
# Checks before any work: model config, memory, the run folder
# ---------------------------------------------------------------------------------------------


def validate_model_config(kind: str, cfg: Any, tokenizer: str = "bytes") -> None:
    """What the model configs themselves do not check but training needs: the byte vocabulary (bytes; BPE: more
    than the 256 byte symbols), finite floats, non-negative epsilons and init scales."""
    check_model_values(config_to_dict(cfg), tokenizer)


def check_model_values(d: dict[str, Any], tokenizer: str = "bytes") -> None:
    """:func:`validate_model_config` on the config as a dict: run before the config class is built, so an error
    names the key the user set (``model.norm_eps``), not the class's own field."""
    v = d.get("vocab_size")
    if tokenizer == "bytes" and v != VOCAB_SIZE:
        raise ValueError(f"model.vocab_size must be {VOCAB_SIZE} (the tokens are bytes), got {v!r}")
    if tokenizer != "bytes" and not (isinstance(v, int) and v > VOCAB_SIZE):
        raise ValueError(f"model.vocab_size must be an integer above {VOCAB_SIZE} for BPE (the byte alphabet plus "
                         f"merges), got {v!r}")
    for name, v in d.items():
        if isinstance(v, float):
            lo = 0.0 if any(k in name for k in ("eps", "std")) else None
            check_range(f"model.{name}", v, lo, None)


def _n_layers_key(kind: str) -> str:
    return "n_blocks" if kind == "grt" else "n_layers"


def estimate_memory(kind: str, model_cfg: Any, cfg: TrainConfig, world: int = 1) -> dict[str, int]:
    """A lower estimate of one rank's training memory in bytes, from a parameter count on the meta device
    (nothing allocated): parameters, gradients and AdamW's two moments (exact), plus the activations kept
    for the backward pass (per token: a few tensors of width d per layer, the attention rows, the logits;
    the GRT keeps each butterfly stage's output)."""
    with torch.device("meta"):
        model = build_model(kind, model_cfg)
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    size = 8 if cfg.dtype == "float64" else 4
    d = config_to_dict(model_cfg)
    D, T, H, V = d["d_model"], d["block_size"], d["n_heads"], d["vocab_size"]
    L, F = d[_n_layers_key(kind)], d.get("d_ff", 4 * D)
    if kind == "grt":  # each stage's output is kept: Q/K/V/O, mixer (width D), FFN expand/contract (width d_ff)
        per_layer = D * (4 * d.get("qkvo_stages", 1) + d.get("mixer_stages", 1)) + 2 * F * d.get("ffn_stages", 1)
    else:
        per_layer = 8 * D + 2 * F
    per_token = L * (per_layer + H * T) + 3 * V
    tokens = max(1, cfg.batch_size // max(1, world)) * T
    return {"params": n, "weights_and_optimizer": 4 * n * size, "activations": tokens * per_token * size,
            "total": 4 * n * size + tokens * per_token * size}


def available_memory(device: torch.device) -> int | None:
    """Free memory for a run on ``device`` in bytes (CUDA: free device memory; CPU: MemAvailable, capped by a
    cgroup limit), or None where the OS does not say."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    out = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                out = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit.isdigit():
            out = min(out if out is not None else 1 << 62, int(limit) - used)
    except (OSError, ValueError):
        pass
    return out


def check_memory(kind: str, model_cfg: Any, cfg: TrainConfig, device: torch.device, world: int = 1) -> dict:
    est = estimate_memory(kind, model_cfg, cfg, world)
    avail = available_memory(device)
    if avail is not None and est["total"] > avail:
        gb = 1e9
        raise ValueError(
            f"this run needs at least {est['total'] / gb:.2f} GB ({est['params']:,} parameters: "
            f"{est['weights_and_optimizer'] / gb:.2f} GB with gradients and AdamW moments, activations "
            f"{est['activations'] / gb:.2f} GB) but {device} has {avail / gb:.2f} GB available; reduce "
            f"model.d_model, model.{_n_layers_key(kind)}, model.block_size or train.batch_size")
    return {**est, "available": avail}


def run_files(out: Path) -> list[str]:
    """The run files (:data:`RUN_FILES`) present in ``out``."""
    return [n for n in RUN_FILES if (out / n).exists()]


def set_aside(out: Path) -> Path:
    """Move the run folder ``out`` to a fresh sibling ``<name>.replaced-<YYYYmmdd-HHMMSS>[-k]``; returns it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = out.with_name(f"{out.name}.replaced-{stamp}")
    k = 2
    while dest.exists():
        dest = out.with_name(f"{out.name}.replaced-{stamp}-{k}")
        k += 1
    os.replace(out, dest)
    return dest


def check_run_dir(out: Path, resume: bool, force: bool) -> None:
    """Refuse to start a new run over an existing one (before any work)."""
    check_output_dir("--out-dir", out)
    if resume:
        if force:
            raise ValueError("--resume continues the run in --out-dir and --force starts over: give one of them")
        if not (out / "ckpt.pt").is_file():
            raise FileNotFoundError(f"--resume: no checkpoint at {out / 'ckpt.pt'} (start a new run without --resume)")
        return
    have = run_files(out)
    if have and not force:
        raise ValueError(f"--out-dir {out} already holds a run ({', '.join(have)}); continue it with --resume, "
                         f"or start over with --force (the old run is moved to {out.name}.replaced-<time>, "
                         f"not deleted), or choose another --out-dir")


