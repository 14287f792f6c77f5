r"""Train the GRT or the dense baseline on bytes: one process or many (torchrun), resumable exactly.

Usage (see ``--help``)::

    python -m lm.train --model dense                      # bundled Shakespeare, CPU-sized preset
    python -m lm.train --model grt --data my_texts/ --set lr=1e-3 --n-layers 6
    python -m lm.train --config run.json --out-dir runs/a # JSON: {"model", "train", "model_config"}
    python -m lm.train --recipe reference-grt             # a shipped reference model's exact run (lm.recipes)
    python -m lm.train --out-dir runs/a --resume           # continue exactly where runs/a stopped
    torchrun --nproc_per_node=4 -m lm.train --model grt    # data-parallel (gloo on CPU, nccl on CUDA)
    python -m lm.train sample --ckpt runs/a/ckpt.pt --prompt "ROMEO:"   # = python -m lm.sample

**Configuration.**  The model config is the model's own dataclass (:class:`lm.dense.DenseConfig`
or ``grt_model.config.GRTConfig``), starting from the CPU preset of
:func:`lm.checkpoint.default_model_config`; the loop's is :class:`TrainConfig`.  Layers, later
wins: defaults < ``--recipe NAME`` or ``--config FILE`` < ``--set key=value`` (bare keys: TrainConfig
first, then the model config; or ``train.key`` / ``model.key``) < explicit flags.  Every key, every
cross-field constraint (``lr * wd < 1``, heads dividing the width, the batch dividing across ranks), every
output path and a memory estimate are checked before any work, naming the key and the allowed range.  On
``--resume`` the base is the checkpoint's configs, and keys that shape the trajectory
(:data:`RESUME_LOCKED`) may not change; the run length (``max_steps`` / ``max_tokens``) may, to extend a
run, at the price of a recomputed cosine schedule.

**What is safe.**  A run folder is never overwritten: a new run into a folder that holds one
(``ckpt.pt``, ``log.jsonl`` or ``summary.json``) is refused, naming ``--resume`` (continue it) and
``--force`` (move it aside to ``<out>.replaced-<time>`` and start over).  Checkpoints are atomic and
carry a sha256 (``ckpt.pt.sha256``) verified on load; the corpus's sha256 is recorded and a resume on
changed data is refused.  A NaN or infinite loss or gradient norm stops the run before the bad step is
applied, keeps the last good checkpoint and exits 1.  Logs are strict JSON (a non-finite value is
``null``, its key listed under ``"nonfinite"``).

**Exact resume.**  Batch ``t`` is drawn by a generator seeded from ``(seed, t)`` alone
(:meth:`BatchSampler.train_batch`), the learning rate is a function of ``t``, the model has no
dropout, and the checkpoint holds the optimizer state, RNG states, the loop's running sums and the
hooks' state: so ``--stop-after k`` then ``--resume`` reproduces the uninterrupted run bit for bit on one
CPU process (``tests/test_train.py::test_resume_is_bit_exact``).  SIGINT/SIGTERM stop after the current
step with a checkpoint (acknowledged at once; a second Ctrl-C stops immediately).

**Hooks.**  The loop (:func:`_train`, nanoGPT-sized) calls step hooks (:mod:`lm.hooks`): ``on_start``,
``after_step``, ``on_end``; ``train(..., hooks=[...])`` passes them, and by default there are none.  The
command-line entry attaches :func:`monitor_hooks`: the equilibrium monitor of :mod:`dynamics.monitor` on the
gauges that :func:`gauge.census.census` finds in the model on a fixed probe batch (none in the GRT: then
nothing is attached and the census's empty verdict is recorded).  Both packages sit above ``lm``; only the
entry imports them, inside the function, so the loop's imports point down.

**Data parallel.**  Under ``torchrun`` (env ``WORLD_SIZE`` > 1) each rank draws the same global batch
of ``batch_size`` windows and keeps its contiguous shard of ``batch_size / WORLD_SIZE``; DDP averages
gradients, so the update is the one-process update on the global batch up to the order of the
floating-point sum (``tests/test_ddp.py``).  Only rank 0 writes logs and checkpoints.

**Logs.**  ``OUT/log.jsonl`` (one JSON object a line): ``start`` (configs, parameter counts, corpus
sha256, gauge census), ``train`` (loss, lr, tokens, tokens/s), ``eval`` (val loss and bits per byte
:math:`= \text{loss}/\ln 2`), ``equilibrium`` (the monitor's record: norm and per-step angle of every gauge
tensor against the rotational-equilibrium predictions of :mod:`dynamics.laws`), ``end`` (summary, also in
``OUT/summary.json``).  ``OUT/ckpt.pt`` is the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from lm.checkpoint import (
    MODEL_KINDS,
    build_model,
    config_from_dict,
    config_to_dict,
    default_model_config,
    load_checkpoint,
    model_classes,
    save_checkpoint,
    set_rng_state,
)
from lm.corpus import VOCAB_SIZE, ByteCorpus, corpus_files
from lm.errors import NonFiniteError, RunFailure
from lm.hooks import LoopInfo, StepHook
from rmsgauge import (
    Claim,
    atomic_write_json,
    atomic_write_text,
    check_choice,
    check_output_dir,
    check_output_file,
    check_range,
    parse_shared_args,
    reject_unknown_keys,
    seed_everything,
    write_claims_json,
)
from rmsgauge.atomic import clean_orphan_tmp, json_nulls
from rmsgauge.cli import OneLineArgumentParser, one_line, run_guarded

LN2 = math.log(2.0)
TRAIN_STREAM, VAL_STREAM, PROBE_STREAM = 0, 1, 2  # independent seed streams for the three kinds of batch
NO_DECAY_KEYWORDS = ("norm", "angle", "phase", "scale", "gate", "bias")  # see decay_split()
EQUILIBRIUM_FACTOR = 2.0  # the random-walk model is a statistical law, not an identity: agreement within x2
RUN_FILES = ("ckpt.pt", "log.jsonl", "summary.json")  # a folder holding any of these holds a run
WRITTEN_FILES = ("ckpt.pt", "ckpt.pt.sha256", "log.jsonl", "summary.json")  # what a run writes (orphan temp files)


@dataclass
class TrainConfig:
    lr: float = 3e-3  # peak learning rate (after warmup)
    min_lr_frac: float = 0.1  # cosine decays to min_lr_frac * lr at the last step
    warmup_steps: int = 50
    schedule: str = "cosine"  # cosine | constant (after warmup)
    wd: float = 0.1  # AdamW decoupled weight decay, on the tensors decay_split() selects
    beta1: float = 0.9
    beta2: float = 0.95  # language-model convention (GPT-3, Chinchilla)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0  # global gradient-norm clip; 0 disables
    batch_size: int = 16  # GLOBAL batch in windows of model.block_size bytes (split across DDP ranks)
    max_steps: int = 1000
    max_tokens: int = 0  # > 0 overrides max_steps: ceil(max_tokens / (batch_size * block_size)) steps
    eval_interval: int = 100  # 0: evaluate only at the start and the end
    eval_batches: int = 8  # validation batches (of batch_size windows) per evaluation, always the same ones
    log_interval: int = 10  # progress line + a "train" log record every N steps
    gauge_interval: int = 10  # the CLI's equilibrium monitor records every N steps; 0 attaches none
    ckpt_interval: int = 500  # 0: checkpoint only at the end (and on stop/interrupt)
    val_fraction: float = 0.1  # the last 10% of the corpus bytes are validation, never trained on
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "float32"  # float32 | float64 (float64: for equivalence tests)
    threads: int = 0  # torch CPU threads; 0 leaves torch's default
    data: str = ""  # "" = the bundled corpus; else a file or a folder of .txt/.md files (read as bytes)
    out_dir: str = "runs/train"
    probe_gauges: bool = True  # the CLI runs the gauge census at start (finds the gauges to monitor)

    def __post_init__(self) -> None:
        _float("train.lr", self.lr, 0.0, 10.0, lo_open=True)
        _float("train.min_lr_frac", self.min_lr_frac, 0.0, 1.0)
        _int("train.warmup_steps", self.warmup_steps, 0)
        _choice("train.schedule", self.schedule, ("cosine", "constant"))
        _float("train.wd", self.wd, 0.0, 10.0)
        if self.lr * self.wd >= 1.0:  # AdamW multiplies decayed weights by 1 - lr*wd every step
            raise ValueError(f"train.lr * train.wd must be in [0, 1) (AdamW scales the weights by 1 - lr*wd each "
                             f"step), got {self.lr:g} * {self.wd:g} = {self.lr * self.wd:g}")
        _float("train.beta1", self.beta1, 0.0, 1.0, hi_open=True)
        _float("train.beta2", self.beta2, 0.0, 1.0, hi_open=True)
        _float("train.adam_eps", self.adam_eps, 0.0, 1.0, lo_open=True)
        _float("train.grad_clip", self.grad_clip, 0.0)
        _int("train.batch_size", self.batch_size, 1)
        _int("train.max_steps", self.max_steps, 1)
        _int("train.max_tokens", self.max_tokens, 0)
        _int("train.eval_interval", self.eval_interval, 0)
        _int("train.eval_batches", self.eval_batches, 1)
        _int("train.log_interval", self.log_interval, 1)
        _int("train.gauge_interval", self.gauge_interval, 0)
        _int("train.ckpt_interval", self.ckpt_interval, 0)
        _float("train.val_fraction", self.val_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
        _int("train.seed", self.seed, 0, 2**32 - 1)
        if not isinstance(self.device, str) or not (
                self.device in ("auto", "cpu", "cuda")
                or (self.device.startswith("cuda:") and self.device[5:].isdigit())):
            raise ValueError(f"train.device must be one of auto, cpu, cuda, cuda:N; got {self.device!r}")
        _choice("train.dtype", self.dtype, ("float32", "float64"))
        _int("train.threads", self.threads, 0, 1024)
        if not isinstance(self.data, str):
            raise ValueError(f"train.data must be a path string (\"\" = the bundled corpus), got {self.data!r}")
        if not isinstance(self.out_dir, str) or not self.out_dir:
            raise ValueError(f"train.out_dir must be a non-empty folder path, got {self.out_dir!r}")
        if not isinstance(self.probe_gauges, bool):
            raise ValueError(f"train.probe_gauges must be true or false, got {self.probe_gauges!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def total_steps(self, block_size: int) -> int:
        if self.max_tokens > 0:
            return max(1, math.ceil(self.max_tokens / (self.batch_size * block_size)))
        return self.max_steps

    def lr_at(self, step: int, total: int) -> float:
        """Linear warmup over ``warmup_steps``, then constant or cosine down to ``min_lr_frac * lr``."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return self.lr
        progress = (step - self.warmup_steps) / max(1, total - 1 - self.warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_frac + (1.0 - self.min_lr_frac) * cosine)


