r"""Measurement helpers of the GRT's structural claims (:mod:`grt_model.claims`), shared with the tests.

Finite-difference tolerance (gradcheck): central differences with step
:math:`h = \varepsilon^{1/3}` have truncation :math:`O(h^2)` plus round-off
:math:`O(\varepsilon/h)`, both :math:`O(\varepsilon^{2/3})`; :func:`fd_tolerance` is
:func:`rmsgauge.tolerance` with the safety factor scaled by :math:`\varepsilon^{-1/3}`
so its rtol is :math:`16\,\varepsilon^{2/3}\sqrt{\text{size}\cdot\text{depth}}`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from grt_model.attention import explicit_attention
from grt_model.cascade import UNIT_RAW_SCALE, RotationCascade, materialize
from grt_model.config import GRTConfig
from grt_model.model import GRTBlock
from rmsgauge import eps_of, tolerance
from rmsgauge.tolerance import DEFAULT_SAFETY, Tolerance


def num(v) -> float:
    """A plain float from a tensor (detached) or a number."""
    return float(v.detach()) if isinstance(v, torch.Tensor) else float(v)


def fd_tolerance(dtype, *, size: int = 1, depth: int = 1) -> Tolerance:
    """Tolerance for central finite differences with step eps^(1/3) (see the module docstring)."""
    return tolerance(dtype, size=size, depth=depth, safety=DEFAULT_SAFETY * eps_of(dtype) ** (-1.0 / 3.0))


def gradcheck(fn: Callable, inputs: tuple[torch.Tensor, ...], *, size: int, depth: int) -> bool:
    """``torch.autograd.gradcheck`` with the FD step and tolerance derived above (float64 inputs)."""
    dt = inputs[0].dtype
    tol = fd_tolerance(dt, size=size, depth=depth)
    # raise_exception=False: a wrong backward is a FAILS verdict with numbers, never a GradcheckError traceback
    return bool(torch.autograd.gradcheck(fn, inputs, eps=eps_of(dt) ** (1.0 / 3.0), atol=tol.atol, rtol=tol.rtol,
                                         raise_exception=False))


def flat_jacobian(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``[n_out, n_in]`` Jacobian of ``fn`` at ``x`` (both flattened): ``torch.func.jacrev`` (vectorized reverse
    mode; under a ``torch.func`` transform the cascade runs its eager, transform-aware backend, and attention
    its explicit softmax, see :func:`grt_model.attention.explicit_attention`)."""
    x = x.detach()
    with explicit_attention():
        J = torch.func.jacrev(lambda t: fn(t.view_as(x)).reshape(-1))(x.reshape(-1))
    return J.detach()  # (n_out, n_in)


def numerical_rank(M: torch.Tensor, tol: Tolerance) -> int:
    """Singular values above ``tol.rtol * sigma_max`` (0 for an exactly zero matrix)."""
    s = torch.linalg.svdvals(M)
    if s.numel() == 0 or s[0] == 0:
        return 0
    return int((s > tol.rtol * s[0]).sum())


def cross_head_blocks(J: torch.Tensor, heads: int) -> torch.Tensor:
    """``[d, d] -> [H_out, H_in, dh, dh]``: the Jacobian's head-to-head blocks (one token)."""
    dh = J.shape[0] // heads
    return J.view(heads, dh, heads, dh).permute(0, 2, 1, 3)


def unit_scale_cascade(width: int, n_stages: int, coupling: bool, heads: int = 1, *, coupling_std: float = 0.02,
                       dtype=torch.float64) -> RotationCascade:
    """A cascade with exact unit scales (built in ``dtype``), random angles, coupling ~ N(0, coupling_std^2)."""
    c = RotationCascade(width, n_stages, coupling=coupling, heads=heads, coupling_init_std=coupling_std, dtype=dtype)
    with torch.no_grad():
        c.raw_scales.fill_(UNIT_RAW_SCALE)
    return c


def mixer_witness_block(cfg: GRTConfig, *, coupling: bool, dtype=torch.float64) -> GRTBlock:
    """A real GRT block whose mixer rotates every pair by pi (unit scales, gain 1): the det(I+J_f) < 0 witness."""
    blk = GRTBlock(GRTConfig(**{**cfg.to_dict(), "mixer_coupling": coupling}), dtype=dtype)
    with torch.no_grad():
        blk.mixer.cascade.angles.fill_(math.pi)
        blk.mixer.cascade.raw_scales.fill_(UNIT_RAW_SCALE)
    return blk


def residual_det(blk: GRTBlock, name: str, x: torch.Tensor) -> tuple[float, float, float]:
    """``(sign, log|det|, ||J_f||_2)`` of ``I + J_f`` for sublayer ``name`` of ``blk`` at one token ``x [D]``."""
    J = flat_jacobian(lambda t: blk.sublayer(name, t.view(1, 1, -1)), x)
    sign, logabs = torch.linalg.slogdet(torch.eye(J.shape[0], dtype=J.dtype) + J)
    return num(sign), num(logabs), num(torch.linalg.matrix_norm(J, 2))


def mixing_profile(width: int, n_stages: int, dtype=torch.float64) -> list[int]:
    """For k = 1..n_stages: min over outputs of how many inputs a coupling-off k-stage cascade output depends on.

    Angles are kept away from multiples of pi/2 so no product of cosines/sines vanishes
    by accident; an entry counts as nonzero above the round-off tolerance.
    """
    c = RotationCascade(width, n_stages, coupling=False, dtype=dtype)
    with torch.no_grad():
        q = torch.randint(0, 4, c.angles.shape).to(dtype) * (math.pi / 2)
        c.angles.copy_(q + math.pi / 4 + (torch.rand_like(c.angles) - 0.5))
    tol = tolerance(dtype, size=width, depth=n_stages)
    out = []
    for k in range(1, n_stages + 1):
        sub = RotationCascade(width, k, coupling=False, dtype=dtype)
        with torch.no_grad():
            sub.angles.copy_(c.angles[:, :k])
            sub.raw_scales.copy_(c.raw_scales[:, :k])
        M = materialize(sub)[0]  # (d, d)
        out.append(int((M.abs() > tol.atol).sum(dim=1).min()))
    return out


def tiny_config(**overrides) -> GRTConfig:
    """A tiny byte-level config (d = 32, 4 heads of 8, 2 blocks, d_ff = 64) for fast checks."""
    base = {"vocab_size": 256, "block_size": 32, "d_model": 32, "n_heads": 4, "n_blocks": 2, "d_ff": 64}
    return GRTConfig(**{**base, **overrides})
