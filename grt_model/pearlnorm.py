r"""PearlNorm: divide the token by its mean pair radius, then a learned per-coordinate gain.

With the adjacent (stage-0) pairing :math:`r_p = \sqrt{x_{2p}^2 + x_{2p+1}^2}`,

.. math::  \mu(x) = \frac1P\sum_{p=0}^{P-1} r_p, \qquad
           \operatorname{PearlNorm}(x) = \frac{x}{\mu(x) + \epsilon}\odot\gamma .

Source: ``001_cfb910613b442095.txt`` -- PearlNorm "rescales by a single per-token factor read from the pair radii
... its learned per-coordinate gain leaves the radii unequal".  The text does not say *which* factor; the mean pair
radius is the one read from the radii alone (an :math:`\ell_{2,1}` group norm over :math:`P`; the RMS of the radii
would just be :math:`\sqrt2` times RMSNorm).  :math:`\mu \le \sqrt{\tfrac1P\sum r_p^2}` (power means), with
equality exactly on a ring.

**A scale gauge**: with :math:`\epsilon = 0`, :math:`\operatorname{PearlNorm}(cx) = \operatorname{PearlNorm}(x)`
for every :math:`c > 0`, so by Euler's theorem :math:`J(x)\,x = 0` and a weight :math:`W` feeding it has
:math:`\langle\nabla_W L, W\rangle = 0`.  With :math:`\epsilon > 0` the gauge breaks by exactly
:math:`\tfrac{d}{dc}\operatorname{PearlNorm}(cx)|_{c=1} = \epsilon\,x\odot\gamma/(\mu+\epsilon)^2`.

**Jacobian** (gain omitted, :math:`\epsilon = 0`, all :math:`r_p > 0`):

.. math::  J = \frac1\mu\big(I - u v^\top\big), \quad u = x/\mu,\quad v = \nabla\mu, \quad v^\top u = 1,

an oblique projector along :math:`x`, so :math:`\lVert I - uv^\top\rVert_2 = \lVert u\rVert\lVert v\rVert`
(Szyld 2006, *The many proofs of an identity on the norm of oblique projections*) and, with
:math:`\lVert\nabla\mu\rVert = 1/\sqrt P`,

.. math::  \lVert J\rVert_2 = \frac{\rho}{\mu^2}, \qquad \rho = \sqrt{\tfrac1P\textstyle\sum_p r_p^2}.

``eps`` defaults to 0 (the exact gauge).  An all-zero token is divided by ``finfo.tiny`` (it maps to 0, not NaN),
and a pair with :math:`r_p = 0` contributes the minimum-norm subgradient 0 to :math:`\nabla\mu`, not autograd's NaN.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def safe_pair_radius(x: torch.Tensor) -> torch.Tensor:
    """``[..., 2P] -> [..., P]`` radii with a zero (not NaN) gradient at a zero pair (double-where trick)."""
    v = x.unflatten(-1, (x.shape[-1] // 2, 2))  # (..., P, 2)
    r2 = (v * v).sum(dim=-1)  # (..., P)
    nz = r2 > 0
    # the inner where keeps sqrt's backward finite at 0; the outer one selects the value 0 there
    return torch.where(nz, torch.sqrt(torch.where(nz, r2, torch.ones_like(r2))), torch.zeros_like(r2))


def mean_pair_radius(x: torch.Tensor) -> torch.Tensor:
    """``[..., 2P] -> [..., 1]``: mu(x) = mean_p r_p."""
    return safe_pair_radius(x).mean(dim=-1, keepdim=True)


def pearl_norm(x: torch.Tensor, eps: float = 0.0, gain: torch.Tensor | None = None) -> torch.Tensor:
    """``x / (mu(x) + eps) * gain`` over the last dim (see the module docstring)."""
    mu = (mean_pair_radius(x) + eps).clamp_min(torch.finfo(x.dtype).tiny)  # (..., 1)
    out = x / mu
    return out if gain is None else out * gain


def pearl_norm_jacobian_norm(x: torch.Tensor) -> torch.Tensor:
    """Closed-form spectral norm of PearlNorm's Jacobian (gain 1, eps 0, all radii > 0): rho / mu^2."""
    r = safe_pair_radius(x)  # (..., P)
    mu = r.mean(dim=-1)
    rho = torch.sqrt((r * r).mean(dim=-1))
    return rho / (mu * mu)


class PearlNorm(nn.Module):
    """Mean-pair-radius normalization with a learned per-coordinate gain (init ``gain_init``)."""

    def __init__(self, dim: int, eps: float = 0.0, gain_init: float = 1.0, *,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        if dim < 2 or dim % 2:
            raise ValueError(f"PearlNorm dim must be even and >= 2 (it reads pair radii), got {dim}")
        if not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"PearlNorm eps must be in [0, inf), got {eps}")
        self.dim, self.eps, self.gain_init = dim, float(eps), float(gain_init)
        self.gain = nn.Parameter(torch.full((dim,), float(gain_init), dtype=dtype, device=device))  # (D,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"PearlNorm expects last dim {self.dim}, got shape {tuple(x.shape)}")
        return pearl_norm(x, self.eps, self.gain)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps:g}, gain_init={self.gain_init:g}"
