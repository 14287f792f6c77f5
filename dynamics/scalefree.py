r"""Scale-free updates under decoupled decay: AdamW, Lion and Muon on a scale gauge, with one exact balance.

Their step :math:`W_{t+1} = qW_t - \eta u_t` (:math:`q = 1 - \eta\lambda`) has a direction that does not grow as
:math:`\lVert W\rVert` shrinks (Adam divides by the gradient's RMS, Lion takes its sign, Muon orthogonalizes it).  In
the random-walk model (Kosson et al., *Rotational Equilibrium*, arXiv:2305.17212, §3), with a stationary update of
:math:`\mathbb E\lVert u\rVert^2 = \nu` and autocorrelation :math:`r_k`, unrolling
:math:`W_t = -\eta\sum_{j\ge0} q^j u_{t-1-j}` gives

.. math::  x^* = \frac{\eta^2\nu\,(1 + 2qA)}{1-q^2},\qquad A = \sum_{k\ge1} q^{k-1} r_k,\qquad
           \cos\varphi^* = q + \frac{A(1-q^2)}{1+2qA},

with :math:`\mathbb E\langle u_t, W_t\rangle = -\eta\nu A`.  The update ignores the norm, so the map has no
restoring force of its own: the transient decays as :math:`q^{2t}`, :math:`-1/(2\ln q)` steps per e-fold.

* **AdamW**: :math:`\nu = C(1-\beta_1)/(1+\beta_1)` (:math:`C` entries), :math:`r_k = \beta_1^k`,
  :math:`A = \beta_1/(1-q\beta_1)` as :math:`\beta_2 \to 1`; finite :math:`\beta_2` and the transient:
  :mod:`dynamics.adamw_window`.
* **Lion** (Chen et al., arXiv:2302.06675): every entry of :math:`\operatorname{sign}(c_t)` is :math:`\pm1`, so
  :math:`\nu = C`.  Each entry of :math:`c` is Gaussian with lag-:math:`k` correlation
  :math:`\rho_k = \rho_1\beta_2^{k-1}`, :math:`\rho_1 = \beta_1(1-\beta_2)\big((1-\beta_1) +
  \beta_1\beta_2/(1+\beta_2)\big)/\sigma^2`, :math:`\sigma^2 = (1-\beta_1)^2 + \beta_1^2(1-\beta_2)/(1+\beta_2)`, and
  signs correlate as :math:`r_k = \tfrac2\pi\arcsin\rho_k` (Sheppard): :math:`A` is the series
  :func:`lion_correlation_sum`.  REQ's (epfml/REQ ``lion_etar_func``) :math:`\sqrt{\pi/2}\,\sqrt{2\eta\lambda}\,\sigma`
  is this law with the sign linearized, about 1% apart at the default betas (:func:`lion_req_angle`).
* **Muon** (Jordan et al. 2024; ``torch.optim.Muon``): :math:`u = \operatorname{NS}(M)` applied with
  :math:`\eta_{adj} = \eta\sqrt{\max(1, m/k)}` while the decay uses :math:`\eta`.  Exact orthogonalization has
  :math:`\lVert u\rVert_F^2 = \min(m,k)` (:func:`muon_nominal_nu`), torch's bf16 quintic steps only roughly, so
  :math:`\nu` is measured.  Without momentum :math:`O(-g) = -O(g)` gives :math:`A = 0`; with it :math:`A` is measured
  from :math:`\langle u_t, W_t\rangle = -\eta\nu A` (:func:`measured_correlation_sum`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from rmsgauge import check_range


def fixed_point(lr: float, d: float, nu, A=0.0):
    r""":math:`x^* = \eta^2\nu(1+2qA)/(1-q^2)` (arrays broadcast); ``lr`` is the step's effective lr."""
    q = 1.0 - d
    return lr * lr * np.asarray(nu, dtype=np.float64) * (1.0 + 2.0 * q * np.asarray(A)) / (1.0 - q * q)


def equilibrium_cos(d: float, A=0.0):
    r""":math:`\cos\varphi^* = q + A(1-q^2)/(1+2qA)`."""
    q = 1.0 - d
    A = np.asarray(A, dtype=np.float64)
    return q + A * (1.0 - q * q) / (1.0 + 2.0 * q * A)