# keys that shape the trajectory: changing them on --resume would not continue the same run
RESUME_LOCKED = ("lr", "min_lr_frac", "warmup_steps", "schedule", "wd", "beta1", "beta2", "adam_eps", "grad_clip",
                 "batch_size", "seed", "dtype", "data", "val_fraction")


def _float(name: str, v: Any, lo: float | None, hi: float | None = None, **kw) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{name} must be a number, got {v!r}")
    check_range(name, v, lo, hi, **kw)


def _int(name: str, v: Any, lo: int, hi: int | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an integer in [{lo}, {'inf' if hi is None else hi}], got {v!r}")
    check_range(name, v, lo, hi)


def _choice(name: str, v: Any, choices: tuple[str, ...]) -> None:
    check_choice(name, v, choices)


# ---------------------------------------------------------------------------------------------
# Checks before any work: model config, memory, the run folder
# ---------------------------------------------------------------------------------------------


def validate_model_config(kind: str, cfg: Any) -> None:
    """What the model configs themselves do not check but training needs: byte vocabulary, finite floats,
    non-negative epsilons and init scales."""
    check_model_values(config_to_dict(cfg))


def check_model_values(d: dict[str, Any]) -> None:
    """:func:`validate_model_config` on the config as a dict: run before the config class is built, so an error
    names the key the user set (``model.norm_eps``), not the class's own field."""
    if d.get("vocab_size") != VOCAB_SIZE:
        raise ValueError(f"model.vocab_size must be {VOCAB_SIZE} (the tokens are bytes), got {d.get('vocab_size')!r}")
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


# ---------------------------------------------------------------------------------------------
# Data: batches as a function of (seed, step), sharded across ranks
# ---------------------------------------------------------------------------------------------


def _generator(seed: int, stream: int, index: int) -> torch.Generator:
    # SeedSequence mixes (seed, stream, index) into a well-spread 32-bit seed: neighbouring steps
    # get unrelated streams, and the mapping is fixed across numpy versions (NEP 19).
    state = int(np.random.SeedSequence([seed, stream, index]).generate_state(1)[0])
    return torch.Generator().manual_seed(state)


class BatchSampler:
    """Random windows of ``block_size + 1`` bytes, entirely inside one split (train or val).

    ``train_batch(step)`` draws the global batch's window starts from ``(seed, step)`` and returns
    this rank's contiguous shard: the same global batch whatever the world size.
    """

    def __init__(self, corpus: ByteCorpus, block_size: int, global_batch: int, seed: int, rank: int = 0,
                 world: int = 1, device: torch.device | str = "cpu") -> None:
        self.T, self.B, self.seed, self.rank, self.world = block_size, global_batch, seed, rank, world
        self.b = global_batch // world  # this rank's share
        self.device = torch.device(device)
        self.splits = {name: torch.from_numpy(corpus.split(name).copy()) for name in ("train", "val")}  # uint8
        for name, data in self.splits.items():
            if len(data) < block_size + 2:
                raise ValueError(
                    f"the {name} split has {len(data)} bytes, fewer than model.block_size + 2 = {block_size + 2}; "
                    f"use a larger corpus, a smaller model.block_size, or a different train.val_fraction")
        self._arange = torch.arange(block_size + 1)

    def _windows(self, split: str, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = starts.unsqueeze(1) + self._arange.unsqueeze(0)  # (b, T+1)
        chunk = self.splits[split][idx].long()
        return chunk[:, :-1].to(self.device), chunk[:, 1:].to(self.device)  # (b, T) each

    def _starts(self, split: str, stream: int, index: int, n: int) -> torch.Tensor:
        high = len(self.splits[split]) - self.T  # start <= N - T - 1: the target window ends inside the split
        return torch.randint(0, high, (n,), generator=_generator(self.seed, stream, index))

    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self._starts("train", TRAIN_STREAM, step, self.B)  # (B,) the global batch
        return self._windows("train", starts[self.rank * self.b:(self.rank + 1) * self.b])

    def val_batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self._starts("val", VAL_STREAM, i, self.B)
        return self._windows("val", starts[self.rank * self.b:(self.rank + 1) * self.b])

    def probe_batch(self, n: int = 2, t: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self._starts("val", PROBE_STREAM, 0, n)
        idx = starts.unsqueeze(1) + torch.arange(min(t, self.T) + 1).unsqueeze(0)
        chunk = self.splits["val"][idx].long()
        return chunk[:, :-1], chunk[:, 1:]


# ---------------------------------------------------------------------------------------------
# Distributed context
# ---------------------------------------------------------------------------------------------


@dataclass
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False  # we called init_process_group, so we tear it down

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: str) -> DistContext:
        """Read torchrun's env (RANK, WORLD_SIZE, LOCAL_RANK); join the process group when WORLD_SIZE > 1."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
        dev = resolve_device(device, local if world > 1 else None)
        owns = False
        if world > 1 and not dist.is_initialized():
            backend = "nccl" if dev.type == "cuda" else "gloo"
            if dev.type == "cuda":
                torch.cuda.set_device(dev)
            dist.init_process_group(backend=backend, rank=rank, world_size=world)
            owns = True
        return cls(rank, world, local, dev, owns)

    def all_mean(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            x = x.clone()
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            x /= self.world
        return x

    def any_flag(self, flag: bool) -> bool:
        return self.any_flags(flag)[0]

    def any_flags(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag OR-ed over the ranks, in one collective (every rank takes the same branch)."""
        if self.world == 1:
            return tuple(bool(f) for f in flags)
        t = torch.tensor([1.0 if f else 0.0 for f in flags], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return tuple(bool(v > 0) for v in t.tolist())

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def resolve_device(device: str, local_rank: int | None = None) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"train.device={device!r} but CUDA is not available; use --device cpu or auto")
        if device == "cuda" and local_rank is not None:
            device = f"cuda:{local_rank}"
    return torch.device(device)


# ---------------------------------------------------------------------------------------------
# Optimizer, parameter accounting
# ---------------------------------------------------------------------------------------------


def decay_split(model: nn.Module) -> tuple[list[str], list[str]]:
    """Names that get weight decay: tensors with >= 2 dims (matrices, couplings, embedding tables),
    except those whose name marks a norm gain, angle/phase, scale, gate or bias (decay would pull an
    angle toward 0 or a softplus scale toward 0.69, a bias with no meaning)."""
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        low = n.lower()
        (decay if p.ndim >= 2 and not any(k in low for k in NO_DECAY_KEYWORDS) else no_decay).append(n)
    return decay, no_decay


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    decay, no_decay = decay_split(model)
    params = dict(model.named_parameters())
    groups = [{"params": [params[n] for n in decay], "weight_decay": cfg.wd, "names": decay},
              {"params": [params[n] for n in no_decay], "weight_decay": 0.0, "names": no_decay}]
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


COMPONENTS = (("norm", ("norm",)), ("gate", ("gate",)), ("embedding", ("emb", "embed")),
              ("attention", ("attn", "q_proj", "k_proj", "v_proj", "o_proj")), ("mixer", ("mixer",)),
              ("ffn", ("mlp", "ffn", "expand", "contract")), ("head", ("head", "unembed")))


def param_breakdown(model: nn.Module) -> dict[str, int]:
    """Parameter counts by component: the first keyword (in :data:`COMPONENTS` order, norms and gates
    first so ``norm_attn`` is a norm) found in the dotted name wins; else ``other``.  Tied tensors count once."""
    out = {name: 0 for name, _ in COMPONENTS}
    out["other"] = 0
    seen = set()
    for n, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        low = n.lower()
        comp = next((name for name, keys in COMPONENTS if any(k in low for k in keys)), "other")
        out[comp] += p.numel()
    out = {k: v for k, v in out.items() if v}
    out["total"] = sum(out.values())
    return out



# ---------------------------------------------------------------------------------------------
# Progress line and JSON-lines log
# ---------------------------------------------------------------------------------------------


class Progress:
    """One status line on stderr: rewritten in place on a terminal, one line per update otherwise."""

    def __init__(self, total: int, enabled: bool, label: str = "") -> None:
        self.total, self.enabled, self.label = total, enabled, label
        self.tty = enabled and sys.stderr.isatty()

    def update(self, step: int, loss: float, tok_s: float, lr: float, eta_s: float, extra: str = "") -> None:
        if not self.enabled:
            return
        frac = step / self.total
        bar = "#" * int(20 * frac) + "." * (20 - int(20 * frac))
        line = (f"{self.label}[{bar}] {step}/{self.total} loss {loss:.4f} | {tok_s / 1e3:.1f}k tok/s | "
                f"lr {lr:.2e} | eta {_fmt_time(eta_s)}{extra}")
        if self.tty:
            sys.stderr.write("\r" + line.ljust(110))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def message(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(("\n" if self.tty else "") + text + "\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _fmt_time(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = round(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class JsonLog:
    """Append-only JSON lines (rank 0 only), strict JSON: a non-finite number is written as ``null`` and its
    key listed under ``"nonfinite"``.  On resume, records after the checkpoint's step are dropped first
    (they belong to the interrupted tail that is about to be recomputed)."""

    def __init__(self, path: Path | None, resume_step: int | None) -> None:
        self.path = path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            path.write_text("")
        elif path.exists():
            keep = [ln for ln in path.read_text().splitlines() if _step_of(ln) <= resume_step]
            atomic_write_text(path, "".join(ln + "\n" for ln in keep))

    def write(self, record: dict) -> None:
        if self.path is None:
            return
        clean, bad = json_nulls(record)
        if bad:
            clean["nonfinite"] = bad
        with self.path.open("a") as fh:
            fh.write(json.dumps(clean, allow_nan=False) + "\n")


def _step_of(line: str) -> float:
    """A log line's step; a blank or half-written line (a crash mid-write) sorts after everything."""
    try:
        return float(json.loads(line).get("step", -1))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return math.inf


def read_log(path: str | os.PathLike) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


class _StopFlag:
    """SIGINT/SIGTERM set a flag, acknowledged at once on stderr; the loop checks it between steps (never
    mid-update) and stops with a checkpoint.  A second signal stops at once (KeyboardInterrupt)."""

    def __init__(self) -> None:
        self.raised = False
        self.busy = "training"  # what the loop is doing, for the acknowledgement ("evaluating", ...)
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.raised:
            sys.stderr.write(f"\n{name} again: stopping now, without a new checkpoint\n")
            raise KeyboardInterrupt(name)
        self.raised = True
        sys.stderr.write(f"\n{name} received while {self.busy}: stopping after the current step with a checkpoint "
                         f"(send it again to stop at once)\n")
        sys.stderr.flush()

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


@torch.no_grad()
def evaluate(model: nn.Module, sampler: BatchSampler, n_batches: int, ctx: DistContext) -> float:
    """Mean validation loss (nats/byte) over the fixed validation batches, averaged over ranks."""
    was = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for i in range(n_batches):
        x, y = sampler.val_batch(i)
        total += model(x, y)[1].double()
    model.train(was)
    return float(ctx.all_mean(total / n_batches))


def grad_norm(model: nn.Module, clip: float) -> float:
    """The global gradient norm (before clipping); clips to ``clip`` when ``clip > 0``."""
    params = [p for p in model.parameters() if p.grad is not None]
    if clip > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, clip))
    if not params:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.double()) for p in params])))


