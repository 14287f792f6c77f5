"""The training loop's configuration (:class:`TrainConfig`) and the keys a resume may not change."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from lm.dist import check_device
from rmsgauge import check_choice, check_range
from rmsgauge.corpus import VOCAB_SIZE

# Structure-aware learning rates (Qiu et al. 2024, "Compute Better Spent", arXiv 2406.06248): every parameter falls
# in one of these groups (lm.optim.lr_group) and TrainConfig.lr_mult scales each group's lr (absent: x1).
LR_GROUPS = ("angles", "scales", "coupling", "embedding_phases", "embedding_magnitudes", "gates", "norm_gains",
             "matrices", "embedding")
MODEL_LR_GROUPS = {"grt": ("angles", "scales", "coupling", "embedding_phases", "embedding_magnitudes", "gates",
                           "norm_gains"),
                   "dense": ("matrices", "embedding", "norm_gains")}
NO_DECAY_KEYWORDS = ("norm", "angle", "phase", "scale", "gate", "bias")  # see lm.optim.decays
# the lr groups whose tensors lm.optim.decays (>= 2 dims, no keyword above): only these feel 1 - lr*mult*wd
DECAYED_LR_GROUPS = ("coupling", "matrices", "embedding")
EQUILIBRIUM_FACTOR = 2.0  # the random-walk model is a statistical law, not an identity: agreement within x2
RUN_FILES = ("ckpt.pt", "log.jsonl", "summary.json")  # a folder holding any of these holds a run
WRITTEN_FILES = ("ckpt.pt", "ckpt.pt.sha256", "log.jsonl", "summary.json")  # what a run writes (orphan temp files)


@dataclass
class TrainConfig:
    lr: float = 3e-3  # peak learning rate (after warmup)
    min_lr_frac: float = 0.1  # cosine decays to min_lr_frac * lr at the last step
    warmup_steps: int = 50
    schedule: str = "cosine"  # cosine | constant (after warmup)
    wd: float = 0.1  # AdamW decoupled weight decay, on the tensors lm.optim.decays selects
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
    data: str = ""  # "" = the bundled corpus; "gcide" (python -m lm.bpe install); else a file or a folder of .txt/.md
    tokenizer: str = "bytes"  # bytes | bpe (byte-level BPE of model.vocab_size, trained on the training split)
    out_dir: str = "runs/train"
    probe_gauges: bool = True  # the CLI runs the gauge census at start (finds the gauges to monitor)
    lr_mult: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, lo, hi, kw in _REALS:
            _number(f"train.{name}", getattr(self, name), lo, hi, **kw)
        for name, lo, hi in _INTS:
            _number(f"train.{name}", getattr(self, name), lo, hi, integer=True)
        for name, choices in _CHOICES:
            check_choice(f"train.{name}", getattr(self, name), choices)
        check_device("train.device", self.device)
        for name, ok, what in (("data", isinstance(self.data, str), 'a path string ("" = the bundled corpus)'),
                               ("out_dir", isinstance(self.out_dir, str) and self.out_dir, "a non-empty folder path"),
                               ("probe_gauges", isinstance(self.probe_gauges, bool), "true or false"),
                               ("lr_mult", isinstance(self.lr_mult, dict), "a mapping of lr group to multiplier")):
            if not ok:
                raise ValueError(f"train.{name} must be {what}, got {getattr(self, name)!r}")
        for k, v in self.lr_mult.items():
            if k not in LR_GROUPS:
                raise ValueError(f"train.lr_mult: unknown lr group {k!r}; the groups are {', '.join(LR_GROUPS)}")
            _number(f"train.lr_mult.{k}", v, 0.0, 1e4, lo_open=True)
        # AdamW multiplies decayed weights by 1 - lr*wd every step: at or past 1 it flips or zeroes them
        if self.lr * self.wd >= 1.0:
            raise ValueError(f"train.lr * train.wd must be in [0, 1) (AdamW scales the weights by 1 - lr*wd each "
                             f"step), got {self.lr:g} * {self.wd:g} = {self.lr * self.wd:g}")
        group, mult = max(((g, self.lr_mult.get(g, 1.0)) for g in DECAYED_LR_GROUPS), key=lambda gm: gm[1])
        if self.lr * mult * self.wd >= 1.0:
            raise ValueError(f"train.lr * train.lr_mult * train.wd must be in [0, 1) for every decayed group "
                             f"({', '.join(DECAYED_LR_GROUPS)}), got {self.lr:g} * {mult:g} * {self.wd:g} = "
                             f"{self.lr * mult * self.wd:g} for {group}")

    def check_model(self, model_cfg: Any, world: int = 1) -> None:
        """The model's vocabulary fits this run's tokens (the 256 bytes, or for BPE more than the 256 byte symbols and
        at most 2^20), and the global batch splits evenly over ``world`` data-parallel ranks."""
        if self.batch_size % world:
            raise ValueError(f"train.batch_size ({self.batch_size}) must be divisible by WORLD_SIZE ({world})")
        v = model_cfg.vocab_size
        if self.tokenizer == "bytes" and v != VOCAB_SIZE:
            raise ValueError(f"model.vocab_size must be {VOCAB_SIZE} (the tokens are bytes), got {v!r}")
        if self.tokenizer != "bytes" and not VOCAB_SIZE < v <= 1 << 20:
            raise ValueError(f"model.vocab_size must be an integer in ({VOCAB_SIZE}, {1 << 20}] for BPE (the "
                             f"byte alphabet plus merges), got {v!r}")

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


_REALS = (("lr", 0.0, 10.0, {"lo_open": True}), ("min_lr_frac", 0.0, 1.0, {}), ("wd", 0.0, 10.0, {}),
          ("beta1", 0.0, 1.0, {"hi_open": True}), ("beta2", 0.0, 1.0, {"hi_open": True}),
          ("adam_eps", 0.0, 1.0, {"lo_open": True}), ("grad_clip", 0.0, None, {}),
          ("val_fraction", 0.0, 1.0, {"lo_open": True, "hi_open": True}))
_INTS = (("warmup_steps", 0, None), ("batch_size", 1, None), ("max_steps", 1, None), ("max_tokens", 0, None),
         ("eval_interval", 0, None), ("eval_batches", 1, None), ("log_interval", 1, None), ("gauge_interval", 0, None),
         ("ckpt_interval", 0, None), ("seed", 0, 2**32 - 1), ("threads", 0, 1024))
_CHOICES = (("schedule", ("cosine", "constant")), ("dtype", ("float32", "float64")), ("tokenizer", ("bytes", "bpe")))

# keys that shape the trajectory: changing them on --resume would not continue the same run
RESUME_LOCKED = ("lr", "min_lr_frac", "warmup_steps", "schedule", "wd", "beta1", "beta2", "adam_eps", "grad_clip",
                 "batch_size", "seed", "dtype", "data", "val_fraction", "lr_mult", "tokenizer")


def _number(name: str, v: Any, lo: float | None, hi: float | None = None, *, integer: bool = False, **kw) -> None:
    if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
        what = f"an integer in [{lo}, {'inf' if hi is None else hi}]" if integer else "a number"
        raise ValueError(f"{name} must be {what}, got {v!r}")
    check_range(name, v, lo, hi, **kw)
