r"""What the experiment grid measures on a trained model, beyond its training log.

* :func:`full_split_bpb` -- bits per byte on the **whole validation split**: the split cut into consecutive
  windows of ``block_size + 1`` bytes overlapping by one (window ``i`` predicts bytes
  ``iT+1 .. (i+1)T`` from the bytes before them inside the window), so every byte after the first is scored
  exactly once.  The training log's ``val_bpb`` is a *sample*: 16 fixed random batches of windows.
  :math:`\text{bpb} = \sum_t -\ln p(x_t \mid x_{<t}) / (N \ln 2)`, the sum in float64.
* :func:`gates` -- the GRT's residual gates ``[n_blocks, 3]`` (attention, mixer, FFN).
* :func:`negative_det_fraction` -- on held-out windows, the fraction of (token, head) Jacobians of the
  coupled projections with negative determinant (float64, :mod:`studies.trained_measure`).
* :func:`block_grad_norms` -- the gradient norm of each block's parameters on one held-out batch: the
  stability grid's last-block / first-block ratio, at init and after training.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lm.corpus import ByteCorpus

HELD_OUT_WINDOWS = 8  # the trained claims' held-out batch: 8 validation windows (seed 0)
JAC_TOKENS = 128


def full_split_bpb(model: nn.Module, corpus: ByteCorpus, batch_windows: int = 64) -> dict[str, Any]:
    """``{"bpb", "bytes_scored", "windows"}`` over every byte of the validation split (see the module doc)."""
    val = torch.as_tensor(corpus.split("val").astype("int64"))
    T = int(model.config.block_size)
    n_win = (len(val) - 1) // T
    if n_win < 1:
        raise ValueError(f"the validation split ({len(val)} bytes) is shorter than one window of {T + 1} bytes")
    starts = torch.arange(n_win) * T
    nll, count = torch.zeros((), dtype=torch.float64), 0
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, n_win, batch_windows):
                idx = starts[i:i + batch_windows, None] + torch.arange(T + 1)  # (b, T+1)
                w = val[idx]
                logits, _ = model(w[:, :-1])  # (b, T, V)
                nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), w[:, 1:].reshape(-1),
                                       reduction="sum")
                count += w[:, 1:].numel()
        tail = val[n_win * T:]
        if len(tail) > 1:  # the last partial window: its bytes are scored too
            with torch.no_grad():
                logits, _ = model(tail[None, :-1])
                nll += F.cross_entropy(logits[0].double(), tail[1:], reduction="sum")
                count += len(tail) - 1
    finally:
        model.train(was)
    return {"bpb": float(nll) / count / math.log(2), "bytes_scored": count, "windows": n_win + (len(tail) > 1)}


def held_out_batch(corpus: ByteCorpus, block_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``([8, T], [8, T])`` validation windows and their next bytes: the same draw as
    ``python -m grt_model --claims --trained``."""
    x, y = corpus.batch("val", HELD_OUT_WINDOWS, block_size, generator=torch.Generator().manual_seed(seed))
    return x, y


def gates(model: nn.Module) -> list[list[float]] | None:
    fn = getattr(model, "gates", None)
    if not callable(fn):
        return None
    with torch.no_grad():
        return fn().tolist()


def negative_det_fraction(model: nn.Module, ids: torch.Tensor) -> dict[str, Any] | None:
    """GRT only (a dense model has no coupled projections): see
    :func:`studies.trained_measure.negative_det_fraction`."""
    from grt_model.model import GRT
    from studies.trained_measure import negative_det_fraction as neg_det

    if not isinstance(model, GRT):
        return None
    return neg_det(model, ids, JAC_TOKENS)


def _block_list(model: nn.Module) -> nn.ModuleList:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        raise ValueError(f"{type(model).__name__} has no .blocks ModuleList: no per-block gradient norms")
    return blocks


def block_grad_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """The L2 norm of the loss gradient over each block's parameters, on inputs ``x [B, T]`` and next bytes
    ``y [B, T]``."""
    blocks = _block_list(model)
    was = model.training
    model.train()
    try:
        model.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        out = []
        for blk in blocks:
            sq = sum(float(p.grad.double().square().sum()) for p in blk.parameters() if p.grad is not None)
            out.append(math.sqrt(sq))
        model.zero_grad(set_to_none=True)
        return out
    finally:
        model.train(was)


def grad_norm_ratio(norms: list[float]) -> float | None:
    """Last block over first block (``None`` when the first is zero or not finite)."""
    if not norms or not math.isfinite(norms[0]) or norms[0] == 0.0:
        return None
    return norms[-1] / norms[0]