def machine_description() -> str:
    """CPU model, logical CPUs, torch version and OS: where a run's timings come from."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, {platform.system()}"


# ---------------------------------------------------------------------------------------------
# The run: its state, the named steps (prepare, evaluate, checkpoint, log, finish), the loop
# ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    """Everything the loop and its steps share (rank-local)."""

    ctx: DistContext
    kind: str
    cfg: TrainConfig
    model: nn.Module
    ddp_model: nn.Module  # the model under DistributedDataParallel when world > 1, else the model
    opt: torch.optim.Optimizer
    sampler: BatchSampler
    corpus_sha256: str
    out: Path
    log: JsonLog
    bar: Progress
    hooks: list
    label: str
    total: int
    start: int
    tokens_seen: int
    interval_sum: torch.Tensor  # float64 sum of the losses since the last "train" record
    interval_n: int
    train_time: float  # seconds spent in training steps (resumed runs included)
    evals: list[dict]
    last_ckpt_step: int | None  # the step of the checkpoint on disk, if any
    t_wall0: float = field(default_factory=time.perf_counter)
    last_loss: float = math.nan
    t_int: float = field(default_factory=time.perf_counter)  # start of the current tokens/s interval
    tok_int: int = 0
    run_t0: float = field(default_factory=time.perf_counter)
    run_tokens0: int = 0

    @property
    def ckpt_path(self) -> Path:
        return self.out / "ckpt.pt"

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.batch_size * int(self.model.config.block_size)


def _agree(ctx: DistContext, error: BaseException | None) -> None:
    """Raise ``error`` on rank 0 and a pointer to it on the other ranks, so no rank waits at a collective."""
    if ctx.any_flag(error is not None):
        raise error if error is not None else ValueError("rank 0 refused to start the run (see its error)")


def prepare(ctx: DistContext, kind: str, model_cfg: Any, cfg: TrainConfig, *, resume: bool, force: bool,
            hooks: list, progress: bool, log_name: str, label: str) -> Run:
    """Check everything, then (only then) set the folder up, build, restore and log the start."""
    out = Path(cfg.out_dir)
    error = None
    if ctx.is_main:
        try:
            check_run_dir(out, resume, force)
        except (ValueError, FileNotFoundError) as e:
            error = e
    _agree(ctx, error)
    if cfg.batch_size % ctx.world:
        raise ValueError(f"train.batch_size ({cfg.batch_size}) must be divisible by WORLD_SIZE ({ctx.world})")
    validate_model_config(kind, model_cfg)
    check_memory(kind, model_cfg, cfg, ctx.device, ctx.world)
    corpus = ByteCorpus.load(cfg.data or None, cfg.val_fraction)
    T = int(model_cfg.block_size)
    sampler = BatchSampler(corpus, T, cfg.batch_size, cfg.seed, ctx.rank, ctx.world, ctx.device)
    ckpt = load_checkpoint(out / "ckpt.pt", map_location="cpu") if resume else None
    extra = dict(ckpt["extra"]) if ckpt is not None else {}
    old_sha = extra.get("corpus_sha256")
    if old_sha is not None and old_sha != corpus.sha256:
        raise ValueError(f"the data changed since the checkpoint in {out} was written (corpus sha256 "
                         f"{corpus.sha256[:16]}... != {old_sha[:16]}...); --resume continues the same run on the "
                         f"same bytes (restore the data, or start a new run)")
    total = cfg.total_steps(T)
    if ckpt is not None and int(ckpt["step"]) >= total:
        raise ValueError(f"checkpoint {out / 'ckpt.pt'} is at step {ckpt['step']}, already >= the run's {total} "
                         f"steps; raise train.max_steps (or max_tokens) to continue")

    if ctx.is_main:  # from here on the folder changes
        if force and run_files(out):
            moved = set_aside(out)
            sys.stderr.write(f"--force: moved the earlier run in {out} to {moved}\n")
        out.mkdir(parents=True, exist_ok=True)
        for tmp in clean_orphan_tmp(out, WRITTEN_FILES):
            sys.stderr.write(f"removed {tmp.name}, left by a write that was killed\n")
    if ctx.world > 1:
        dist.barrier()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = build_model(kind, model_cfg).to(device=ctx.device, dtype=getattr(torch, cfg.dtype))
    opt = make_optimizer(model, cfg)
    start = 0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        set_rng_state(ckpt["rng"])
        start = int(ckpt["step"])
        for h in hooks:
            if hasattr(h, "load_state_dict") and _hook_name(h) in extra.get("hooks", {}):
                h.load_state_dict(extra["hooks"][_hook_name(h)])
    ddp_model: nn.Module = model
    if ctx.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp_model = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    run = Run(ctx, kind, cfg, model, ddp_model, opt, sampler, corpus.sha256, out,
              JsonLog(out / log_name if ctx.is_main else None, start if ckpt is not None else None),
              Progress(total, progress and ctx.is_main, label), hooks, label, total, start,
              int(ckpt["tokens_seen"]) if ckpt is not None else 0,
              torch.tensor(extra.get("interval_loss_sum", 0.0), dtype=torch.float64, device=ctx.device),
              int(extra.get("interval_n", 0)), float(extra.get("train_time", 0.0)), list(extra.get("evals", [])),
              start if ckpt is not None else None)
    run.run_tokens0 = run.tokens_seen
    info = LoopInfo(kind, cfg, start, total, ctx.is_main, sampler.probe_batch, run.log.write,
                    lambda text: run.bar.message(f"{label}{text}"))
    start_fields: dict[str, Any] = {}
    for h in hooks:
        start_fields.update(h.on_start(model, opt, info) or {})
    run.log.write({"event": "resume" if ckpt is not None else "start", "step": start, "model": kind,
                   "model_config": config_to_dict(model_cfg), "train_config": cfg.to_dict(), "total_steps": total,
                   "params": param_breakdown(model), "world_size": ctx.world, "device": str(ctx.device),
                   "dtype": cfg.dtype, "corpus_sha256": corpus.sha256,
                   "corpus_bytes": {"train": len(sampler.splits["train"]), "val": len(sampler.splits["val"])},
                   **start_fields,
                   "decay_tensors": sorted(n for g in opt.param_groups if g["weight_decay"] > 0 for n in g["names"])})
    return run


def _hook_name(hook: Any) -> str:
    return getattr(hook, "name", type(hook).__name__)


def run_eval(run: Run, step: int, stop: _StopFlag | None = None) -> None:
    """Evaluate, log an ``eval`` record; a non-finite validation loss stops the run."""
    if stop is not None:
        stop.busy = f"evaluating at step {step}"
    vl = evaluate(run.model, run.sampler, run.cfg.eval_batches, run.ctx)
    if stop is not None:
        stop.busy = "training"
    rec = {"event": "eval", "step": step, "tokens": step * run.tokens_per_step, "val_loss": vl, "val_bpb": vl / LN2,
           "train_time_s": run.train_time}  # seconds of training so far: curves against wall-clock
    run.evals.append({k: rec[k] for k in ("step", "tokens", "val_loss", "val_bpb", "train_time_s")})
    run.log.write(rec)
    if not math.isfinite(vl):
        raise NonFiniteError(f"the validation loss at step {step} is {vl} (non-finite); training stopped. "
                             + _kept(run))
    run.t_int, run.tok_int = time.perf_counter(), 0


def save(run: Run, step: int) -> None:
    """Checkpoint (rank 0): weights, optimizer, RNG, the loop's sums, the hooks' state, the corpus hash."""
    if run.ctx.is_main:
        extra = {"interval_loss_sum": float(run.interval_sum), "interval_n": run.interval_n,
                 "train_time": run.train_time, "evals": run.evals, "corpus_sha256": run.corpus_sha256,
                 "hooks": {_hook_name(h): h.state_dict() for h in run.hooks if hasattr(h, "state_dict")}}
        save_checkpoint(run.ckpt_path, model_kind=run.kind, model=run.model, optimizer=run.opt,
                        train_config=run.cfg.to_dict(), step=step, tokens_seen=run.tokens_seen, extra=extra)
    run.last_ckpt_step = step
    if run.ctx.world > 1:
        dist.barrier()  # nobody runs ahead of a checkpoint that may be resumed from
    run.t_int, run.tok_int = time.perf_counter(), 0


def log_train(run: Run, step: int, lr: float, loss: torch.Tensor) -> None:
    """A ``train`` record and the progress line (every ``log_interval`` steps)."""
    avg = float(run.ctx.all_mean(run.interval_sum / run.interval_n))
    run.last_loss = float(run.ctx.all_mean(loss.detach().double()))
    now = time.perf_counter()
    tok_s = (run.tok_int + run.tokens_per_step) / max(now - run.t_int, 1e-9)
    rate = (run.tokens_seen - run.run_tokens0) / max(now - run.run_t0, 1e-9)
    run.log.write({"event": "train", "step": step, "tokens": run.tokens_seen, "loss": run.last_loss,
                   "loss_avg": avg, "lr": lr, "tok_per_s": tok_s, "elapsed_s": now - run.t_wall0})
    run.bar.update(step, avg, tok_s, lr, (run.total - step) * run.tokens_per_step / max(rate, 1e-9))
    run.interval_sum.zero_()
    run.interval_n = 0
    run.t_int, run.tok_int = time.perf_counter(), 0


def _kept(run: Run) -> str:
    if run.last_ckpt_step is None:
        return "No checkpoint was written before it (nothing to resume)."
    return (f"The last good checkpoint, {run.ckpt_path} at step {run.last_ckpt_step}, is kept "
            f"(--resume continues from it).")


def fail_nonfinite(run: Run, step: int, loss: float, gnorm: float) -> None:
    """Log the bad step (values as null) and stop: the update was not applied."""
    run.log.write({"event": "nonfinite", "step": step, "loss": loss, "grad_norm": gnorm})
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    raise NonFiniteError(f"step {step}: the training {what} is {loss if what == 'loss' else gnorm} (non-finite); "
                         f"the step was not applied and training stopped. {_kept(run)} Lower train.lr or check "
                         f"the model config (e.g. a norm eps).")


def finish(run: Run, interrupted: bool, done: int) -> dict[str, Any]:
    """The run summary: logged as ``end``, written to ``OUT/summary.json``, returned."""
    run.bar.close()
    cfg, last = run.cfg, (run.evals[-1] if run.evals else {})
    summary = {
        "model": run.kind, "label": run.label.strip(), "steps": done, "total_steps": run.total,
        "complete": done >= run.total, "interrupted": interrupted,
        "tokens_seen": run.tokens_seen, "train_time_s": run.train_time,
        "wall_time_s": time.perf_counter() - run.t_wall0,
        "tokens_per_s": run.tokens_seen / run.train_time if run.train_time > 0 else math.nan,
        "final_train_loss": run.last_loss, "final_val_loss": last.get("val_loss", math.nan),
        "final_val_bpb": last.get("val_bpb", math.nan), "final_val_step": last.get("step"), "evals": run.evals,
        "params": param_breakdown(run.model), "world_size": run.ctx.world, "device": str(run.ctx.device),
        "dtype": cfg.dtype, "machine": machine_description(), "corpus_sha256": run.corpus_sha256,
        "model_config": config_to_dict(run.model.config), "train_config": cfg.to_dict(),
    }
    for h in run.hooks:
        h.on_end(summary)
    if run.ctx.is_main:
        run.log.write({"event": "end", "step": done, **{k: v for k, v in summary.items() if k != "evals"}})
        atomic_write_json(run.out / "summary.json", summary)
    return summary


def train(model_kind: str, model_cfg: Any, cfg: TrainConfig, *, resume: bool = False, stop_after: int | None = None,
          progress: bool = True, log_name: str = "log.jsonl", label: str = "", force: bool = False,
          hooks: list[StepHook] | None = None) -> dict[str, Any]:
    """Train and return the run summary (also written to ``OUT/summary.json`` by rank 0).

    ``resume``: continue from ``OUT/ckpt.pt``.  ``force``: a folder that holds a run is moved aside first
    (without it, such a folder is refused).  ``stop_after``: stop (with a checkpoint) once this global step
    is done, as an interruption would.  ``hooks``: step hooks (:mod:`lm.hooks`); default none (the command-line
    entry passes :func:`monitor_hooks`).
    """
    ctx = DistContext.from_env(cfg.device)
    try:
        hooks = [] if hooks is None else list(hooks)
        return _train(ctx, model_kind, model_cfg, cfg, resume, force, stop_after, progress, log_name, label, hooks)
    finally:
        ctx.close()


def _train(ctx: DistContext, kind: str, model_cfg: Any, cfg: TrainConfig, resume: bool, force: bool,
           stop_after: int | None, progress: bool, log_name: str, label: str, hooks: list) -> dict[str, Any]:
    run = prepare(ctx, kind, model_cfg, cfg, resume=resume, force=force, hooks=hooks, progress=progress,
                  log_name=log_name, label=label)
    model, opt, total = run.model, run.opt, run.total
    done, interrupted = run.start, False
    with _StopFlag() as stop:
        if run.start == 0:
            run_eval(run, 0, stop)
        model.train()
        for step in range(run.start, total):
            t_step = time.perf_counter()
            lr = cfg.lr_at(step, total)
            for g in opt.param_groups:
                g["lr"] = lr
            x, y = run.sampler.train_batch(step)  # (b, T) each: this rank's shard of the global batch
            _, loss = run.ddp_model(x, y)
            loss.backward()
            gnorm = grad_norm(model, cfg.grad_clip)
            loss_val = float(loss.detach())
            stop_seen, bad = ctx.any_flags(stop.raised, not (math.isfinite(loss_val) and math.isfinite(gnorm)))
            if bad:
                fail_nonfinite(run, step + 1, loss_val, gnorm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            done = step + 1
            run.tokens_seen += run.tokens_per_step
            run.interval_sum += loss.detach().double()
            run.interval_n += 1
            run.train_time += time.perf_counter() - t_step
            if done % cfg.log_interval == 0 or done == total:
                log_train(run, done, lr, loss)
            else:
                run.tok_int += run.tokens_per_step
            for h in hooks:
                h.after_step(done, lr)
            if (cfg.eval_interval > 0 and done % cfg.eval_interval == 0) or done == total:
                run_eval(run, done, stop)
            stopping = (stop_seen or (ctx.world == 1 and stop.raised)
                        or (stop_after is not None and done >= stop_after))
            if (cfg.ckpt_interval > 0 and done % cfg.ckpt_interval == 0) or done == total or stopping:
                save(run, done)
            if stopping:
                interrupted = stop.raised
                run.log.write({"event": "stopped", "step": done, "signal": interrupted})
                run.bar.message(f"{label}stopped at step {done}; checkpoint {run.ckpt_path} (continue with --resume)")
                break
    return finish(run, interrupted, done)


def expected_gauges(kind: str, model_config: dict[str, Any]) -> list[str] | None:
    """The gauges the theory predicts at eps = 0 (where the census judges exactness), from the model config.

    Dense: with QK-norm each layer's ``q_proj`` and ``k_proj`` weights, whose outputs feed the per-head RMSNorm
    directly; without it none (every other weight reaches the loss through a residual sum, a nonlinearity or the
    logits, which see its scale).  GRT: None (no closed prediction; the census decides).
    """
    if kind != "dense":
        return None
    if not model_config.get("qk_norm", False):
        return []
    return [f"blocks.{i}.attn.{w}_proj.weight" for i in range(int(model_config["n_layers"])) for w in ("q", "k")]


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    if not xs:
        return math.nan
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else 0.5 * (xs[m - 1] + xs[m])


def equilibrium_medians(summary: dict[str, Any]) -> dict[str, float]:
    """Medians over the monitored gauge groups of the tail-mean angle against the equilibrium prediction and
    against AdamW's random-walk angle at the current norm (nan where no group has the prediction)."""
    groups = (summary.get("equilibrium") or {}).get("groups") or {}
    ratio = [g["angle_ratio"] for g in groups.values() if g.get("angle_ratio") is not None]
    rw = [g["rw_ratio"] for g in groups.values() if g.get("rw_ratio") is not None]
    eq = [g["angle_eq"] for g in groups.values() if g.get("angle_eq") is not None]
    return {"ratio_to_eq": _median(ratio), "ratio_to_rw": _median(rw), "angle_eq": _median(eq)}


