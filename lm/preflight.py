"""Checks of a run against the machine before any work: a memory estimate, and the run folder (never overwritten:
refused, or moved aside with ``--force``)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import torch

from lm.checkpoint import checksum_path
from lm.models import DEPTH_KEY, config_to_dict, param_count
from lm.trainconfig import RUN_FILES, TrainConfig
from rmsgauge import check_output_dir


def available_memory(device: torch.device) -> int | None:
    """Free memory for a run on ``device`` in bytes (CUDA: free device memory; CPU: MemAvailable, capped by a
    cgroup limit), or None where the OS does not say."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    out = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        out = next((int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()
                    if ln.startswith("MemAvailable:")), None)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit.isdigit():
            out = min(out if out is not None else 1 << 62, int(limit) - used)
    return out


def check_memory(kind: str, model_cfg: Any, cfg: TrainConfig, device: torch.device, world: int = 1) -> None:
    """Refuse a run whose lower estimate of one rank's training memory exceeds what ``device`` has free.  The
    estimate counts the parameters on the meta device (nothing allocated): parameters, gradients and AdamW's two
    moments (exact), plus the activations kept for the backward pass (per token: a few tensors of width d per layer,
    the attention rows, the logits; the GRT keeps each butterfly stage's output)."""
    n = param_count(kind, model_cfg)
    size = 8 if cfg.dtype == "float64" else 4
    d = config_to_dict(model_cfg)
    D, T, H, V = d["d_model"], d["block_size"], d["n_heads"], d["vocab_size"]
    L, F = d[DEPTH_KEY[kind]], d.get("d_ff", 4 * D)
    if kind == "grt":  # each stage's output is kept: Q/K/V/O, mixer (width D), FFN expand/contract (width d_ff)
        per_layer = D * (4 * d.get("qkvo_stages", 1) + d.get("mixer_stages", 1)) + 2 * F * d.get("ffn_stages", 1)
    else:
        per_layer = 8 * D + 2 * F
    weights = 4 * n * size
    activations = max(1, cfg.batch_size // max(1, world)) * T * (L * (per_layer + H * T) + 3 * V) * size
    avail = available_memory(device)
    if avail is not None and weights + activations > avail:
        gb = 1e9
        raise ValueError(
            f"this run needs at least {(weights + activations) / gb:.2f} GB ({n:,} parameters: "
            f"{weights / gb:.2f} GB with gradients and AdamW moments, activations "
            f"{activations / gb:.2f} GB) but {device} has {avail / gb:.2f} GB available; reduce "
            f"model.d_model, model.{DEPTH_KEY[kind]}, model.block_size or train.batch_size")


def run_files(out: Path) -> list[str]:
    return [n for n in RUN_FILES if (out / n).exists()]


def set_aside(path: Path, *, sidecar: bool = False) -> Path:
    """Move ``path`` (a run folder, or a checkpoint and, with ``sidecar``, its ``.sha256``) to a fresh sibling
    ``<name>.replaced-<YYYYmmdd-HHMMSS>[-k]``; returns the new path."""
    def with_sidecar(p: Path) -> list[Path]:
        return [checksum_path(p), p] if sidecar else [p]

    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, k = path.with_name(f"{path.name}.replaced-{stamp}"), 2
    while any(p.exists() for p in with_sidecar(dest)):
        dest, k = path.with_name(f"{path.name}.replaced-{stamp}-{k}"), k + 1
    for src, dst in zip(with_sidecar(path), with_sidecar(dest)):
        if src.exists():
            os.replace(src, dst)
    return dest


def check_run_dir(out: str | Path, resume: bool, force: bool) -> None:
    """Refuse to start a new run over an existing one (before any work)."""
    out = check_output_dir("--out-dir", out)
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
