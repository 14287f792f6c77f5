r"""Train the GRT or the dense baseline on bytes: one process or many (torchrun), resumable exactly.

Usage (see ``--help``)::

    python -m lm.train --model dense                      # bundled Shakespeare, CPU-sized preset
    python -m lm.train --model grt --data my_texts/ --set lr=1e-3 --set model.n_layers=6
    python -m lm.train --config run.json --out-dir runs/a # JSON: {"model", "train", "model_config"}
    python -m lm.train --out-dir runs/a --resume           # continue exactly where runs/a stopped
    torchrun --nproc_per_node=4 -m lm.train --model grt    # data-parallel (gloo on CPU, nccl on CUDA)
    python -m lm.train sample --ckpt runs/a/ckpt.pt --prompt "ROMEO:"   # = python -m lm.sample

**Configuration.**  The model config is the model's own dataclass (:class:`lm.dense.DenseConfig`
or ``grt_model.config.GRTConfig``), starting from the CPU preset of
:func:`lm.checkpoint.default_model_config`; the loop's is :class:`TrainConfig`.  Layers, later
wins: defaults < ``--config FILE`` < ``--set key=value`` (bare keys: TrainConfig first, then the model
config; or ``train.key`` / ``model.key``) < explicit flags.  Unknown keys and out-of-range values fail
before any work, naming the key and the allowed range.  On ``--resume`` the base is the checkpoint's
configs, and keys that shape the trajectory (:data:`RESUME_LOCKED`) may not change; the run length
(``max_steps`` / ``max_tokens``) may, to extend a run, at the price of a recomputed cosine schedule.

**Exact resume.**  Batch ``t`` is drawn by a generator seeded from ``(seed, t)`` alone
(:meth:`BatchSampler.train_batch`), the learning rate is a function of ``t``, the model has no
dropout, and the checkpoint holds the optimizer state, RNG states and the loop's running sums: so
``--stop-after k`` then ``--resume`` reproduces the uninterrupted run bit for bit on one CPU process
(``tests/test_train.py::test_resume_is_bit_exact``).  SIGINT/SIGTERM stop after the current step
with a checkpoint.

**Data parallel.**  Under ``torchrun`` (env ``WORLD_SIZE`` > 1) each rank draws the same global batch
of ``batch_size`` windows and keeps its contiguous shard of ``batch_size / WORLD_SIZE``; DDP averages
gradients, so the update is the one-process update on the global batch up to the order of the
floating-point sum (``tests/test_ddp.py``).  Only rank 0 writes logs and checkpoints.

**Logs.**  ``OUT/log.jsonl`` (one JSON object a line): ``start`` (configs, parameter counts, gauge
probe), ``train`` (loss, lr, tokens, tokens/s), ``eval`` (val loss and bits per byte
:math:`= \text{loss}/\ln 2`), ``gauge`` (norm and per-step angle of every gauge weight against the
rotational-equilibrium predictions of :mod:`lm.equilibrium`), ``end`` (summary, also in
``OUT/summary.json``).  ``OUT/ckpt.pt`` is the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import textwrap
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
from lm.corpus import ByteCorpus
from lm.equilibrium import relaxation_steps
from lm.scale_probe import GaugeTracker, expected_gauges, find_scale_gauges
from rmsgauge import (
    Claim,
    atomic_write_json,
    check_choice,
    check_range,
    reject_unknown_keys,
    seed_everything,
    write_claims_json,
)

LN2 = math.log(2.0)
TRAIN_STREAM, VAL_STREAM, PROBE_STREAM = 0, 1, 2  # independent seed streams for the three kinds of batch
NO_DECAY_KEYWORDS = ("norm", "angle", "phase", "scale", "gate", "bias")  # see decay_split()
EQUILIBRIUM_FACTOR = 2.0  # the random-walk model is a statistical law, not an identity: agreement within x2


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
    gauge_interval: int = 10  # measure gauge norms/angles every N steps; 0 disables gauge tracking
    ckpt_interval: int = 500  # 0: checkpoint only at the end (and on stop/interrupt)
    val_fraction: float = 0.1  # the last 10% of the corpus bytes are validation, never trained on
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "float32"  # float32 | float64 (float64: for equivalence tests)
    threads: int = 0  # torch CPU threads; 0 leaves torch's default
    data: str = ""  # "" = the bundled corpus; else a text file or a folder of .txt/.md files
    out_dir: str = "runs/train"
    probe_gauges: bool = True  # run the scale probe at start (finds the gauges to track)

    def __post_init__(self) -> None:
        _float("train.lr", self.lr, 0.0, 10.0, lo_open=True)
        _float("train.min_lr_frac", self.min_lr_frac, 0.0, 1.0)
        _int("train.warmup_steps", self.warmup_steps, 0)
        _choice("train.schedule", self.schedule, ("cosine", "constant"))
        _float("train.wd", self.wd, 0.0, 10.0)
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
        if not (self.device in ("auto", "cpu", "cuda") or (self.device.startswith("cuda:")
                                                          and self.device[5:].isdigit())):
            raise ValueError(f"train.device must be one of auto, cpu, cuda, cuda:N; got {self.device!r}")
        _choice("train.dtype", self.dtype, ("float32", "float64"))
        _int("train.threads", self.threads, 0, 1024)
        if not isinstance(self.data, str) or not isinstance(self.out_dir, str) or not self.out_dir:
            raise ValueError("train.data must be a string (\"\" = bundled corpus) and train.out_dir a non-empty path")
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
        return self.lr * (self.min_lr_frac + (1.0 - self.min_lr_frac) * 0.5 * (1.0 + math.cos(math.pi * min(1.0,
                                                                                                              progress))))


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
        if self.world == 1:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

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
    """Append-only JSON lines (rank 0 only).  On resume, records after the checkpoint's step are
    dropped first (they belong to the interrupted tail that is about to be recomputed)."""

    def __init__(self, path: Path | None, resume_step: int | None) -> None:
        self.path = path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            path.write_text("")
        elif path.exists():
            keep = [ln for ln in path.read_text().splitlines() if _step_of(ln) <= resume_step]
            from rmsgauge import atomic_write_text

            atomic_write_text(path, "".join(ln + "\n" for ln in keep))

    def write(self, record: dict) -> None:
        if self.path is None:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps(record, default=_json_default) + "\n")


def _step_of(line: str) -> float:
    """A log line's step; a blank or half-written line (a crash mid-write) sorts after everything."""
    try:
        return float(json.loads(line).get("step", -1))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return math.inf


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def read_log(path: str | os.PathLike) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


