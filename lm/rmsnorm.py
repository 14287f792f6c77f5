r"""RMSNorm with an explicit epsilon, and its closed-form Jacobian.

.. math::  \operatorname{RMSNorm}(z) = \frac{z}{\sqrt{\tfrac1n \lVert z\rVert^2 + \epsilon}}\odot \gamma

(Zhang & Sennrich, *Root Mean Square Layer Normalization*, NeurIPS 2019,
arXiv:1910.07467).  With :math:`\epsilon = 0` it is homogeneous of degree 0 in
:math:`z` for :math:`c > 0`, which is the source of the scale gauge; its
Jacobian (gain omitted)

.. math::  J(z) = \frac{1}{\rho}\Big(I - \frac{z z^\top}{n\rho^2}\Big),
           \qquad \rho = \sqrt{\tfrac1n\lVert z\rVert^2 + \epsilon}

satisfies :math:`J(z)\,z = \frac{\epsilon}{\rho^3} z`, which is exactly 0 at
:math:`\epsilon = 0`.

``eps`` defaults to 0 here (the exact gauge).  ``torch.nn.RMSNorm``'s default is
``eps=None``, meaning ``torch.finfo(dtype).eps``; pass that to compare.
"""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(z: torch.Tensor, eps: float = 0.0, weight: torch.Tensor | None = None) -> torch.Tensor:
    rho = torch.sqrt(z.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    out = z / rho
    return out if weight is None else out * weight


def rms_norm_jacobian(z: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Closed form ``[..., n, n]`` Jacobian of :func:`rms_norm` (no gain) at ``z``."""
    n = z.shape[-1]
    rho = torch.sqrt(z.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    eye = torch.eye(n, dtype=z.dtype, device=z.device)
    outer = z.unsqueeze(-1) * z.unsqueeze(-2)  # (..., n, n)
    return (eye - outer / (n * rho.unsqueeze(-1) ** 2)) / rho.unsqueeze(-1)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim with an optional learned gain; ``eps`` explicit (default 0)."""

    def __init__(self, dim: int, eps: float = 0.0, affine: bool = True,
                 dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        if eps < 0:
            raise ValueError(f"RMSNorm eps must be >= 0, got {eps}")
        self.dim, self.eps = dim, float(eps)
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device)) if affine else None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return rms_norm(z, self.eps, self.weight)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps:g}, affine={self.weight is not None}"
