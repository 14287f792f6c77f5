r"""RMSNorm with an explicit epsilon, and its closed-form Jacobian (Zhang & Sennrich, NeurIPS 2019, arXiv:1910.07467).

.. math:: \mathrm{RMSNorm}(z) = \frac{z}{\rho}\odot\gamma, \quad \rho = \sqrt{\tfrac1n\lVert z\rVert^2 + \epsilon},
          \quad J(z) = \frac{1}{\rho}\Big(I - \frac{z z^\top}{n\rho^2}\Big)

(gain omitted in :math:`J`).  :math:`J(z)\,z = \frac{\epsilon}{\rho^3} z` is exactly 0 at :math:`\epsilon = 0`: the
norm is then homogeneous of degree 0, the source of the scale gauge, so ``eps`` defaults to 0 here
(``torch.nn.RMSNorm``'s default is ``torch.finfo(dtype).eps``; pass that to compare).
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