class _StopFlag:
    """SIGINT/SIGTERM set a flag; the loop checks it between steps (never mid-update)."""

    def __init__(self) -> None:
        self.raised = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.raised = True

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


def train(model_kind: str, model_cfg: Any, cfg: TrainConfig, *, resume: bool = False, stop_after: int | None = None,
          progress: bool = True, log_name: str = "log.jsonl", label: str = "") -> dict[str, Any]:
    """Train and return the run summary (also written to ``OUT/summary.json`` by rank 0).

    ``resume``: continue from ``OUT/ckpt.pt``.  ``stop_after``: stop (with a checkpoint) once this
    global step is done, as an interruption would.
    """
    ctx = DistContext.from_env(cfg.device)
    try:
        return _train(ctx, model_kind, model_cfg, cfg, resume, stop_after, progress, log_name, label)
    finally:
        ctx.close()


def _train(ctx: DistContext, model_kind: str, model_cfg: Any, cfg: TrainConfig, resume: bool,
           stop_after: int | None, progress: bool, log_name: str, label: str) -> dict[str, Any]:
    t_wall0 = time.perf_counter()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    if cfg.batch_size % ctx.world:
        raise ValueError(f"train.batch_size ({cfg.batch_size}) must be divisible by WORLD_SIZE ({ctx.world})")
    out = Path(cfg.out_dir)
    ckpt_path = out / "ckpt.pt"
    dtype = getattr(torch, cfg.dtype)
    T = int(model_cfg.block_size)

    ckpt = load_checkpoint(ckpt_path, map_location="cpu") if resume else None
    seed_everything(cfg.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = build_model(model_kind, model_cfg).to(device=ctx.device, dtype=dtype)
    corpus = ByteCorpus.load(cfg.data or None, cfg.val_fraction)
    sampler = BatchSampler(corpus, T, cfg.batch_size, cfg.seed, ctx.rank, ctx.world, ctx.device)
    opt = make_optimizer(model, cfg)
    total = cfg.total_steps(T)
    start, tokens_seen, extra = 0, 0, {}
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        start, tokens_seen, extra = int(ckpt["step"]), int(ckpt["tokens_seen"]), dict(ckpt["extra"])
        set_rng_state(ckpt["rng"])
        if start >= total:
            raise ValueError(f"checkpoint {ckpt_path} is at step {start}, already >= the run's {total} steps; "
                             f"raise train.max_steps (or max_tokens) to continue")
    breakdown = param_breakdown(model)

    # gauges: the scale probe on a fixed small batch (float64 copy; leaves model and RNG alone)
    probe_info: dict[str, Any] = {"ran": False}
    gauge_names: list[str] = []
    if cfg.probe_gauges and cfg.gauge_interval > 0 and ctx.is_main:
        px, py = sampler.probe_batch()
        pr = find_scale_gauges(model, px, py, seed=cfg.seed)
        exp = expected_gauges(model)
        gauge_names = pr.gauges
        probe_info = {"ran": True, "gauges": pr.gauges, "unused": pr.unused, "expected": exp,
                      "agrees_with_theory": None if exp is None else sorted(exp) == sorted(pr.gauges),
                      "threshold_float64": pr.threshold, "margin": pr.margin, "probe_loss": pr.loss,
                      "max_gauge_deviation": max((pr.deviation[n] for n in pr.gauges), default=None),
                      "min_nongauge_deviation": min((v for n, v in pr.deviation.items() if n not in pr.gauges
                                                     and n not in pr.unused), default=None)}
    named = dict(model.named_parameters())
    hyper = {}
    for g in opt.param_groups:
        for n in g["names"]:
            hyper[n] = (g["weight_decay"], g["betas"][0])
    tracker = GaugeTracker({n: named[n] for n in gauge_names}, {n: hyper[n] for n in gauge_names})

    ddp_model: nn.Module = model
    if ctx.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp_model = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)

    log = JsonLog(out / log_name if ctx.is_main else None, start if ckpt is not None else None)
    bar = Progress(total, progress and ctx.is_main, label)
    tcfg = cfg.to_dict()
    if ctx.is_main:
        log.write({"event": "resume" if ckpt is not None else "start", "step": start, "model": model_kind,
                   "model_config": config_to_dict(model_cfg), "train_config": tcfg, "total_steps": total,
                   "params": breakdown, "world_size": ctx.world, "device": str(ctx.device), "dtype": cfg.dtype,
                   "corpus_bytes": {"train": len(sampler.splits["train"]), "val": len(sampler.splits["val"])},
                   "gauge_probe": probe_info,
                   "decay_tensors": sorted(n for g in opt.param_groups if g["weight_decay"] > 0 for n in g["names"])})
        if probe_info["ran"]:
            bar.message(f"{label}scale probe: {len(gauge_names)} gauge tensor(s) "
                        f"{gauge_names if len(gauge_names) <= 4 else [*gauge_names[:4], '...']}; "
                        f"float64 threshold {probe_info['threshold_float64']:.2e}, margin x{pr.margin:.2e}")

    tokens_per_step = cfg.batch_size * T
    interval_sum = torch.tensor(extra.get("interval_loss_sum", 0.0), dtype=torch.float64, device=ctx.device)
    interval_n = int(extra.get("interval_n", 0))
    train_time = float(extra.get("train_time", 0.0))
    evals: list[dict] = list(extra.get("evals", []))
    last_loss = math.nan

    def do_eval(step: int) -> None:
        vl = evaluate(model, sampler, cfg.eval_batches, ctx)
        rec = {"event": "eval", "step": step, "tokens": step * tokens_per_step, "val_loss": vl, "val_bpb": vl / LN2,
               "train_time_s": train_time}  # seconds of training so far: curves against wall-clock
        evals.append({k: rec[k] for k in ("step", "tokens", "val_loss", "val_bpb", "train_time_s")})
        log.write(rec)

    def do_ckpt(step: int) -> None:
        if ctx.is_main:
            save_checkpoint(ckpt_path, model_kind=model_kind, model=model, optimizer=opt, train_config=tcfg,
                            step=step, tokens_seen=tokens_seen,
                            extra={"interval_loss_sum": float(interval_sum), "interval_n": interval_n,
                                   "train_time": train_time, "evals": evals})
        if ctx.world > 1:
            dist.barrier()  # nobody runs ahead of a checkpoint that may be resumed from

    if start == 0:
        do_eval(0)
    interrupted = False
    done = start
    run_t0, run_tokens0 = time.perf_counter(), tokens_seen
    t_int, tok_int = time.perf_counter(), 0
    model.train()
    with _StopFlag() as stop:
        for step in range(start, total):
            t_step = time.perf_counter()
            lr = cfg.lr_at(step, total)
            for g in opt.param_groups:
                g["lr"] = lr
            x, y = sampler.train_batch(step)  # (b, T) each: this rank's shard of the global batch
            _, loss = ddp_model(x, y)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            done = step + 1
            track = bool(tracker) and (done % cfg.gauge_interval == 0 or done == total)
            if track:
                tracker.snapshot()
            opt.step()
            opt.zero_grad(set_to_none=True)
            tokens_seen += tokens_per_step
            interval_sum += loss.detach().double()
            interval_n += 1
            if done % cfg.log_interval == 0 or done == total:
                avg = float(ctx.all_mean(interval_sum / interval_n))
                last_loss = float(ctx.all_mean(loss.detach().double()))
                train_time += time.perf_counter() - t_step
                now = time.perf_counter()
                tok_s = (tok_int + tokens_per_step) / max(now - t_int, 1e-9)
                run_rate = (tokens_seen - run_tokens0) / max(now - run_t0, 1e-9)
                log.write({"event": "train", "step": done, "tokens": tokens_seen, "loss": last_loss,
                           "loss_avg": avg, "lr": lr, "tok_per_s": tok_s, "elapsed_s": time.perf_counter() - t_wall0})
                bar.update(done, avg, tok_s, lr, (total - done) * tokens_per_step / max(run_rate, 1e-9))
                interval_sum.zero_()
                interval_n = 0
                t_int, tok_int = time.perf_counter(), 0
            else:
                train_time += time.perf_counter() - t_step
                tok_int += tokens_per_step
            if track and ctx.is_main:
                rec = tracker.measure(done, lr)
                log.write({"event": "gauge", **rec})
            if (cfg.eval_interval > 0 and done % cfg.eval_interval == 0) or done == total:
                do_eval(done)
                t_int, tok_int = time.perf_counter(), 0
            stopping = ctx.any_flag(stop.raised) or (stop_after is not None and done >= stop_after)
            if (cfg.ckpt_interval > 0 and done % cfg.ckpt_interval == 0) or done == total or stopping:
                do_ckpt(done)
                t_int, tok_int = time.perf_counter(), 0
            if stopping:
                interrupted = stop.raised
                if ctx.is_main:
                    log.write({"event": "stopped", "step": done, "signal": interrupted})
                    bar.message(f"{label}stopped at step {done}; checkpoint {ckpt_path} (continue with --resume)")
                break
    bar.close()
    final_step = done
    summary = {
        "model": model_kind, "label": label.strip(), "steps": final_step, "total_steps": total,
        "complete": final_step >= total, "interrupted": interrupted,
        "tokens_seen": tokens_seen, "train_time_s": train_time, "wall_time_s": time.perf_counter() - t_wall0,
        "tokens_per_s": tokens_seen / train_time if train_time > 0 else math.nan,
        "final_train_loss": last_loss, "final_val_loss": evals[-1]["val_loss"] if evals else math.nan,
        "final_val_bpb": evals[-1]["val_bpb"] if evals else math.nan, "evals": evals,
        "params": breakdown, "world_size": ctx.world, "device": str(ctx.device), "dtype": cfg.dtype,
        "model_config": config_to_dict(model_cfg), "train_config": tcfg, "gauge_probe": probe_info,
        "gauges": tracker.summary() if tracker else {},
        "equilibrium_relaxation_steps": relaxation_steps(cfg.lr, cfg.wd) if cfg.wd > 0 else math.inf,
    }
    if ctx.is_main:
        log.write({"event": "end", "step": final_step, **{k: v for k, v in summary.items() if k != "evals"}})
        atomic_write_json(out / "summary.json", summary)
    return summary


