r"""The butterfly wiring: the one place that says how coordinates pair at each stage.

A vector of even width :math:`d` holds :math:`P = d/2` pairs.  With
:math:`L = \log_2 d` (``d`` must be a power of two), stage :math:`s` uses the
stride

.. math::  h_s = 2^{\,s \bmod L}, \qquad s = 0, 1, 2, \dots

(1, 2, 4, ..., d/2, then back to 1: the strides *cycle*), and pairs coordinate
:math:`i` with :math:`i + h_s` for every :math:`i` whose bit :math:`h_s` is clear,
i.e. :math:`i` with :math:`i \oplus h_s` -- the radix-2 FFT butterfly
(Cooley & Tukey 1965; as a Givens network: Jing et al., *EUNN*, ICML 2017).

Pair order within a stage: view the vector as ``[d/(2h), 2, h]``; pair
:math:`p = j\,h + k` is ``(x[j, 0, k], x[j, 1, k])``, i.e. coordinates
:math:`(2hj + k,\; 2hj + h + k)`.  The first element of the pair is its
:math:`x_0`, the second its :math:`x_1`.  Stage 0 (stride 1) pairs adjacent
coordinates ``(0,1), (2,3), ...``, which is the layout of the phase embedding's
rebuilt Cartesian pairs.  The "next pair" of the Clifford signed-area feature is
:math:`p+1 \bmod P` in this order.

Because the pairing is a fixed view, the fast cascade never gathers: it reshapes
``[..., d] -> [..., d/(2h), 2, h]`` and works on the two halves.
"""

from __future__ import annotations

from functools import lru_cache

import torch


def check_width(width: int) -> int:
    if not isinstance(width, int) or width < 2 or width & (width - 1):
        raise ValueError(
            f"width must be a power of two >= 2 (the butterfly pairs i with i XOR 2^k), got {width!r}"
        )
    return width


def n_strides(width: int) -> int:
    """How many distinct strides the wiring cycles through: log2(width)."""
    return check_width(width).bit_length() - 1


def stage_stride(width: int, stage: int) -> int:
    """The stride h_s = 2^(s mod log2 d) of ``stage``."""
    if stage < 0:
        raise ValueError(f"stage must be >= 0, got {stage}")
    return 1 << (stage % n_strides(width))


@lru_cache(maxsize=256)
def _pairs(width: int, stage: int) -> tuple[tuple[int, int], ...]:
    h = stage_stride(width, stage)
    return tuple((2 * h * j + k, 2 * h * j + h + k) for j in range(width // (2 * h)) for k in range(h))


def butterfly_pairs(width: int, stage: int) -> list[tuple[int, int]]:
    """The coordinate pairs ``(i0, i1)`` of ``stage``, in pair order p = 0..P-1."""
    return list(_pairs(width, stage))


def pair_index(width: int, stage: int, device=None) -> torch.Tensor:
    """``[P, 2]`` long tensor of the stage's coordinate pairs (for reference code and tests)."""
    return torch.tensor(_pairs(width, stage), dtype=torch.long, device=device)


def to_pairs(x: torch.Tensor, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split ``[..., d]`` into the stage's ``(x0, x1)``, each ``[..., P]`` in pair order (views, then a reshape)."""
    lead, d = x.shape[:-1], x.shape[-1]
    v = x.reshape(*lead, d // (2 * stride), 2, stride)  # (..., d/2h, 2, h)
    return v[..., 0, :].reshape(*lead, d // 2), v[..., 1, :].reshape(*lead, d // 2)


def from_pairs(x0: torch.Tensor, x1: torch.Tensor, stride: int) -> torch.Tensor:
    """Inverse of :func:`to_pairs`: interleave ``(x0, x1)`` back into ``[..., d]``."""
    lead, P = x0.shape[:-1], x0.shape[-1]
    v = torch.stack((x0.reshape(*lead, P // stride, stride), x1.reshape(*lead, P // stride, stride)), dim=-2)
    return v.reshape(*lead, 2 * P)  # (..., d/2h, 2, h) -> (..., d)
