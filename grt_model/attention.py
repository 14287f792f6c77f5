"""One seam in every model's attention: who attends, given the projected queries, keys and values.

The GRT (:class:`grt_model.model.GRTAttention`) and the dense baseline (``lm.dense.DenseAttention``) compute their
own Q, K, V (cascades or matrices, QK-norm where configured) and then, by default, rotary position at positions
``0..T-1`` and causal softmax attention.  Inside :func:`attention_override` that last step is the caller's
``fn(module, q, k, v) -> y`` instead (``q``, ``k``, ``v``: ``[B, H, T, d_head]`` before rotary position; ``y`` the
same shape): the Hugging Face classes (:mod:`lm.hf`) attend over a key/value cache at absolute positions this way,
while every other layer -- norms, gates, mixer, FFN, residual order -- is the model's own forward, never a copy.
A module says what the override needs: ``layer_index`` (its block), ``rope`` and ``rope_base``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

Attend = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# a context variable (per thread and task), not a module global: concurrent forwards do not see each other's
_OVERRIDE: ContextVar[Attend | None] = ContextVar("rmsgauge_attention_override", default=None)


@contextmanager
def attention_override(fn: Attend) -> Iterator[None]:
    """Within the block, every attention module of either model hands its ``(q, k, v)`` to ``fn``."""
    token = _OVERRIDE.set(fn)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def current_override() -> Attend | None:
    return _OVERRIDE.get()