def summary_claims(summary: dict[str, Any]) -> list[Claim]:
    """The run's two checkable statements as claim records (for ``--json``)."""
    claims = []
    found = summary.get("gauge_census") or {}
    if found.get("source") == "census":
        exp = expected_gauges(summary["model"], summary["model_config"])
        measured = sorted([*found["gauges"], *found.get("partial", {})])
        claims.append(Claim(
            id="lm.gauge_census",
            statement="The scale of a weight that feeds an RMSNorm is a gauge the loss cannot see (QK-norm: W_q, "
                      "W_k).",
            stated=exp, measured=measured, tolerance=found["tolerance_float64"],
            holds=sorted(exp) == measured if exp is not None else True,
            dtype="float64", source_status="exact" if exp is not None else "not_a_source_claim",
            exact_law=f"L(cW) = L(W) for c in {found.get('scales')} to float64 round-off at eps = 0 "
                      f"(gauge.census), and a non-radial move is visible",
            details={"partitions": found.get("partitions"), "unused": found.get("unused"),
                     "probe_loss": found.get("loss")}))
    eq = summary.get("equilibrium") or {}
    if eq.get("groups"):
        med = equilibrium_medians(summary)
        rw = med["ratio_to_rw"]
        relax = next(iter(eq["groups"].values())).get("relax_steps")
        claims.append(Claim(
            id="lm.rotational_equilibrium_angle",
            statement="A gauge weight under AdamW rotates per step by the equilibrium angle, cos phi = (q+b1)/(1+b1 q) "
                      "with q = 1 - lr wd (first order sqrt(2 lr wd (1-b1)/(1+b1)), Kosson et al. arXiv:2305.17212); "
                      "at its current norm the random-walk model predicts atan(lr sqrt(C (1-b1)/(1+b1)) / (q ||W||)).",
            stated={"angle_eq_median_over_groups": med["angle_eq"]},
            measured={"median_ratio_to_random_walk": rw, "median_ratio_to_equilibrium": med["ratio_to_eq"]},
            tolerance=EQUILIBRIUM_FACTOR,
            holds=bool(math.isfinite(rw) and 1 / EQUILIBRIUM_FACTOR <= rw <= EQUILIBRIUM_FACTOR),
            dtype=summary["dtype"], source_status="approximate",
            exact_law="random-walk model (statistical); equilibrium needs about "
                      f"{_fmt_steps(relax)} steps per e-fold of the norm at the last recorded lr "
                      f"(dynamics.laws.relaxation_steps), the run had {summary['steps']}",
            details={"tail_steps": eq.get("tail_steps"), "n_groups": len(eq["groups"])}))
    return claims