def e_fold(factor: float) -> float:
    """Steps per e-fold of a mode that shrinks by ``factor`` (>= 0) per step, :math:`-1/\\ln f` (inf for 1, 0 for 0)."""
    return math.inf if factor >= 1.0 else 0.0 if factor == 0.0 else -1.0 / math.log(factor)


def relaxation_steps(d: float) -> float:
    """Steps per e-fold of the squared-norm transient, :math:`-1/(2\\ln q)` (inf without decay)."""
    check_range("d", d, 0.0, 1.0, hi_open=True)
    return math.inf if d == 0.0 else -1.0 / (2.0 * math.log1p(-d))


def steps_to_equilibrium(x0: float, x_star: float, d: float, band: float) -> float:
    r"""Steps until :math:`|x_t/x^*-1| \le` ``band`` from :math:`x_t - x^* = q^{2t}(x_0 - x^*)` (monotone: the first
    entry is for good); 0 when already inside, inf without decay."""
    check_range("band", band, 0.0, 1.0, lo_open=True, hi_open=True)
    gap = abs(x0 - x_star)
    if gap <= band * x_star:
        return 0.0
    if d <= 0.0 or not math.isfinite(x_star):
        return math.inf
    return float(math.ceil(math.log(band * x_star / gap) / (2.0 * math.log1p(-d))))


def lion_sign_correlations(beta1: float, beta2: float, k: np.ndarray) -> np.ndarray:
    r"""Lag-:math:`k` correlation of Lion's update entries, :math:`\tfrac2\pi\arcsin\rho_k` (``k >= 1``, vectorized)."""
    sigma2 = (1.0 - beta1) ** 2 + beta1 * beta1 * (1.0 - beta2) / (1.0 + beta2)
    rho1 = beta1 * (1.0 - beta2) * ((1.0 - beta1) + beta1 * beta2 / (1.0 + beta2)) / sigma2
    rho = rho1 * np.power(beta2, np.asarray(k, dtype=np.float64) - 1.0)
    return 2.0 / math.pi * np.arcsin(rho)


def lion_correlation_sum(d: float, beta1: float, beta2: float) -> float:
    r""":math:`A = \sum_{k\ge1} q^{k-1}\tfrac2\pi\arcsin(\rho_1\beta_2^{k-1})`, summed until the geometric bound of
    the remainder, :math:`\rho_1(q\beta_2)^K/(1-q\beta_2)`, is below float64 round-off of the sum."""
    check_range("betas[0]", beta1, 0.0, 1.0, hi_open=True)
    check_range("betas[1]", beta2, 0.0, 1.0, hi_open=True)
    r = (1.0 - d) * beta2
    eps = float(np.finfo(np.float64).eps)
    K = 1 if r == 0.0 else max(1, math.ceil(math.log(eps * (1.0 - r)) / math.log(r)) + 1)
    k = np.arange(1, K + 1, dtype=np.float64)
    return float(np.sum((1.0 - d) ** (k - 1.0) * lion_sign_correlations(beta1, beta2, k)))


def lion_req_angle(lr: float, wd: float, beta1: float, beta2: float) -> float:
    r"""REQ's Lion rotation (epfml/REQ ``lion_etar_func``):
    :math:`\sqrt{\pi/2}\sqrt{2\eta\lambda}\sqrt{(1-\beta_1)^2 + \beta_1^2(1-\beta_2)/(1+\beta_2)}`."""
    sigma2 = (1.0 - beta1) ** 2 + beta1 * beta1 * (1.0 - beta2) / (1.0 + beta2)
    return math.sqrt(math.pi / 2.0) * math.sqrt(2.0 * lr * wd) * math.sqrt(sigma2)


def muon_lr_ratio(shape: tuple[int, ...], adjust_lr_fn: str | None) -> float:
    """torch.optim.Muon's ``adjusted_lr / lr`` for a parameter of ``shape`` (``torch/optim/_muon.py::_adjust_lr``)."""
    A, B = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1.0, A / B))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(A, B))
    return 1.0


