r"""AdamW on a scale gauge with a finite second-moment window (:math:`\beta_2 < 1`): its update moments and fixed
point, its relaxation coupled to the lag of :math:`\hat v`, and the transient of a fresh optimizer.

The scale-free balance (:mod:`dynamics.scalefree`) gives :math:`x^* = \eta^2C\nu(1+2qA)/(1-q^2)`; in the
:math:`\beta_2 \to 1` limit AdamW's per-entry moments are :math:`\nu = (1-\beta_1)/(1+\beta_1)`,
:math:`A = \beta_1/(1-q\beta_1)`, and the finite window's scatter of :math:`\hat v` corrects both at first order in
:math:`1-\beta_2` (:func:`adamw_update_moments`; -1.1% in the norm at :math:`\beta_2 = 0.95`).  The decay is torch's
decoupled :math:`d = \eta\lambda`.  Checked by float64 simulation of ``torch.optim.AdamW`` on the random-walk gauge
in ``tests/test_dynamics_laws_adamw.py``.
"""

from __future__ import annotations

import math

import numpy as np

from dynamics.scalefree import e_fold, grow_until_settled
from dynamics.scalefree import equilibrium_cos as scale_free_cos
from dynamics.scalefree import relaxation_steps as scale_free_relaxation_steps
from dynamics.scalefree import steps_to_equilibrium as scale_free_steps
from rmsgauge import check_range


def _torch_decay(lr: float, wd: float, betas: tuple[float, float]) -> float:
    """AdamW's decoupled decay ``lr * wd`` per step; a one-line ``ValueError`` for any value outside its range."""
    check_range("lr", lr, 0.0, None)
    check_range("weight_decay", wd, 0.0, None)
    check_range("lr * weight_decay", lr * wd, 0.0, 1.0, hi_open=True)
    check_range("betas[0]", betas[0], 0.0, 1.0, hi_open=True)
    check_range("betas[1]", betas[1], 0.0, 1.0, hi_open=True)
    return float(lr) * float(wd)


def adamw_update_moments(d: float, beta1: float, beta2: float | None = None) -> tuple[float, float]:
    r"""Per-entry stationary moments of AdamW's update :math:`u = \hat m/\sqrt{\hat v}` on gradients uncorrelated
    across steps: ``(nu, A)``, :math:`\nu = \mathbb E\,u_t^2` (gradients in units of their own RMS) and the
    correlation sum :math:`A = \sum_{k\ge1} q^{k-1}\,\mathbb E[u_tu_{t+k}]/\nu` of the balance
    (:mod:`dynamics.scalefree`: :math:`x^* = \eta^2C\nu(1+2qA)/(1-q^2)`).

    ``beta2=None``: the :math:`\beta_2 \to 1` limit (:math:`\hat v = s`, the gradient's mean square, exactly):
    :math:`\nu_0 = (1-\beta_1)/(1+\beta_1)`, :math:`A_1 = \beta_1/(1-q\beta_1)`.

    A finite window scatters :math:`\hat v = s(1+\delta_t)` around :math:`s`: :math:`\mathbb E\delta^2 = 2D`,
    :math:`D = (1-\beta_2)/(1+\beta_2)` (a Gaussian :math:`g^2` has variance :math:`2s^2`),
    :math:`\mathbb E\delta_t\delta_{t+k} = 2D\beta_2^k`, and each gradient sits in the second moment that divides
    it: :math:`\mathbb E[(g_a^2/s-1)\delta_t] = 2(1-\beta_2)\beta_2^{t-a}`.  Expanding
    :math:`1/\sqrt{\hat v_t\hat v_{t+k}}` to second order in :math:`\delta` (first order in :math:`1-\beta_2`;
    the cross terms of distinct gradients vanish by symmetry), with :math:`\epsilon = 1-\beta_2`,
    :math:`A_2 = \beta_1\beta_2/(1-q\beta_1\beta_2)`:

    .. math:: \nu = (1-\beta_1)^2\Big[\frac{1+2D}{1-\beta_1^2} - \frac{2\epsilon}{1-\beta_1^2\beta_2}\Big],\qquad
              \nu A = (1-\beta_1)^2\Big[\frac{(1+\tfrac32D)A_1 + \tfrac12DA_2}{1-\beta_1^2}
              - \frac{\epsilon(A_1+A_2)}{1-\beta_1^2\beta_2}\Big].

    The scatter shrinks the update (the gradient's own share of :math:`\hat v` outweighs the Jensen gain of
    :math:`1/\hat v`): at :math:`\beta = (0.9, 0.95)` the equilibrium norm is 1.1% below the limit's and the angle
    0.5% below.  Neglected: :math:`O(\epsilon^2)`, of order :math:`\mathbb E\delta^4 = 3(2D)^2` (with
    :math:`\beta_1 = 0` +0.5% of the squared norm at 0.95, i.e. :math:`2\epsilon^2`).  It grows with the momentum
    window: over :math:`\beta_1 \le 0.99`, :math:`\beta_2 \in [0.5, 0.9999]` the remainder of :math:`\nu` stays
    below :math:`3(2D)^2(1 + 1/(6(1-\beta_1)))`: the expansion is for a momentum window well inside the second
    moment's.
    """
    q = 1.0 - check_range("d", d, 0.0, 1.0, hi_open=True)
    b1 = check_range("beta1", beta1, 0.0, 1.0, hi_open=True)
    a1 = b1 / (1.0 - q * b1)
    nu0 = (1.0 - b1) / (1.0 + b1)
    if beta2 is None:
        return nu0, a1
    b2 = check_range("beta2", beta2, 0.0, 1.0, hi_open=True)
    eps, D = 1.0 - b2, (1.0 - b2) / (1.0 + b2)
    a2 = b1 * b2 / (1.0 - q * b1 * b2)
    w1, w2 = (1.0 - b1) ** 2 / (1.0 - b1 * b1), (1.0 - b1) ** 2 / (1.0 - b1 * b1 * b2)
    nu = w1 * (1.0 + 2.0 * D) - 2.0 * eps * w2
    return nu, (w1 * ((1.0 + 1.5 * D) * a1 + 0.5 * D * a2) - eps * w2 * (a1 + a2)) / nu