def _fmt_steps(v: Any) -> str:
    return f"{v:.0f}" if isinstance(v, (int, float)) and math.isfinite(v) else "infinitely many"


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def _parse_value(key: str, raw: str, current: Any) -> Any:
    """Parse a ``--set`` string to the type of the key's current value."""
    try:
        if isinstance(current, bool):
            low = raw.strip().lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return low in ("true", "1", "yes")
        if isinstance(current, int):
            return int(raw)
        if isinstance(current, float):
            return float(raw)
        if isinstance(current, (list, tuple)):
            return type(current)(json.loads(raw)) if raw.strip().startswith("[") else type(current)(
                type(current[0])(v) for v in raw.split(","))
        if current is None:
            return json.loads(raw)
        return raw
    except (ValueError, TypeError, json.JSONDecodeError):
        raise ValueError(f"{key}: cannot read {raw!r} as {type(current).__name__}") from None


TRAIN_FLAGS = ("lr", "batch_size", "max_steps", "max_tokens", "eval_interval", "seed", "device", "threads", "data",
               "dtype")  # flags that set the TrainConfig key of the same name
MODEL_FLAGS = {"d_model": "d_model", "n_heads": "n_heads", "n_layers": None, "seq_len": "block_size"}  # None: by kind


def _base_config(args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """The ``--recipe`` or ``--config`` layer as ``{"model", "train", "model_config"}``, and the recipe's out dir."""
    if args.recipe and args.config:
        raise ValueError("--recipe and --config both give the whole configuration: use one of them")
    if args.recipe:
        from lm.recipes import get_recipe

        r = get_recipe(args.recipe)
        return r.config_json(), r.default_out_dir
    if not args.config:
        return {}, None
    try:
        file_cfg = json.loads(Path(args.config).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--config {args.config}: {one_line(e)}") from None
    if not isinstance(file_cfg, dict):
        raise ValueError(f"--config {args.config}: expected a JSON object with keys model, train, model_config")
    reject_unknown_keys("--config top-level", file_cfg, ("model", "train", "model_config"))
    for key in ("train", "model_config"):
        if not isinstance(file_cfg.get(key, {}), dict):
            raise ValueError(f"--config {args.config}: {key!r} must be a JSON object")
    return file_cfg, None


def resolve(args: argparse.Namespace) -> tuple[str, Any, TrainConfig, bool]:
    """Build (model kind, model config, train config, resume) from defaults, checkpoint, recipe or file, --set,
    flags."""
    file_cfg, recipe_out = _base_config(args)
    out_dir = args.out_dir if args.out_dir is not None else (
        recipe_out or file_cfg.get("train", {}).get("out_dir") or TrainConfig.out_dir)
    if out_dir == "":
        raise ValueError("--out-dir must be a folder path, got an empty string")
    ckpt = None
    if args.resume:
        if args.force:
            raise ValueError("--resume continues the run in --out-dir and --force starts over: give one of them")
        ckpt = load_checkpoint(Path(out_dir) / "ckpt.pt")
        kind = ckpt["model_kind"]
        if args.model and args.model != kind:
            raise ValueError(f"--model {args.model} but the checkpoint in {out_dir} is a {kind} model")
        mdict, tdict = dict(ckpt["model_config"]), dict(ckpt["train_config"])
    else:
        kind = args.model or file_cfg.get("model", "dense")
        check_choice("model", kind, MODEL_KINDS)
        if args.model and file_cfg.get("model", args.model) != args.model:
            raise ValueError(f"--model {args.model} but the {'recipe' if args.recipe else '--config'} trains a "
                             f"{file_cfg['model']} model")
        mdict, tdict = config_to_dict(default_model_config(kind)), TrainConfig().to_dict()
    cfg_cls, _ = model_classes(kind)
    if "train" in file_cfg:
        reject_unknown_keys("--config train", file_cfg["train"], tdict)
        tdict.update(file_cfg["train"])
    if "model_config" in file_cfg:
        reject_unknown_keys(f"--config model_config ({cfg_cls.__name__})", file_cfg["model_config"], mdict)
        mdict.update(file_cfg["model_config"])
    for item in args.set or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"--set expects key=value, got {item!r}")
        scope, _, name = key.partition(".") if key.startswith(("train.", "model.")) else ("", "", key)
        if scope == "train" or (not scope and name in tdict):
            if name not in tdict:
                raise ValueError(f"unknown train key {name!r}; allowed: {sorted(tdict)}")
            tdict[name] = _parse_value(f"train.{name}", raw, tdict[name])
        elif scope == "model" or name in mdict:
            if name not in mdict:
                raise ValueError(f"unknown model key {name!r} for {cfg_cls.__name__}; allowed: {sorted(mdict)}")
            mdict[name] = _parse_value(f"model.{name}", raw, mdict[name])
        else:
            raise ValueError(f"unknown key {name!r}; train keys: {sorted(tdict)}; model keys: {sorted(mdict)}")
    for flag in TRAIN_FLAGS:
        v = getattr(args, flag, None)
        if v is not None:
            tdict[flag] = v
    for flag, key in MODEL_FLAGS.items():
        v = getattr(args, flag, None)
        if v is not None:
            mdict[key or _n_layers_key(kind)] = v
    tdict["out_dir"] = out_dir
    tcfg = TrainConfig(**tdict)
    check_model_values(mdict)
    try:
        mcfg = config_from_dict(kind, mdict)
    except (ValueError, TypeError) as e:
        raise ValueError(f"model config: {one_line(e)}") from None
    validate_model_config(kind, mcfg)
    if ckpt is not None:
        _check_resume(ckpt, tdict, mcfg)
    return kind, mcfg, tcfg, args.resume


def _check_resume(ckpt: dict, tdict: dict, mcfg: Any) -> None:
    old_t, old_m = ckpt["train_config"], ckpt["model_config"]
    for k in RESUME_LOCKED:
        if k in old_t and old_t[k] != tdict[k]:
            raise ValueError(f"train.{k} is {tdict[k]!r} but the checkpoint was trained with {old_t[k]!r}; "
                             f"--resume continues the same run (start a new --out-dir to change it)")
    if (old_t.get("max_steps"), old_t.get("max_tokens")) != (tdict["max_steps"], tdict["max_tokens"]):
        sys.stderr.write("note: the run length changed on --resume; the cosine schedule is recomputed for the "
                         "new length, so from here on this is not the continuation of the original run\n")
    if config_to_dict(mcfg) != {**old_m}:
        diff = sorted(k for k in old_m if config_to_dict(mcfg).get(k) != old_m[k])
        raise ValueError(f"model config keys {diff} differ from the checkpoint's; --resume keeps the model")


def _recipe_names() -> str:
    from lm.recipes import RECIPE_NAMES

    return ", ".join(RECIPE_NAMES)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog="python -m lm.train",
        description="Train the GRT or the dense QK-norm baseline on bytes (bundled Shakespeare by default). "
                    "Resumable bit for bit; data-parallel under torchrun. A folder that already holds a run is "
                    "never overwritten (see --resume, --force). Subcommand: 'python -m lm.train sample --help' "
                    "generates text from a checkpoint.",
        epilog="precedence: defaults < --recipe or --config < --set < explicit flags\n\ntrain keys for --set "
               "(defaults):\n  " + ", ".join(f"{f.name}={f.default!r}" for f in fields(TrainConfig))
               + "\n\nmodel keys for --set: the fields of DenseConfig / GRTConfig, e.g. model.d_model, "
                 "model.n_layers (dense) or model.n_blocks (grt), model.block_size\n\noutputs in the run folder: "
                 "log.jsonl, ckpt.pt (+ ckpt.pt.sha256), summary.json\nexit status: 0 done, 1 the run failed "
                 "(e.g. a non-finite loss), 2 a usage error (nothing was written), 130 interrupted",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("what to train")
    g.add_argument("--model", choices=MODEL_KINDS, default=None,
                   help="model family: the dense QK-norm transformer or the GRT (default: dense, the recipe's or "
                        "config's model, or the checkpoint's on --resume)")
    g.add_argument("--recipe", metavar="NAME", default=None,
                   help="start from a named recipe, the exact configuration that trained a shipped reference model "
                        "(see lm.recipes; e.g. reference-grt, reference-dense); its run folder defaults to "
                        "runs/NAME")
    g.add_argument("--config", metavar="FILE",
                   help="start from a JSON file {\"model\": ..., \"train\": {...}, \"model_config\": {...}}, "
                        "e.g. a run's config.json written by python -m lm.compare")
    g.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one configuration key (repeatable): lr=1e-3, train.wd=0, model.n_layers=6; the "
                        "keys are listed below")
    g.add_argument("--data", default=None,
                   help="a file or a folder of .txt/.md files to train on, read as raw bytes (default: the bundled "
                        "Shakespeare)")
    m = p.add_argument_group("model size")
    m.add_argument("--d-model", type=int, default=None, help="model width: channels of the residual stream")
    m.add_argument("--n-heads", type=int, default=None, help="attention heads per layer (must divide --d-model)")
    m.add_argument("--n-layers", type=int, default=None, help="transformer blocks (the GRT's n_blocks)")
    m.add_argument("--seq-len", type=int, default=None, help="context length in bytes (model.block_size)")
    t = p.add_argument_group("optimization")
    t.add_argument("--lr", type=float, default=None, help="peak learning rate after the warmup")
    t.add_argument("--batch-size", type=int, default=None,
                   help="windows of --seq-len bytes per optimizer step, summed over all processes")
    t.add_argument("--max-steps", type=int, default=None, help="optimizer steps to train for")
    t.add_argument("--max-tokens", type=int, default=None,
                   help="training bytes to train for; when > 0 it sets the number of steps instead of --max-steps")
    t.add_argument("--eval-interval", type=int, default=None,
                   help="evaluate the validation loss every this many steps (0: only at the start and the end)")
    t.add_argument("--seed", type=int, default=None, help="seed of the initial weights and of the batch order")
    r = p.add_argument_group("run folder")
    r.add_argument("--out-dir", default=None,
                   help=f"folder for the log, checkpoint and summary (default: {TrainConfig.out_dir})")
    r.add_argument("--resume", action="store_true",
                   help="continue the run in --out-dir from its checkpoint, with the checkpoint's configuration")
    r.add_argument("--force", action="store_true",
                   help="start a new run even if --out-dir holds one: the old run is moved to "
                        "<out-dir>.replaced-<time>, never deleted")
    r.add_argument("--stop-after", type=int, default=None, metavar="STEP",
                   help="stop with a checkpoint after this step, as an interruption would")
    r.add_argument("--json", metavar="PATH", help="also write the summary and its claim records to this file")
    e = p.add_argument_group("machine")
    e.add_argument("--device", default=None, help="where to train: auto (CUDA when present), cpu, cuda or cuda:N")
    e.add_argument("--dtype", default=None, choices=("float32", "float64"), help="precision of the parameters")
    e.add_argument("--threads", type=int, default=None, help="torch CPU threads (0: torch's default)")
    e.add_argument("--quiet", action="store_true", help="no progress line")
    e.add_argument("--debug", action="store_true", help="on an error, show the Python traceback")
    return p