def summary_claims(summary: dict[str, Any]) -> list[Claim]:
    """The run's two checkable statements as claim records (for ``--json``)."""
    claims = []
    probe = summary.get("gauge_probe", {})
    if probe.get("ran"):
        exp = probe.get("expected")
        claims.append(Claim(
            "grt_model.scale_probe_gauges",
            "The scale of a weight that feeds an RMSNorm is a gauge the loss cannot see (QK-norm: W_q, W_k).",
            stated=exp, measured=probe["gauges"], tolerance=probe["threshold_float64"],
            holds=bool(probe["agrees_with_theory"]) if exp is not None else True,
            dtype="float64", source_status="exact" if exp is not None else "not_a_source_claim",
            exact_law="L(cW) = L(W) for c in {0.5, 2} to float64 round-off, and a non-radial move is visible",
            details={"margin": probe.get("margin"), "unused": probe.get("unused"),
                     "max_gauge_deviation": probe.get("max_gauge_deviation"),
                     "min_nongauge_deviation": probe.get("min_nongauge_deviation")}))
    g = summary.get("gauges") or {}
    if g.get("per_tensor"):
        cfg = summary["train_config"]
        rw = g["median_ratio_to_rw"]
        claims.append(Claim(
            "grt_model.rotational_equilibrium_angle",
            "A gauge weight under AdamW rotates by sqrt(2 lr wd (1-b1)/(1+b1)) per step at equilibrium "
            "(Kosson et al. arXiv:2305.17212); at its current norm the random-walk model predicts "
            "lr sqrt(C (1-b1)/(1+b1)) / ||W||.",
            stated={"angle_eq_at_peak_lr": math.sqrt(2 * cfg["lr"] * cfg["wd"] * (1 - cfg["beta1"]) /
                                                       (1 + cfg["beta1"]))},
            measured={"median_ratio_to_random_walk": rw, "median_ratio_to_equilibrium": g["median_ratio_to_eq"]},
            tolerance=EQUILIBRIUM_FACTOR,
            holds=bool(math.isfinite(rw) and 1 / EQUILIBRIUM_FACTOR <= rw <= EQUILIBRIUM_FACTOR),
            dtype=summary["dtype"], source_status="approximate",
            exact_law="random-walk model (statistical); equilibrium needs ~1/(2 lr wd) steps "
                      f"= {summary['equilibrium_relaxation_steps']:.0f} per e-fold, the run had {summary['steps']}",
            details={"tail_steps": g["tail_steps"], "n_samples": g["n_samples"]}))
    return claims


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