def fixed_point_adamw(lr: float, d: float, beta1: float, nu, beta2: float | None = None):
    r"""Squared-norm fixed point for AdamW (decoupled decay :math:`d`), random-walk regime.

    With :math:`\nu = \mathbb E\lVert g/(\sqrt{\hat v}+\epsilon)\rVert^2` (:math:`\approx C` entries) and
    ``beta2=None`` (the infinite window):

    .. math:: x^* = \eta^2\nu\,\frac{(1-\beta_1)(1+\beta_1 q)}{(1+\beta_1)(1-\beta_1 q)(1-q^2)}

    With ``beta2`` the finite window's scatter of :math:`\hat v` enters (:func:`adamw_update_moments`):
    :math:`x^* = \eta^2\nu\,\nu_u(1+2qA)/(1-q^2)` with the per-entry :math:`(\nu_u, A)` of that function.
    Independent of the gradient scale: Adam's update does not shrink as :math:`\lVert W\rVert` grows.
    Small :math:`d = \eta\lambda`: :math:`x^* \to \eta\nu/(2\lambda)`, Kosson et al.'s :math:`\sqrt{\eta C/(2\lambda)}`.
    """
    q = 1.0 - d
    if beta2 is not None:
        nu_u, A = adamw_update_moments(d, beta1, beta2)
        return lr * lr * np.asarray(nu) * nu_u * (1.0 + 2.0 * q * A) / (1.0 - q * q)
    b = beta1
    return lr * lr * np.asarray(nu) * (1.0 - b) * (1.0 + b * q) / ((1.0 + b) * (1.0 - b * q) * (1.0 - q * q))


def adamw_equilibrium_cos(d: float, beta1: float, beta2: float | None = None) -> float:
    r""":math:`\cos\varphi^* = q + A(1-q^2)/(1+2qA)` with AdamW's :math:`A` (:func:`adamw_update_moments`);
    ``beta2=None``: :math:`(q+\beta_1)/(1+\beta_1q)`."""
    return float(scale_free_cos(d, adamw_update_moments(d, beta1, beta2)[1]))