def monitor_hooks(cfg: TrainConfig) -> list:
    """The command-line entries' step hooks (this module's :func:`main`, ``lm.compare``'s runs): the equilibrium
    monitor of :mod:`dynamics.monitor` on the gauges :func:`gauge.census.census` finds on the probe batch,
    recording every ``cfg.gauge_interval`` steps; none when ``gauge_interval`` is 0 or ``probe_gauges`` false.

    ``dynamics`` and ``gauge`` stand above ``lm``: they are imported here, when an entry asks, never by the loop.
    """
    if not (cfg.probe_gauges and cfg.gauge_interval > 0):
        return []
    from dynamics.monitor import TrainHook

    # one group per tensor (a union of gauges is a gauge): the log stays one record per gauge weight
    return [TrainHook.lazy(census_of_probe_batch, interval=cfg.gauge_interval, per_block=False)]


def census_of_probe_batch(model: nn.Module, info: LoopInfo) -> Any:
    """The gauge census of ``model`` on the loop's fixed probe batch (a float64 CPU copy: the model and the global
    RNG are untouched, so the run is the same with or without it).  The eps report is skipped: the monitor needs
    only which tensors are gauges."""
    from gauge.census import census

    return census(model, batch=info.probe_batch(), own_eps=False, seed=info.train_config.seed)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sample":
        from lm.sample import main as sample_main

        return sample_main(argv[1:], prog="python -m lm.train sample")
    parser = build_parser()
    args = parse_shared_args(parser, argv)
    return run_guarded(parser.prog, lambda: _main(parser, args), debug=args.debug,
                       failure_errors=(RunFailure,))


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    try:
        if args.stop_after is not None:
            check_range("--stop-after", args.stop_after, 1, None)
        check_output_file("--json", args.json)
        kind, mcfg, tcfg, resume = resolve(args)
        check_run_dir(Path(tcfg.out_dir), resume, args.force)
        corpus_files(tcfg.data or None)  # the data exists (it is read, and its size checked, before the model)
        check_memory(kind, mcfg, tcfg, resolve_device(tcfg.device), int(os.environ.get("WORLD_SIZE", "1")))
        ckpt_json = Path(args.json).resolve() if args.json else None
        if ckpt_json is not None and ckpt_json.parent == Path(tcfg.out_dir).resolve() and ckpt_json.name in RUN_FILES:
            raise ValueError(f"--json {args.json} would overwrite the run's own {ckpt_json.name}")
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))
    summary = train(kind, mcfg, tcfg, resume=resume, stop_after=args.stop_after, progress=not args.quiet,
                    force=args.force, hooks=monitor_hooks(tcfg))
    if int(os.environ.get("RANK", "0")) == 0:
        print(format_summary(summary))
        if args.json:
            write_claims_json(args.json, summary_claims(summary), summary=summary)
    return 130 if summary["interrupted"] else 0


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"{s['model']} ({s['dtype']}, {s['device']}, world {s['world_size']}): step {s['steps']}/"
             f"{s['total_steps']}, {s['tokens_seen']:,} tokens, {s['tokens_per_s']:.0f} tok/s, "
             f"train {s['train_time_s']:.1f}s, wall {s['wall_time_s']:.1f}s",
             "  params: " + ", ".join(f"{k} {v:,}" for k, v in s["params"].items())]
    at = s.get("final_val_step")
    val = f"{s['final_val_loss']:.4f} nats/byte = {s['final_val_bpb']:.4f} bits/byte"
    if at is None:
        lines.append("  no validation loss measured")
    elif at == s["steps"]:
        lines.append(f"  final val loss {val}")
    else:
        lines.append(f"  val loss at step {at} (the latest evaluation; the run stopped at step {s['steps']} "
                     f"before the next one): {val}")
    found = s.get("gauge_census") or {}
    if found.get("source") == "census":
        names = [*found["gauges"], *found.get("partial", {})]
        exp = expected_gauges(s["model"], s["model_config"])
        agrees = "no prediction" if exp is None else sorted(exp) == sorted(names)
        lines.append(f"  gauge census: {len(names)} gauge tensor(s)"
                     + ("" if names else ", nothing monitored") + f"; theory agrees: {agrees}")
    eq = s.get("equilibrium") or {}
    if eq.get("groups"):
        med = equilibrium_medians(s)
        lo, hi = eq["tail_steps"]
        lines.append(f"  gauge rotation (steps {lo}-{hi}): measured/equilibrium {med['ratio_to_eq']:.3f}, "
                     f"measured/random-walk-at-current-norm {med['ratio_to_rw']:.3f} (median over "
                     f"{len(eq['groups'])} tensors)")
        for n, r in list(eq["groups"].items())[:4]:
            lines.append(f"    {n}: |W| {r['norm_first']:.3f} -> {r['norm_last']:.3f} "
                         f"(eq {_num(r['norm_eq'], '.3f')}), angle {r['angle_tail_mean']:.2e} "
                         f"(eq {_num(r['angle_eq'], '.2e')}, rw {_num(r.get('angle_rw'), '.2e')})")
    return "\n".join(lines)


def _num(v: Any, fmt: str) -> str:
    """A number for the summary, ``-`` where there is no prediction (a summary read back from JSON may hold
    ``"inf"`` as text: shown as it is)."""
    if v is None:
        return "-"
    return format(v, fmt) if isinstance(v, (int, float)) else str(v)


if __name__ == "__main__":
    sys.exit(main())
