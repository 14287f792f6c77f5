r"""Small models for ``python -m gauge census --model gauge.census_examples:FACTORY`` (each returns ``(model, batch)``).

``conv_bn``: the classic case of the scale-invariance literature (van Laarhoven 2017; Hoffer et al. 2018; Li & Arora
2019; Wan et al. 2021), a conv layer feeding BatchNorm2d, in training mode.  With :math:`z_c = W_c * x + b_c` the
output channel :math:`c` of the conv (filter :math:`W_c`, bias :math:`b_c`), BatchNorm in training mode computes
:math:`(z_c - \mu_c)/\sigma_c` with :math:`\mu_c, \sigma_c` the mean and standard deviation of channel :math:`c`
over the batch and positions.  Scaling one filter, :math:`W_c \to sW_c`: :math:`z_c - \mu_c \to s(W_c * x -
\overline{W_c * x})` and :math:`\sigma_c \to s\sigma_c` (the bias cancels in :math:`z_c - \mu_c`), so the output is
unchanged: each filter is its own gauge ("rows: 6 blocks of 1"), and the bias is unused (the batch mean removes
it).  In eval mode (``conv_bn_eval``) BatchNorm applies its running statistics, an affine map that does not move with
the weight: no gauge, and the bias is read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CHANNELS_IN, CHANNELS, CLASSES, SIDE, BATCH = 3, 6, 4, 6, 4


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


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(BATCH, CHANNELS_IN, SIDE, SIDE, generator=gen),
            torch.randint(0, CLASSES, (BATCH,), generator=gen))


def conv_bn() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``--model gauge.census_examples:conv_bn``: conv -> BatchNorm2d in training mode (the model's own flag)."""
    torch.manual_seed(0)
    return ConvBN().train(), _batch()


def conv_bn_eval() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``--model gauge.census_examples:conv_bn_eval``: the same net in eval mode (running statistics: no gauge)."""
    torch.manual_seed(0)
    return ConvBN().eval(), _batch()
