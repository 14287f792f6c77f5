"""The trained GRT behind the trained-model figures: ``--checkpoint``, or a small one trained once and cached.

Without ``--checkpoint`` the figures train a small GRT with the project's own
training pipeline (:func:`lm.train.train`) on the bundled corpus, under the
fixed budget :data:`FIGURE_BUDGET` (:data:`QUICK_BUDGET` with ``--quick``), and
cache the checkpoint under ``<cache>/<budget name>-<hash>/ckpt.pt``; the hash
covers every model and training setting, so a changed budget trains anew and an
unchanged one is reused.  Every trained-model caption carries
:attr:`TrainedModel.provenance`: which checkpoint, which config, how many steps and
tokens, and the validation loss it reached.

The sentence the figures trace is a real line of the bundled corpus
(:data:`SENTENCE`, Macbeth I.3, echoing the source text's "the earth is blue");
tokens are bytes, so the text's single token 'earth' is five tokens here and the
pair traces follow the last of them (:data:`TRACE_TOKEN`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from figures.registry import FigureUnavailable, progress

SENTENCE = "The earth hath bubbles, as the water has,"  # Macbeth I.3; checked to be in the corpus at run time
TRACE_WORD = "earth"  # the pair traces follow this word's last byte


@dataclass(frozen=True)
class Budget:
    """A model size plus a training budget for the figure model (all fields go into the cache key)."""

    name: str
    model: dict[str, Any]  # overrides of GRTConfig.small()
    train: dict[str, Any]  # TrainConfig fields
    note: str = ""  # why this size

    def key(self) -> str:
        blob = json.dumps({"model": self.model, "train": self.train}, sort_keys=True)
        return f"{self.name}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


# The default: GRTConfig.small() (d = 128: 4 heads of 32, 4 blocks, d_ff = 512, the text's 11/1/21 stage
# counts) with 64-byte windows, trained for a short, fixed budget (120 steps x 8 x 64 = 61,440 bytes, about
# 2 minutes on 2 CPU cores); enough for structure to appear in the traces, gates and attention maps, not a
# converged language model (the captions say so).  A fixed step count, not a time budget: the same model on
# every machine.
FIGURE_BUDGET = Budget(
    name="grt-small",
    model={"block_size": 64},
    train={"max_steps": 120, "batch_size": 8, "lr": 3e-3, "warmup_steps": 20, "wd": 0.1, "seed": 0,
           "eval_interval": 0, "eval_batches": 4, "log_interval": 10, "gauge_interval": 0, "ckpt_interval": 0,
           "probe_gauges": False, "device": "cpu", "dtype": "float32"},
    note="GRTConfig.small(block_size=64): the text's stage counts at d = 128, 4 heads, 4 blocks",
)
# --quick (tests): a two-block, d = 64 model for a handful of steps; captions say it is barely trained.
QUICK_BUDGET = Budget(
    name="grt-quick",
    model={"d_model": 64, "n_heads": 2, "n_blocks": 2, "d_ff": 128, "block_size": 64},
    train={"max_steps": 3, "batch_size": 2, "lr": 3e-3, "warmup_steps": 1, "wd": 0.1, "seed": 0,
           "eval_interval": 0, "eval_batches": 1, "log_interval": 1, "gauge_interval": 0, "ckpt_interval": 0,
           "probe_gauges": False, "device": "cpu", "dtype": "float32"},
    note="quick: 2 blocks at d = 64, 3 steps (for tests only)",
)


@dataclass
class TrainedModel:
    model: Any  # grt_model.model.GRT in eval mode
    config: Any  # GRTConfig
    checkpoint: str  # as shown in captions (relative to the output folder when it lives there)
    step: int
    tokens_seen: int
    train_config: dict[str, Any]
    val_loss: float | None
    auto_trained: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def provenance(self) -> str:
        c = self.config
        how = "auto-trained for these figures and cached" if self.auto_trained else "given by --checkpoint"
        val = "" if self.val_loss is None else f", validation loss {self.val_loss:.3f} nats/byte"
        tc = self.train_config
        return (f"checkpoint {self.checkpoint} ({how}): GRT d_model={c.d_model}, {c.n_heads} heads of "
                f"{c.d_head}, {c.n_blocks} blocks, d_ff={c.d_ff}; {self.step} steps of "
                f"{tc.get('batch_size', '?')}x{c.block_size} bytes = {self.tokens_seen:,} tokens of the bundled "
                f"corpus, AdamW lr {tc.get('lr', '?')}, wd {tc.get('wd', '?')}, seed {tc.get('seed', '?')}, "
                f"{tc.get('dtype', 'float32')}{val}")


def _imports():
    try:
        from grt_model.config import GRTConfig
        from grt_model.model import GRT  # noqa: F401  (the trace API lives there)
        from lm.checkpoint import load_checkpoint, model_from_checkpoint
        from lm.train import TrainConfig, train
    except ModuleNotFoundError as e:
        raise FigureUnavailable(f"the GRT model or its training pipeline is not in this checkout ({e.name})") from None
    return GRTConfig, TrainConfig, train, load_checkpoint, model_from_checkpoint


def _display_path(p: Path, out_dir: Path) -> str:
    try:
        return str(p.resolve().relative_to(out_dir.resolve()))
    except ValueError:
        return str(p)


def budget_for(quick: bool) -> Budget:
    return QUICK_BUDGET if quick else FIGURE_BUDGET


def ensure_checkpoint(ctx) -> tuple[Path, bool]:
    """The checkpoint to draw: ``--checkpoint``, else the cached auto-trained one (training it if absent)."""
    if ctx.checkpoint is not None:
        return Path(ctx.checkpoint), False
    GRTConfig, TrainConfig, train, _, _ = _imports()
    b = budget_for(ctx.quick)
    run_dir = ctx.cache_dir / b.key()
    ckpt = run_dir / "ckpt.pt"
    if ckpt.is_file():
        progress(f"using the cached figure model {ckpt} ({b.note})")
        return ckpt, True
    cfg = GRTConfig.small(**b.model)
    tc = TrainConfig(**{**b.train, "out_dir": str(run_dir), "threads": ctx.threads})
    steps = tc.total_steps(cfg.block_size)
    print(f"[figures] NOTICE: no --checkpoint given: training a small GRT for the trained-model figures "
          f"({b.note}; {steps} steps of {tc.batch_size}x{cfg.block_size} bytes). It is cached at {ckpt} and "
          f"reused next time; pass --checkpoint PATH to draw your own model.", file=sys.stderr, flush=True)
    train("grt", cfg, tc, progress=True, label="figures ")
    if not ckpt.is_file():
        raise RuntimeError(f"training finished but wrote no checkpoint at {ckpt}")
    return ckpt, True


def trained_model(ctx) -> TrainedModel:
    """Load (training first if needed) the figure model once per run."""

    def load() -> TrainedModel:
        _, _, _, load_checkpoint, model_from_checkpoint = _imports()
        path, auto = ensure_checkpoint(ctx)
        ck = load_checkpoint(path, map_location="cpu")
        if ck.get("model_kind") != "grt":
            raise ValueError(f"--checkpoint {path} holds a {ck.get('model_kind')!r} model; the figures need a GRT "
                             f"(python -m lm.train --model grt)")
        model = model_from_checkpoint(ck, device="cpu").float().eval()
        model.requires_grad_(False)
        evals = ck.get("extra", {}).get("evals") or []
        val = float(evals[-1]["val_loss"]) if evals else None
        return TrainedModel(model=model, config=model.config, checkpoint=_display_path(path, ctx.out_dir),
                            step=int(ck["step"]), tokens_seen=int(ck["tokens_seen"]),
                            train_config=dict(ck.get("train_config", {})), val_loss=val, auto_trained=auto)

    return ctx.memo("trained_model", load)


@dataclass
class SentenceTrace:
    text: str  # the sentence (bytes decoded one per token for labels)
    labels: list[str]  # one printable label per byte token
    token: int  # position of the traced token (last byte of TRACE_WORD)
    trace: Any  # grt_model.model.GRTTrace for a batch of one
    tm: TrainedModel


def sentence_trace(ctx) -> SentenceTrace:
    """The figure model's full trace of :data:`SENTENCE` (memoized)."""

    def run() -> SentenceTrace:
        from lm.corpus import encode, load_text

        tm = trained_model(ctx)
        if SENTENCE not in load_text():
            raise RuntimeError(f"the figure sentence {SENTENCE!r} is not in the bundled corpus; update "
                               f"figures.model_source.SENTENCE to a line that is")
        ids = torch.from_numpy(encode(SENTENCE).astype("int64")).unsqueeze(0)  # (1, T)
        T = min(ids.shape[1], tm.config.block_size)
        ids = ids[:, :T]
        text = SENTENCE[:T]
        token = text.index(TRACE_WORD) + len(TRACE_WORD) - 1
        with torch.no_grad():
            tr = tm.model.trace(ids)
        labels = ["␣" if ch == " " else ch for ch in text]
        return SentenceTrace(text, labels, token, tr, tm)

    return ctx.memo("sentence_trace", run)


def budget_dict(b: Budget) -> dict[str, Any]:
    return asdict(b)


def write_untrained_checkpoint(path, seed: int = 0, **overrides: Any) -> Path:
    """A checkpoint of a freshly initialized tiny GRT (no training): for tests and for trying the figures fast.

    ``overrides`` update ``GRTConfig.small(d_model=32, n_heads=2, n_blocks=1, d_ff=64, block_size=64)``.
    """
    from grt_model.config import GRTConfig
    from grt_model.model import GRT
    from lm.checkpoint import save_checkpoint
    from rmsgauge import seed_everything

    cfg = GRTConfig.small(**{"d_model": 32, "n_heads": 2, "n_blocks": 1, "d_ff": 64, "block_size": 64, **overrides})
    seed_everything(seed)
    model = GRT(cfg)
    return save_checkpoint(path, model_kind="grt", model=model, optimizer=None,
                           train_config={"batch_size": 0, "lr": 0.0, "wd": 0.0, "seed": seed, "dtype": "float32"},
                           step=0, tokens_seen=0)
