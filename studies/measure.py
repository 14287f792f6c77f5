r"""What the experiment grid measures on a trained model, beyond its training log: bits per byte on the **whole
validation split** (:func:`lm.scoring.full_split_bpb`, every byte scored once; the log's ``val_bpb`` is a 16-batch
sample), the GRT's gates, the negative-determinant fraction and the per-block gradient norms.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from lm.scoring import full_split_bpb
from rmsgauge.corpus import ByteCorpus

__all__ = ["block_grad_norms", "full_split_bpb", "gates", "grad_norm_ratio", "held_out_batch",
           "negative_det_fraction"]

HELD_OUT_WINDOWS = 8  # the trained claims' held-out batch: 8 validation windows (seed 0)


def held_out_batch(corpus: ByteCorpus, block_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``([8, T], [8, T])`` validation windows and their next bytes: the same draw as
    ``python -m grt_model --claims --trained``."""
    return corpus.batch("val", HELD_OUT_WINDOWS, block_size, generator=torch.Generator().manual_seed(seed))


def gates(model: nn.Module) -> list[list[float]] | None:
    """The GRT's residual gates ``[n_blocks, 3]`` (attention, mixer, FFN); ``None`` for a model without gates."""
    fn = getattr(model, "gates", None)
    if not callable(fn):
        return None
    with torch.no_grad():
        return fn().tolist()


def negative_det_fraction(model: nn.Module, ids: torch.Tensor) -> dict[str, Any] | None:
    """GRT only (a dense model has no coupled projections): see
    :func:`studies.trained.measure.negative_det_fraction`."""
    from grt_model.model import GRT
    from studies.trained.measure import negative_det_fraction as neg_det

    if not isinstance(model, GRT):
        return None
    return neg_det(model, ids)


def block_grad_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """The L2 norm of the loss gradient over each block's parameters, on inputs ``x [B, T]`` and next bytes
    ``y [B, T]`` (the stability grid's last-block / first-block ratio, at init and after training)."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        raise ValueError(f"{type(model).__name__} has no .blocks ModuleList: no per-block gradient norms")
    was = model.training
    model.train()
    try:
        model.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        out = [math.sqrt(sum(float(p.grad.double().square().sum()) for p in blk.parameters() if p.grad is not None))
               for blk in blocks]
        model.zero_grad(set_to_none=True)
        return out
    finally:
        model.train(was)


def grad_norm_ratio(norms: list[float]) -> float | None:
    """Last block over first block (``None`` when the first is zero or not finite)."""
    if not norms or not math.isfinite(norms[0]) or norms[0] == 0.0:
        return None
    return norms[-1] / norms[0]