def resolve(args: argparse.Namespace) -> tuple[str, Any, TrainConfig, bool]:
    """Build (model kind, model config, train config, resume) from defaults, checkpoint, file, --set, flags."""
    file_cfg: dict[str, Any] = {}
    if args.config:
        try:
            file_cfg = json.loads(Path(args.config).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"--config {args.config}: {e}") from None
        if not isinstance(file_cfg, dict):
            raise ValueError(f"--config {args.config}: expected a JSON object with keys model, train, model_config")
        reject_unknown_keys("--config top-level", file_cfg, ("model", "train", "model_config"))
    out_dir = args.out_dir or file_cfg.get("train", {}).get("out_dir") or TrainConfig.out_dir
    ckpt = None
    if args.resume:
        ckpt = load_checkpoint(Path(out_dir) / "ckpt.pt")
        kind = ckpt["model_kind"]
        if args.model and args.model != kind:
            raise ValueError(f"--model {args.model} but the checkpoint in {out_dir} is a {kind} model")
        mdict, tdict = dict(ckpt["model_config"]), dict(ckpt["train_config"])
    else:
        kind = args.model or file_cfg.get("model", "dense")
        check_choice("model", kind, MODEL_KINDS)
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
    for flag, key in (("lr", "lr"), ("batch_size", "batch_size"), ("max_steps", "max_steps"),
                      ("max_tokens", "max_tokens"), ("seed", "seed"), ("device", "device"), ("threads", "threads"),
                      ("data", "data"), ("dtype", "dtype"), ("eval_interval", "eval_interval")):
        v = getattr(args, flag, None)
        if v is not None:
            tdict[key] = v
    tdict["out_dir"] = out_dir
    tcfg = TrainConfig(**tdict)
    try:
        mcfg = config_from_dict(kind, mdict)
    except (ValueError, TypeError) as e:
        raise ValueError(f"model config: {e}") from None
    if ckpt is not None:
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
    return kind, mcfg, tcfg, args.resume


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lm.train",
        description="Train the GRT or the dense QK-norm baseline on bytes (bundled Shakespeare by default). "
                    "Resumable bit for bit; data-parallel under torchrun. Subcommand: "
                    "'python -m lm.train sample --help' generates text from a checkpoint.",
        epilog="precedence: defaults < --config < --set < explicit flags\n\ntrain keys (defaults):\n"
               + textwrap.fill(", ".join(f"{f.name}={f.default!r}" for f in fields(TrainConfig)), 100,
                               initial_indent="  ", subsequent_indent="  ")
               + "\n\nmodel keys: the fields of DenseConfig / GRTConfig, e.g. model.d_model, model.n_layers "
                 "(dense) or model.n_blocks (grt), model.block_size\n\noutputs in OUT: log.jsonl, ckpt.pt, "
                 "summary.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODEL_KINDS, default=None, help="model family (default: dense, or the "
                   "checkpoint's on --resume)")
    p.add_argument("--config", metavar="FILE",
                   help="JSON file {\"model\": ..., \"train\": {...}, \"model_config\": {...}}")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one config key (repeatable): lr=1e-3, train.wd=0, model.n_layers=6")
    p.add_argument("--data", default=None, help="text file or folder (default: the bundled corpus)")
    p.add_argument("--out-dir", default=None, help=f"run folder (default: {TrainConfig.out_dir})")
    p.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt (configs from the checkpoint)")
    p.add_argument("--stop-after", type=int, default=None, metavar="STEP",
                   help="stop with a checkpoint after this global step, as an interruption would")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (train.lr)")
    p.add_argument("--batch-size", type=int, default=None, help="global batch in windows (train.batch_size)")
    p.add_argument("--max-steps", type=int, default=None, help="train.max_steps")
    p.add_argument("--max-tokens", type=int, default=None, help="token budget; overrides max_steps when > 0")
    p.add_argument("--eval-interval", type=int, default=None, help="train.eval_interval")
    p.add_argument("--seed", type=int, default=None, help="train.seed")
    p.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N (train.device)")
    p.add_argument("--dtype", default=None, choices=("float32", "float64"), help="parameter dtype (train.dtype)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads, 0 = torch default")
    p.add_argument("--json", metavar="PATH", help="also write the summary and its claim records here (atomic)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sample":
        from lm.sample import main as sample_main

        return sample_main(argv[1:], prog="python -m lm.train sample")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.stop_after is not None and args.stop_after < 1:
        parser.error(f"--stop-after must be in [1, inf), got {args.stop_after}")
    try:
        kind, mcfg, tcfg, resume = resolve(args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        parser.error(str(e))
    summary = train(kind, mcfg, tcfg, resume=resume, stop_after=args.stop_after, progress=not args.quiet)
    if int(os.environ.get("RANK", "0")) == 0:
        print(format_summary(summary))
        if args.json:
            write_claims_json(args.json, summary_claims(summary), summary=summary)
    return 130 if summary["interrupted"] else 0


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"{s['model']} ({s['dtype']}, {s['device']}, world {s['world_size']}): step {s['steps']}/"
             f"{s['total_steps']}, {s['tokens_seen']:,} tokens, {s['tokens_per_s']:.0f} tok/s, "
             f"train {s['train_time_s']:.1f}s, wall {s['wall_time_s']:.1f}s",
             "  params: " + ", ".join(f"{k} {v:,}" for k, v in s["params"].items()),
             f"  final val loss {s['final_val_loss']:.4f} nats/byte = {s['final_val_bpb']:.4f} bits/byte"]
    probe = s.get("gauge_probe", {})
    if probe.get("ran"):
        lines.append(f"  scale probe: {len(probe['gauges'])} gauge tensor(s); theory agrees: "
                     f"{probe['agrees_with_theory']}")
    g = s.get("gauges") or {}
    if g.get("per_tensor"):
        lines.append(f"  gauge rotation (steps {g['tail_steps'][0]}-{g['tail_steps'][1]}): measured/equilibrium "
                     f"{g['median_ratio_to_eq']:.3f}, measured/random-walk-at-current-norm "
                     f"{g['median_ratio_to_rw']:.3f} (median over {len(g['per_tensor'])} tensors)")
        for n, r in list(g["per_tensor"].items())[:4]:
            lines.append(f"    {n}: |W| {r['norm_first']:.3f} -> {r['norm_last']:.3f} "
                         f"(eq {r.get('norm_eq_last', math.inf):.3f}), angle {r['angle_mean']:.2e} "
                         f"(eq {r.get('angle_eq_mean', math.nan):.2e}, "
                         f"rw {r['angle_rw_mean']:.2e})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
