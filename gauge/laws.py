r"""Closed-form laws of the RMSNorm scale gauge (the formulas the checks compare against).

Per row (one token's one head): :math:`z \in \mathbb{R}^n`, :math:`m = \tfrac1n\lVert z\rVert^2`,
:math:`\rho_\epsilon = \sqrt{m + \epsilon}`, :math:`y = \gamma \odot z/\rho_\epsilon` (Zhang & Sennrich 2019,
arXiv:1910.07467).

**Exact eps breaking.**  For :math:`c > 0`, :math:`\operatorname{RMSNorm}_\epsilon(cz) = r(c)\,
\operatorname{RMSNorm}_\epsilon(z)` with

.. math::  r(c) = \frac{c\sqrt{m+\epsilon}}{\sqrt{c^2 m + \epsilon}},\qquad
           r(c) - 1 = \frac{\epsilon\,(c^2 - 1)}{(c^2 m + \epsilon)\,(1 + r(c))}
           = \frac{\epsilon}{2m}\Big(1 - \frac{1}{c^2}\Big) + O\!\Big(\frac{\epsilon^2}{c^4 m^2}\Big)

(the middle form is free of cancellation), so each entry deviates by :math:`|r(c) - 1|\,|y_i|`: small :math:`c`
breaks the gauge like :math:`\epsilon/(2 c^2 m)`, large :math:`c` saturates at :math:`\approx \epsilon/(2m)`, and the
rows with the smallest :math:`m` break first.  Proved symbolically in ``proofs/gauge_identities.py``.

**Exact eps radial gradient.**  :math:`J(z)\,z = \frac{\epsilon}{\rho^3}\,z` (``lm.rms_norm_jacobian``) and
:math:`z = x W^\top` is linear in :math:`W`, so for any loss :math:`L(y)`, exactly,
:math:`\langle \nabla_W L, W\rangle = \frac{d}{dc}L(cW)|_{c=1} = \sum_r \frac{\epsilon}{\rho_r^2}\,\langle \partial
L/\partial y_r, y_r\rangle`: 0 at :math:`\epsilon = 0` (Euler's theorem for the degree-0 homogeneous
:math:`L(W)`), linear in :math:`\epsilon` to leading order.

**Degree -1 gradient.**  Differentiating :math:`L(cW) = L(W)` gives :math:`c\,\nabla L(cW) = \nabla L(W)`: the
gradient norm scales as :math:`1/\lVert W\rVert`, and :math:`\lVert\nabla L\rVert\,\lVert W\rVert` is scale-free.
"""

from __future__ import annotations

import math

import torch


def mean_square(z: torch.Tensor) -> torch.Tensor:
    """``(..., 1)`` row mean square of ``(..., n)``."""
    return z.pow(2).mean(dim=-1, keepdim=True)


def eps_ratio_minus_one(c: torch.Tensor, m: torch.Tensor, eps: float) -> torch.Tensor:
    r"""Exact :math:`r(c) - 1` (cancellation-free form); ``c`` and ``m`` broadcast together."""
    c2 = c * c
    r = c * torch.sqrt(m + eps) / torch.sqrt(c2 * m + eps)
    return eps * (c2 - 1.0) / ((c2 * m + eps) * (1.0 + r))


def eps_ratio_minus_one_leading(c: torch.Tensor, m: torch.Tensor, eps: float) -> torch.Tensor:
    r"""First-order :math:`\frac{\epsilon}{2m}(1 - c^{-2})`."""
    return eps / (2.0 * m) * (1.0 - 1.0 / (c * c))


def predicted_deviation(c: torch.Tensor, z: torch.Tensor, y: torch.Tensor, eps: float,
                        leading: bool = False) -> torch.Tensor:
    r"""``(C,)`` predicted :math:`\max |{\rm RMSNorm}_\epsilon(cz) - {\rm RMSNorm}_\epsilon(z)|` over all entries.

    ``z`` is ``(R, n)`` rows (the norm's input at :math:`c = 1`), ``y`` the output ``(R, n)``.
    """
    m = mean_square(z).reshape(1, -1)  # (1, R)
    amax = y.abs().amax(dim=-1).reshape(1, -1)  # (1, R): the largest entry of each output row
    f = eps_ratio_minus_one_leading if leading else eps_ratio_minus_one
    return (f(c.reshape(-1, 1), m, eps).abs() * amax).amax(dim=1)  # (C,)


def break_scales(z: torch.Tensor, y: torch.Tensor, eps: float, tol: float) -> tuple[float, float]:
    r"""The scales :math:`(c_{lo}, c_{hi})` outside which the eps deviation exceeds ``tol``.

    Per row, with :math:`\delta = \text{tol}/\max_i|y_i|`, solving :math:`|r(c) - 1| = \delta` exactly:

    .. math::  c_{lo}^2 = \frac{(1-\delta)^2\,\epsilon}{m\,\delta(2-\delta) + \epsilon},\qquad
               c_{hi}^2 = \frac{(1+\delta)^2\,\epsilon}{\epsilon - m\,\delta(2+\delta)}\ \
               (\text{only if the denominator is} > 0,\ \text{else } c_{hi} = \infty).

    (:math:`\delta(2\mp\delta)` rather than :math:`1-(1\mp\delta)^2`: no cancellation for small
    :math:`\delta`.)  :math:`|r(c)-1|` is monotone on each side of 1, so the whole tensor breaks at the
    largest row :math:`c_{lo}` and the smallest row :math:`c_{hi}`.  ``eps = 0`` gives ``(0, inf)``.
    """
    if eps == 0.0:
        return 0.0, math.inf
    m = mean_square(z).reshape(-1).double()  # (R,)
    delta = tol / y.abs().amax(dim=-1).reshape(-1).double()  # (R,)
    d_lo = delta.clamp(max=1.0)  # 0 < r(c) < 1 below c = 1: a row with delta >= 1 never breaks there (c_lo = 0)
    c_lo2 = (1.0 - d_lo) ** 2 * eps / (m * d_lo * (2.0 - d_lo) + eps)
    hi_den = eps - m * delta * (2.0 + delta)
    safe_den = torch.where(hi_den > 0, hi_den, torch.ones_like(hi_den))  # rows that never break above c = 1
    c_hi2 = torch.where(hi_den > 0, (1.0 + delta) ** 2 * eps / safe_den, torch.full_like(hi_den, math.inf))
    return float(c_lo2.max().sqrt()), float(c_hi2.min().sqrt())


def predicted_radial_eps(u: torch.Tensor, y: torch.Tensor, z: torch.Tensor, eps: float) -> torch.Tensor:
    r"""Exact :math:`\langle\nabla_W L, W\rangle = \epsilon\sum_r \langle u_r, y_r\rangle/(m_r + \epsilon)`.

    ``u = dL/dy``, ``y``, ``z``: ``(..., n)`` rows of the measured norm (all tokens, all heads).
    """
    rho2 = mean_square(z).squeeze(-1) + eps  # (...)
    return eps * ((u * y).sum(dim=-1) / rho2).sum()