def adamw_relaxation_modes(d: float, beta2: float) -> tuple[float, float]:
    r"""``(fast, slow)``: steps per e-fold of the two modes of AdamW's norm coupled to the lag of :math:`\hat v`.

    The update is scale-free only once :math:`\hat v` has caught up with the gradient's scale
    :math:`s \propto 1/x`: with :math:`\xi = \delta x/x` and :math:`\zeta = \delta\hat v/\hat v`, the map
    linearized at :math:`x^*` (momentum quasi-static; the step's gradient enters :math:`\hat v` before it is divided)
    is :math:`\zeta' = \beta_2\zeta - (1-\beta_2)\xi`, :math:`\xi' = q^2\xi - (1-q^2)(\xi + \zeta')`: a norm
    displaced at a settled :math:`\hat v` returns on the fast mode (faster than :math:`-1/(2\ln q)`), while a fresh
    optimizer far from :math:`x^*`, whose :math:`\hat v` starts at the first gradients' scale, approaches on the slow
    one, :math:`\approx 1/(2\eta\lambda) + 2/(1-\beta_2)`: 2,050 steps at :math:`\eta\lambda = 0.005`,
    :math:`\beta_2 = 0.999`, where :func:`dynamics.laws.relaxation_steps` gives the decay's own 100 (the trajectory of
    :func:`adamw_transient` from 4 or 0.09 times :math:`x^*` decays at that rate to 0.5%)."""
    q = 1.0 - check_range("d", d, 0.0, 1.0, hi_open=True)
    b2 = check_range("beta2", beta2, 0.0, 1.0, hi_open=True)
    c = 1.0 - q * q
    j11, j12, j21 = q * q - c * b2, -c * b2, -(1.0 - b2)  # (xi, zeta) -> (xi', zeta'), j22 = beta2
    half_trace, root = 0.5 * (j11 + b2), math.sqrt(0.25 * (j11 - b2) ** 2 + j12 * j21)
    lam = sorted((abs(half_trace - root), abs(half_trace + root)))
    return e_fold(lam[0]), e_fold(lam[1])


