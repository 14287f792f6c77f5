"""The trained GRT behind the trained-model figures, and the sentence they trace.

Without ``--checkpoint`` the figures draw the shipped reference GRT (:func:`lm.reference.load_reference`: its sha256
is checked against its model card before anything is unpickled); with it, that training checkpoint.  Every trained
caption carries :attr:`TrainedModel.provenance` (weights, config, steps, tokens, validation loss).  :data:`SENTENCE`
is a line of the bundled corpus; tokens are bytes, so the pair traces follow the last byte of :data:`TRACE_WORD`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from figures.registry import FigureUnavailable, progress

SENTENCE = "The earth hath bubbles, as the water has,"  # Macbeth I.3; checked to be in the corpus at run time
TRACE_WORD = "earth"  # the pair traces follow this word's last byte
REFERENCE_NAME = "grt"  # lm.reference's name of the shipped GRT


@dataclass
class TrainedModel:
    model: Any  # grt_model.model.GRT in eval mode, float32
    config: Any  # GRTConfig
    checkpoint: str  # as shown in captions (relative to the output folder when it lives there)
    step: int
    tokens_seen: int
    train_config: dict[str, Any]
    val_loss: float | None
    shipped: bool  # the package's reference model (True) or a --checkpoint (False)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the shipped card's sha256 and val bits per byte

    @property
    def provenance(self) -> str:
        c = self.config
        how = (f"the shipped reference GRT, sha256 {str(self.extra.get('sha256', '?'))[:12]}... verified; "
               f"reproduce: {self.extra.get('reproduce', '?')}") if self.shipped else "given by --checkpoint"
        tc = self.train_config
        full = self.extra.get("final_val_bpb_full")  # the model card's headline: every validation byte scored once
        sample = None if self.val_loss is None else (f"the training log's {tc.get('eval_batches', '?')}-batch "
                                                      f"sample: {self.val_loss / math.log(2):.3f} bits/byte")
        if full is not None:
            val = f", validation {full:.4f} bits/byte on the whole split" + ("" if sample is None else f" ({sample})")
        else:
            val = "" if sample is None else f", validation loss {self.val_loss:.3f} nats/byte ({sample})"
        return (f"checkpoint {self.checkpoint} ({how}): GRT d_model={c.d_model}, {c.n_heads} heads of "
                f"{c.d_head}, {c.n_blocks} blocks, d_ff={c.d_ff}; {self.step} steps of "
                f"{tc.get('batch_size', '?')}x{c.block_size} bytes = {self.tokens_seen:,} tokens of the bundled "
                f"corpus, AdamW lr {tc.get('lr', '?')}, wd {tc.get('wd', '?')}, seed {tc.get('seed', '?')}, "
                f"{tc.get('dtype', 'float32')}{val}")


def _display_path(p: Path, out_dir: Path) -> str:
    try:
        return str(p.resolve().relative_to(out_dir.resolve()))
    except ValueError:
        return str(p)


def _from_checkpoint(ctx) -> TrainedModel:
    from lm.checkpoint import load_checkpoint, model_from_checkpoint

    path = Path(ctx.checkpoint)
    ck = load_checkpoint(path, map_location="cpu")
    if ck.get("model_kind") != "grt":
        raise ValueError(f"--checkpoint {path} holds a {ck.get('model_kind')!r} model; the figures need a GRT "
                         f"(python -m lm.train --model grt)")
    model = model_from_checkpoint(ck, device="cpu").float().eval()
    evals = ck.get("extra", {}).get("evals") or []
    val = float(evals[-1]["val_loss"]) if evals else None
    return TrainedModel(model=model, config=model.config, checkpoint=_display_path(path, ctx.out_dir),
                        step=int(ck["step"]), tokens_seen=int(ck["tokens_seen"]),
                        train_config=dict(ck.get("train_config", {})), val_loss=val, shipped=False)


def _shipped() -> TrainedModel:
    from lm.reference import load_reference

    try:
        model = load_reference(REFERENCE_NAME)
    except FileNotFoundError as e:
        raise FigureUnavailable(f"{e}; pass --checkpoint PATH to draw a checkpoint of your own") from None
    card = model.reference_card
    model = model.float().eval()
    val = card.get("final_val_loss")
    weights = card.get("weights_file") or f"{REFERENCE_NAME}.pt"
    return TrainedModel(model=model, config=model.config, checkpoint=f"lm/reference_models/{weights}",
                        step=int(card.get("steps") or 0), tokens_seen=int(card.get("tokens_seen") or 0),
                        train_config=dict(card.get("train_config") or {}),
                        val_loss=None if val is None else float(val), shipped=True,
                        extra={"sha256": card.get("sha256"), "reproduce": card.get("reproduce"),
                               "final_val_bpb_full": card.get("final_val_bpb_full")})


def trained_model(ctx) -> TrainedModel:
    """The figure model, loaded once per run: ``--checkpoint``, else the shipped reference GRT."""

    def load() -> TrainedModel:
        tm = _from_checkpoint(ctx) if ctx.checkpoint is not None else _shipped()
        tm.model.requires_grad_(False)
        progress(f"trained-model figures draw {tm.checkpoint} ({tm.tokens_seen:,} tokens seen)")
        return tm

    return ctx.memo("trained_model", load)


@dataclass
class SentenceTrace:
    text: str  # the sentence (bytes decoded one per token for labels)
    labels: list[str]  # one printable label per byte token
    token: int  # position of the traced token (last byte of TRACE_WORD)
    trace: Any  # grt_model.trace.GRTTrace for a batch of one
    tm: TrainedModel


def sentence_trace(ctx) -> SentenceTrace:
    """The figure model's full trace of :data:`SENTENCE` (memoized)."""

    def run() -> SentenceTrace:
        from grt_model.trace import trace_model
        from rmsgauge.corpus import encode, load_text

        tm = trained_model(ctx)
        if SENTENCE not in load_text():
            raise RuntimeError(f"the figure sentence {SENTENCE!r} is not in the bundled corpus; update "
                               f"figures.model_source.SENTENCE to a line that is")
        ids = torch.from_numpy(encode(SENTENCE).astype("int64")).unsqueeze(0)  # (1, T)
        T = min(ids.shape[1], tm.config.block_size)
        ids = ids[:, :T]
        text = SENTENCE[:T]
        token = text.index(TRACE_WORD) + len(TRACE_WORD) - 1
        labels = ["␣" if ch == " " else ch for ch in text]
        return SentenceTrace(text, labels, token, trace_model(tm.model, ids), tm)

    return ctx.memo("sentence_trace", run)
