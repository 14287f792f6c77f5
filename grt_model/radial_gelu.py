r"""RadialGELU: GELU on each pair's radius, the pair's angle untouched.

With the adjacent pairing :math:`x_p = (x_{2p}, x_{2p+1})`, :math:`r_p = \lVert x_p\rVert` and the exact GELU
:math:`\operatorname{GELU}(r) = r\,\Phi(r)` (Hendrycks & Gimpel 2016, arXiv:1606.08415; :math:`\Phi` the standard
normal CDF, via erf),

.. math::  y_p = \frac{\operatorname{GELU}(r_p)}{r_p}\,x_p = \Phi(r_p)\,x_p .

Since :math:`\Phi > 0` the angle is preserved exactly and the radius is :math:`\operatorname{GELU}(r_p)`.  Source:
``001_cfb910613b442095.txt`` ("RadialGELU applies GELU to each pair's radius while preserving its angle ... the only
nonlinearity in the FFN").  In the FFN the adjacent pairing is that of the expand cascade's last stage at the
reference sizes (stage 20 at :math:`d_{ff} = 1024` has stride :math:`2^{20 \bmod 10} = 1`): the pairs that stage
just rotated.

**At r = 0** (the FFN's padded pairs start there) the map is :math:`C^1` with Jacobian
:math:`J = \Phi(r)I + \varphi(r)\,x x^\top/r \to I/2`.  Autograd through :math:`\sqrt{r^2}` would give
0 * inf = NaN there; the double-where trick evaluates :math:`\Phi` on a safe radius and selects
:math:`\Phi(0) = 1/2` at zero pairs, so the value and the gradient are finite and exact.
"""

from __future__ import annotations

import math

import torch
from torch import nn

_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def radial_gelu(x: torch.Tensor) -> torch.Tensor:
    """``[..., 2P] -> [..., 2P]``: y_p = Phi(r_p) x_p on adjacent pairs."""
    v = x.unflatten(-1, (x.shape[-1] // 2, 2))  # (..., P, 2)
    r2 = (v * v).sum(dim=-1, keepdim=True)  # (..., P, 1)
    nz = r2 > 0
    r = torch.sqrt(torch.where(nz, r2, torch.ones_like(r2)))  # safe radius: sqrt never sees 0
    cdf = 0.5 * (1.0 + torch.erf(r * _INV_SQRT2))  # Phi(r)
    cdf = torch.where(nz, cdf, torch.full_like(cdf, 0.5))  # Phi(0) = 1/2 at zero pairs
    return (cdf * v).flatten(-2)


class RadialGELU(nn.Module):
    """Parameter-free module wrapper of :func:`radial_gelu` (input width must be even)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] % 2:
            raise ValueError(f"RadialGELU needs an even last dim (pairs), got shape {tuple(x.shape)}")
        return radial_gelu(x)