def adamw_transient(x0: float, lr: float, wd: float, numel: int, betas: tuple[float, float],
                    steps: int) -> tuple[np.ndarray, np.ndarray]:
    r"""Mean-field :math:`x_0 .. x_T` of a fresh AdamW on a gauge of ``numel`` entries (random-walk model), and the
    size of the terms it neglects, ``(x, neglected)`` (both ``(T+1,)``; ``neglected`` absolute, in units of x).

    Per entry the gradient :math:`g_a` has mean square :math:`s_a \propto 1/x_{a-1}` (the gauge's
    :math:`g \propto 1/\lVert W\rVert`), :math:`u_t = m_t/(c_t\sqrt{\hat v_t})`, :math:`c_t = 1-\beta_1^t`,
    :math:`m_t = \sum_{a\le t}(1-\beta_1)\beta_1^{t-a}g_a`, and

    .. math:: x_{t+1} = q^2x_t + \eta^2C\,\mathbb E u_t^2 + 2\eta^2qC\sum_{j<t}q^{t-1-j}\,\mathbb E[u_ju_t],

    exact for gradients uncorrelated across steps (:math:`\langle W_t, g_t\rangle = 0`).  Each pair shares only its
    common gradients: :math:`\mathbb E[u_ju_t] = (1-\beta_1)^2\sum_{a\le j}\beta_1^{j-a}\beta_1^{t-a}
    \,\mathbb E[g_a^2/\sqrt{\hat v_j\hat v_t}]/(c_jc_t)`, each gradient divided by the second moment *of the step
    that uses it* (the moment of the gradient's own step is older, too large while the norm grows).  With
    :math:`\hat v_t = V_t(1+\delta_t)`,
    :math:`V_t` the bias-corrected EMA of :math:`s`, the expectation is expanded to second order in the scatter
    :math:`\delta` as in :func:`adamw_update_moments`, now with :math:`s` moving: :math:`\mathbb E\delta_t^2 = 2D_t`,
    :math:`D_t = Q_t/V_t^2`, :math:`Q_t = \beta_2^2Q_{t-1} + (1-\beta_2)^2s_t^2` (raw EMAs),
    :math:`\mathbb E\delta_j\delta_t = 2\beta_2^{t-j}Q_j/(V_jV_t)`,
    :math:`\mathbb E[(g_a^2/s_a - 1)\delta_t] = 2(1-\beta_2)\beta_2^{t-a}s_a/V_t`.  Every sum over :math:`a` and
    :math:`j` is geometric, so the map carries eight running sums: O(1) per step.  Its fixed point is
    :func:`adamw_update_moments`' (``beta2 = betas[1]``).

    ``neglected``: the expansion's next order, :math:`\mathbb E\delta^4 = 3(2D_t)^2` of each step's increment,
    decayed by :math:`q^2` per step like the increment itself: the law's own allowance (large for the first steps,
    where :math:`\hat v` holds few gradients, and :math:`O((1-\beta_2)^2)` of :math:`x` at equilibrium).
    :math:`\epsilon \ll \sqrt{\hat v}` assumed.
    """
    check_range("x0", x0, 0.0, None, lo_open=True)
    check_range("steps", steps, 0, None)
    check_range("numel", numel, 1, None)
    d = _torch_decay(lr, wd, betas)
    b1, b2 = float(betas[0]), float(betas[1])
    q, e2, k1 = 1.0 - d, 1.0 - b2, (1.0 - b1) ** 2
    eta2C = lr * lr * numel
    X, err = float(x0), 0.0
    x, neglected = np.empty(steps + 1), np.empty(steps + 1)
    x[0], neglected[0] = X, 0.0
    V = Q = M = N = 0.0  # EMAs of s and s^2 (raw), the b1^2-weighted sums of s and (b2-weighted) s^2
    H1 = H2 = H3 = H4 = 0.0  # the q-weighted sums over earlier steps j of the pair terms (H3, H4 with b2^(t-j))
    p1 = p2 = 1.0  # beta1^t, beta2^t
    for t in range(1, steps + 1):  # nonlinear (s_t = 1/x_t feeds every sum): sequential, a few dozen flops a step
        s = 1.0 / X
        p1, p2 = p1 * b1, p2 * b2
        V, Q = b2 * V + e2 * s, b2 * b2 * Q + e2 * e2 * s * s
        M, N = b1 * b1 * M + s, b1 * b1 * b2 * N + s * s
        R = math.sqrt((1.0 - p2) / V) / (1.0 - p1)  # 1/(c_t sqrt(v-hat_t))
        D, e = Q / (V * V), e2 / V
        uu = k1 * R * R * (M * (1.0 + 2.0 * D) - 2.0 * e * N)
        pair = k1 * R / q * (H1 + 0.75 * D * H2 + 0.5 * H3 / V - e * H4)
        inc = eta2C * (uu + 2.0 * q * pair)
        X = q * q * X + inc
        err = q * q * err + eta2C * (abs(uu) + 2.0 * q * abs(pair)) * 12.0 * D * D
        x[t], neglected[t] = X, err
        H1 = q * b1 * (H1 + R * (M * (1.0 + 0.75 * D) - e * N))
        H2 = q * b1 * (H2 + R * M)
        H3 = q * b1 * b2 * (H3 + R * M * Q / V)
        H4 = q * b1 * b2 * (H4 + R * N)
    return x, neglected


def adamw_steps_to_equilibrium(x0: float, lr: float, wd: float, numel: int, betas: tuple[float, float],
                               band: float) -> tuple[float, float]:
    """``(enter, settle)`` steps of a fresh AdamW along :func:`adamw_transient`, relative to the equilibrium of
    :func:`fixed_point_adamw` at ``betas`` (:func:`dynamics.scalefree.grow_until_settled`, settled once four
    e-folds of the slow mode of :func:`adamw_relaxation_modes` stay inside half the band)."""
    d = _torch_decay(lr, wd, betas)
    if d == 0.0:
        return math.inf, math.inf
    check_range("numel", numel, 1, None)
    x_star = float(np.sqrt(fixed_point_adamw(lr, d, betas[0], float(numel), float(betas[1])))) ** 2
    tau = max(scale_free_relaxation_steps(d), adamw_relaxation_modes(d, betas[1])[1])
    first = math.ceil(scale_free_steps(x0, x_star, d, band) + 4.0 * tau)
    return grow_until_settled(lambda n: adamw_transient(x0, lr, wd, numel, betas, n)[0], x_star, tau, band, first)
