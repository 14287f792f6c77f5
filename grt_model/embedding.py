r"""The phase embedding: per token one phase per pair and one shared magnitude.

Token :math:`v` stores :math:`\theta_v \in \mathbb R^{P}` (``phases [V, P]``) and
:math:`r_v \in \mathbb R` (``magnitudes [V]``); the Cartesian activation is rebuilt
on every forward pass and never stored:

.. math::  x_{v,2p} = r_v\cos\theta_{v,p}, \qquad x_{v,2p+1} = r_v\sin\theta_{v,p},
           \qquad p = 0,\dots,P-1.

Pair :math:`p` is coordinates :math:`2p, 2p+1`, the stage-0 butterfly pairing, so the embedding seeds stage 0's
pairs directly.  Source: ``001_cfb910613b442095.txt``, "The embedding stores a token the same way -- as phases ...
one angle θ per pair plus a single magnitude r shared across the whole token"; :math:`V(P+1)` parameters against
:math:`Vd` for a dense table.

Initialization (the text gives none): phases uniform on :math:`(-\pi, \pi]` (distinct tokens start nearly
orthogonal), magnitudes ``radius_init`` (0.79, the text's trained block-0 ring).  The magnitude is stored raw, not
softplus-positive: :math:`(-r, \theta)` and :math:`(r, \theta + \pi)` rebuild the same vector, so a sign change
is harmless and a constraint would only add a kink.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def to_polar(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., 2P] -> (r [..., P], phi [..., P])`` in the adjacent (stage-0) pairing; phi in (-pi, pi]."""
    v = x.unflatten(-1, (x.shape[-1] // 2, 2))  # (..., P, 2)
    return torch.linalg.vector_norm(v, dim=-1), torch.atan2(v[..., 1], v[..., 0])


def from_polar(r: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    """``r`` broadcastable to ``phi [..., P]`` -> ``[..., 2P]`` with x_{2p} = r cos phi, x_{2p+1} = r sin phi."""
    return torch.stack((r * torch.cos(phi), r * torch.sin(phi)), dim=-1).flatten(-2)  # (..., 2P)


class PhaseEmbedding(nn.Module):
    """``phases [V, P]`` + ``magnitudes [V]``; forward ``idx [...] -> [..., 2P]`` rebuilt Cartesian pairs."""

    def __init__(self, vocab_size: int, pairs: int, radius_init: float = 0.79, *,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        if vocab_size < 1 or pairs < 1:
            raise ValueError(f"PhaseEmbedding needs vocab_size >= 1 and pairs >= 1, got {vocab_size}, {pairs}")
        if not (math.isfinite(radius_init) and radius_init > 0):
            raise ValueError(f"PhaseEmbedding radius_init must be in (0, inf), got {radius_init}")
        self.vocab_size, self.pairs, self.radius_init = vocab_size, pairs, float(radius_init)
        kw = {"dtype": dtype, "device": device}
        self.phases = nn.Parameter(torch.empty(vocab_size, pairs, **kw))  # (V, P) theta per pair
        self.magnitudes = nn.Parameter(torch.empty(vocab_size, **kw))  # (V,) one r per token
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.phases.uniform_(-math.pi, math.pi)
            self.magnitudes.fill_(self.radius_init)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return from_polar(self.magnitudes[idx].unsqueeze(-1), self.phases[idx])  # (..., 2P)

    def cartesian_table(self) -> torch.Tensor:
        """``[V, 2P]``: every token's rebuilt vector (the tied output head's weight); recomputed, not cached."""
        return from_polar(self.magnitudes.unsqueeze(-1), self.phases)

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, pairs={self.pairs}, radius_init={self.radius_init:g}"
