r"""Small models for ``python -m gauge census --model gauge.census.examples:FACTORY`` (each returns ``(model, batch)``):
the project's own models (``dense_qknorm``, ``dense_plain``, ``grt``; random init) and a conv net.

``conv_bn``: a conv layer feeding BatchNorm2d in training mode, the classic case of the scale-invariance literature.
With :math:`z_c = W_c * x + b_c`, BatchNorm computes :math:`(z_c - \mu_c)/\sigma_c` over the batch and positions;
:math:`W_c \to sW_c` scales both :math:`z_c - \mu_c` and :math:`\sigma_c` by :math:`s` (the bias cancels), so each
filter is its own gauge and the bias is unused.  In eval mode (``conv_bn_eval``) the running statistics make an
affine map: no gauge, and the bias is read.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from grt_model import GRT
from grt_model.config import GRTConfig
from lm.dense import DenseConfig, DenseTransformer
from rmsgauge import seed_everything

CHANNELS_IN, CHANNELS, CLASSES, SIDE, BATCH = 3, 6, 4, 6, 4
TOKEN_BATCH = (2, 16)  # (sequences, tokens) of the project models' random byte batch


class ConvBN(nn.Module):
    """conv 3x3 (with bias) -> BatchNorm2d -> ReLU -> mean over positions -> linear -> cross-entropy."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS_IN, CHANNELS, 3, padding=1)
        self.bn = nn.BatchNorm2d(CHANNELS)
        self.head = nn.Linear(CHANNELS, CLASSES)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.conv(x))).mean(dim=(2, 3))
        return F.cross_entropy(self.head(h), y)


def conv_bn(train: bool = True) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``--model gauge.census.examples:conv_bn``: conv -> BatchNorm2d in training mode (the model's own flag)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    return ConvBN().train(train), (torch.randn(BATCH, CHANNELS_IN, SIDE, SIDE, generator=gen),
                                   torch.randint(0, CLASSES, (BATCH,), generator=gen))


def conv_bn_eval() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``--model gauge.census.examples:conv_bn_eval``: the same net in eval mode (running statistics: no gauge)."""
    return conv_bn(train=False)


def dense_qknorm(d_model: int = 64, n_layers: int = 2) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``--model gauge.census.examples:dense_qknorm [--set n_layers=1]``: lm.dense with per-head QK-norm (eps 1e-6), 4
    heads, random init."""
    return _project("dense", d_model, n_layers, qk_norm=True, qk_norm_eps=1e-6)


def dense_plain(d_model: int = 64, n_layers: int = 2) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``--model gauge.census.examples:dense_plain``: lm.dense without QK-norm."""
    return _project("dense", d_model, n_layers, qk_norm=False)


def grt(d_model: int = 32, n_layers: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``--model gauge.census.examples:grt``: a small GRT (one block, 2 heads, short cascades)."""
    return _project("grt", d_model, n_layers)


def _project(kind: str, d_model: int, n_layers: int, **kw: Any) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    seed_everything(0)
    if kind == "dense":
        model: nn.Module = DenseTransformer(DenseConfig(d_model=d_model, n_heads=4, n_layers=n_layers,
                                                              d_ff=2 * d_model, block_size=32, **kw))
    else:
        model = GRT(GRTConfig(vocab_size=256, block_size=32, d_model=d_model, n_heads=2, n_blocks=n_layers,
                              d_ff=2 * d_model, qkvo_stages=3, mixer_stages=1, ffn_stages=3))
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, TOKEN_BATCH, generator=gen)
    return model, (x, torch.roll(x, -1, dims=1))
