"""One seam in every model's attention: who attends, given the projected queries, keys and values.

The GRT (:class:`grt_model.model.GRTAttention`) and the dense baseline (``lm.dense.DenseAttention``) compute their
own Q, K, V (cascades or matrices, QK-norm where configured) and then, by default, rotary position at positions
``0..T-1`` and causal softmax attention.  Inside :func:`attention_override` that last step is the caller's
``fn(module, q, k, v) -> y`` instead (``q``, ``k``, ``v``: ``[B, H, T, d_head]`` before rotary position; ``y`` the
same shape): the Hugging Face classes (:mod:`lm.hf_classes`) attend over a key/value cache at absolute positions,
while every other layer -- norms, gates, mixer, FFN, residual order -- is the model's own forward, never a copy.
A module says what the override needs: ``layer_index`` (its block), ``rope`` and ``rope_base``.

The GRT's default attention is ``F.scaled_dot_product_attention``; inside :func:`explicit_attention` it is
:func:`causal_attention_with_weights` instead (the same function, tested equal), which ``torch.func``
transforms and the tracer (it keeps the weights) need.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar

import torch
from torch import nn

Attend = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# context variables (per thread and task), not module globals: concurrent forwards do not see each other's
_OVERRIDE: ContextVar[Attend | None] = ContextVar("rmsgauge_attention_override", default=None)
_EXPLICIT_ATTENTION: ContextVar[bool] = ContextVar("grt_explicit_attention", default=False)


@contextmanager
def _setting(var: ContextVar, value: object) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def attention_override(fn: Attend) -> AbstractContextManager[None]:
    """Within the block, every attention module of either model hands its ``(q, k, v)`` to ``fn``."""
    return _setting(_OVERRIDE, fn)


def current_override() -> Attend | None:
    return _OVERRIDE.get()


def explicit_attention() -> AbstractContextManager[None]:
    """Compute attention as an explicit masked softmax instead of ``F.scaled_dot_product_attention``.

    The same function (tested equal); use it under ``torch.func`` transforms (``jacrev``, ``vmap``),
    where SDPA's CPU backward has no batching rule and falls back to a slow per-sample loop with a warning.
    """
    return _setting(_EXPLICIT_ATTENTION, True)


def explicit_attention_active() -> bool:
    return _EXPLICIT_ATTENTION.get()


def causal_attention_with_weights(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit ``softmax(q k^T / sqrt(d) + causal mask) v`` returning the weights ``[B, H, T, T]``
    (the same function ``F.scaled_dot_product_attention(is_causal=True)`` computes; tested)."""
    T, dh = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(dh)  # (B, H, T, T)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return w @ v, w