def muon_nominal_nu(shape: tuple[int, ...], rows: int | None = None) -> float:
    r""":math:`\lVert UV^\top\rVert_F^2` of exact orthogonalization: :math:`\min(m,k)`, or :math:`r\min(m,k)/m` for a
    block of ``rows`` rows (exact for :math:`m \le k`, where every row of :math:`UV^\top` has unit norm; the mean
    over rows otherwise)."""
    m, k = shape[:2]
    r = m if rows is None else rows
    return r * min(m, k) / m


def measured_correlation_sum(lr: float, nu: float, uw: float) -> float:
    r""":math:`A = -\mathbb E\langle u,W\rangle/(\eta\nu)` from measured means (the balance's one unknown)."""
    if nu <= 0.0 or lr <= 0.0:
        return 0.0
    return -uw / (lr * nu)


def _arcsin_series(rho_max: float) -> np.ndarray:
    r"""Coefficients :math:`c_j = \binom{2j}{j}/(4^j(2j+1))` of :math:`\arcsin x = \sum_j c_jx^{2j+1}`, enough of them
    that the first term dropped is below float64 round-off for :math:`|x| \le` ``rho_max``."""
    eps = float(np.finfo(np.float64).eps)
    J = max(2, math.ceil(math.log(eps) / (2.0 * math.log(max(rho_max, 0.5)))) + 1)
    j = np.arange(J, dtype=np.float64)
    logc = np.array([math.lgamma(2 * i + 1) - 2 * math.lgamma(i + 1) for i in range(J)]) - j * math.log(4.0)
    return np.exp(logc) / (2.0 * j + 1.0)


def lion_trajectory(x0: float, lr: float, wd: float, numel: int, betas: tuple[float, float],
                    steps: int) -> np.ndarray:
    r"""Mean-field :math:`x_0 .. x_T` of a fresh Lion (:math:`m_{-1} = 0`) on a gauge, random-walk model.

    :math:`x_{t+1} = q^2x_t + \eta^2C(1 + 2qA_t)`, :math:`A_t = \sum_{k=1}^{t}q^{k-1}\tfrac2\pi\arcsin\rho_k(t)`:
    the update correlations build up as the momentum fills, and the gradient's scale
    :math:`\sigma_s^2 \propto 1/x_s` changes while the norm moves (recent gradients outweigh older ones as the norm
    shrinks).  Per entry, with :math:`\Phi_s = \mathbb E[m_sc_s]` and :math:`S_s = \mathbb E[m_s^2]`:
    :math:`\operatorname{Var}c_t = \beta_1^2S_{t-1} + (1-\beta_1)^2\sigma_t^2`,
    :math:`\operatorname{Cov}(c_t, c_{t-k}) = \beta_1\beta_2^{k-1}\Phi_{t-k}`,
    :math:`\Phi_s = \beta_1\beta_2S_{s-1} + (1-\beta_1)(1-\beta_2)\sigma_s^2`,
    :math:`S_s = \beta_2^2S_{s-1} + (1-\beta_2)^2\sigma_s^2` (gradients after :math:`s` do not correlate with
    :math:`c_s`).  The arcsine's odd power series turns the sum over lags into one recursion per power:
    with :math:`h_s = \beta_1\Phi_s/\sqrt{\operatorname{Var}c_s}`,
    :math:`A_t = \tfrac2\pi\sum_j c_j\operatorname{Var}c_t^{-(2j+1)/2}\,R_j(t)`,
    :math:`R_j(t+1) = h_t^{2j+1} + q\beta_2^{2j+1}R_j(t)` (carried divided by :math:`\operatorname{Var}c_t^{(2j+1)/2}`):
    O(terms) per step, every lag kept.
    """
    b1, b2 = betas
    q = 1.0 - lr * wd
    sigma2 = (1.0 - b1) ** 2 + b1 * b1 * (1.0 - b2) / (1.0 + b2)
    rho1 = b1 * (1.0 - b2) * ((1.0 - b1) + b1 * b2 / (1.0 + b2)) / sigma2
    c = _arcsin_series(min(1.0 - 1e-3, max(rho1, 1.0 - (1.0 - rho1) / 2.0)))  # margin over the stationary rho_1
    powers = 2.0 * np.arange(len(c)) + 1.0  # 2j + 1
    r = q * b2**powers
    Rn = np.zeros(len(c))  # R_j(t) / Var c_t^((2j+1)/2): bounded by rho's powers, no under- or overflow
    x = np.empty(steps + 1)
    x[0], S, h_prev, var_prev = float(x0), 0.0, 0.0, 1.0
    for t in range(steps):  # sequential (x feeds sigma^2); each step one short vector over the series' powers
        s2 = x[0] / x[t]  # sigma_t^2 in units of sigma_0^2 (correlations are scale-free)
        var = b1 * b1 * S + (1.0 - b1) ** 2 * s2
        if t:
            Rn = (h_prev / math.sqrt(var)) ** powers + r * (var_prev / var) ** (powers / 2.0) * Rn
        A = float(2.0 / math.pi * np.sum(c * Rn))
        h_prev, var_prev = b1 * (b1 * b2 * S + (1.0 - b1) * (1.0 - b2) * s2) / math.sqrt(var), var
        S = b2 * b2 * S + (1.0 - b2) ** 2 * s2
        x[t + 1] = q * q * x[t] + lr * lr * numel * (1.0 + 2.0 * q * A)
    return x


