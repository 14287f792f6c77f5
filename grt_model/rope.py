r"""Rotary position encoding on adjacent coordinate pairs (Su et al., RoFormer, arXiv:2104.09864).

Pair :math:`p` of a head (coordinates :math:`2p, 2p+1`, the stage-0 butterfly pairing)
at position :math:`t` is rotated by :math:`t\,\omega_p`, :math:`\omega_p = b^{-2p/d}`.
A rotation model encodes position as rotation; the dense baseline uses the same code.
"""

from __future__ import annotations

import torch


def rope_angles(T: int, head_dim: int, base: float = 10000.0, *, dtype=torch.float32, device=None,
                offset: int = 0) -> torch.Tensor:
    """``[T, head_dim/2]`` angles t * omega_p."""
    P = head_dim // 2
    omega = base ** (-torch.arange(P, dtype=torch.float64, device=device) * 2.0 / head_dim)  # (P,)
    t = torch.arange(offset, offset + T, dtype=torch.float64, device=device)  # (T,)
    return torch.outer(t, omega).to(dtype)  # (T, P)


def apply_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[..., T, head_dim]`` pairwise by ``angles`` ``[T, head_dim/2]``."""
    x0, x1 = x[..., 0::2], x[..., 1::2]  # (..., T, P)
    c, s = torch.cos(angles), torch.sin(angles)
    return torch.stack((c * x0 - s * x1, s * x0 + c * x1), dim=-1).flatten(-2)