def lion_steps_to_equilibrium(x0: float, lr: float, wd: float, numel: int, betas: tuple[float, float],
                              band: float) -> tuple[float, float]:
    """``(enter, settle)`` steps of a fresh Lion from :func:`lion_trajectory` (:func:`grow_until_settled`)."""
    d = lr * wd
    x_star = float(fixed_point(lr, d, numel, lion_correlation_sum(d, *betas)))
    tau = max(relaxation_steps(d), 1.0 / (1.0 - betas[1]))
    first = math.ceil(steps_to_equilibrium(x0, x_star, d, band) + 4.0 * tau)
    return grow_until_settled(lambda n: lion_trajectory(x0, lr, wd, numel, betas, n), x_star, tau, band, first,
                              cap=MAX_ITERATED_STEPS // 5)  # a short vector per step: iterated less far


def band_times(traj: np.ndarray, x_star: float, band: float) -> tuple[float, float]:
    """``(enter, settle)``: the first step with ``|x_t/x* - 1| <= band``, and the first from which it stays there
    (they differ when the norm rings around the fixed point: SGD with momentum, complex roots)."""
    inside = np.abs(np.asarray(traj) / x_star - 1.0) <= band
    out = np.nonzero(~inside)[0]
    enter = float(np.argmax(inside)) if inside.any() else math.inf
    return enter, (float(out[-1] + 1) if len(out) else 0.0)


MAX_ITERATED_STEPS = 50_000  # the mean-field maps are iterated this far at most (a fraction of a second each)


def grow_until_settled(trajectory: Callable[[int], np.ndarray], x_star: float, tau: float, band: float,
                       first: int, cap: int = MAX_ITERATED_STEPS) -> tuple[float, float]:
    r""":func:`band_times` of ``trajectory(n)``, with ``n`` from ``first`` doubled until the last ``4 tau`` steps
    (four e-folds of the slowest mode) stay within half the band: after that the deviation cannot leave it.

    Past ``cap`` steps (default :data:`MAX_ITERATED_STEPS`; very slow decay: ``tau`` of thousands of steps) the
    remaining approach is continued in closed form, :math:`|x_t - x^*| = e^{-(t-T)/\tau}|x_T - x^*|`: the
    optimizers' memories (momentum, :math:`\hat v`) have long filled by then, and what is left of their lag is of
    relative order memory / tau."""
    check_range("band", band, 0.0, 1.0, lo_open=True, hi_open=True)
    if not math.isfinite(tau) or not math.isfinite(x_star):
        return math.inf, math.inf
    tail = max(16, math.ceil(4.0 * tau))
    n = min(max(first, 2 * tail), cap)
    while True:
        traj = trajectory(n)
        if np.abs(traj[-tail:] / x_star - 1.0).max() <= band / 2.0:
            return band_times(traj, x_star, band)
        if n >= cap:
            gap = abs(float(traj[-1]) / x_star - 1.0)
            rest = 0.0 if gap <= band else math.ceil(tau * math.log(gap / band))
            enter, settle = band_times(traj, x_star, band)
            return (enter if math.isfinite(enter) else n + rest), (n + rest if rest else settle)
        n = min(2 * n, cap)
