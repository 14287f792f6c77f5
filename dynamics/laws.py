r"""The exact laws of weight-norm dynamics for a scale gauge, next to the source's first-order forms.

Notation (one update step, every optimizer):

.. math::  W_{t+1} = q\,W_t - \eta\,u_t,\qquad q = 1 - d,

where :math:`\eta` is the learning rate, :math:`u_t` the optimizer's update direction
(:math:`u_t = g_t` for SGD, the momentum buffer for SGD+momentum, the bias-corrected
:math:`\hat m/(\sqrt{\hat v}+\epsilon)` for AdamW) and :math:`d` the decoupled decay per step:

===========  =====================================  ==========================================
convention   rule                                   :math:`d`
===========  =====================================  ==========================================
``source``   :math:`W \leftarrow W - \eta g - \lambda W` (the source text)      :math:`\lambda`
``torch``    decay :math:`\eta\lambda` per step (``torch.optim.AdamW``, SGD-W)   :math:`\eta\lambda`
``l2``       :math:`\lambda W` added to the gradient (``torch.optim.SGD``'s     :math:`0` (decay enters :math:`u`)
             ``weight_decay``; Wan et al.'s setting)
===========  =====================================  ==========================================

A scale gauge (a weight whose loss is invariant under :math:`W \to cW`, :math:`c>0`) has
:math:`\langle g, W\rangle = 0` (Euler) and :math:`g(cW) = g(W)/c`, so
:math:`\lVert g(W)\rVert = G(\hat W)/\lVert W\rVert` with :math:`G` the gradient norm at unit norm.

Laws derived here (symbolic checks in ``proofs/dynamics_identities.py``; measured in ``dynamics/checks.py``):

* Norm identity (exact):  :math:`\lVert W_{t+1}\rVert^2 = q^2\lVert W_t\rVert^2 - 2\eta q\langle u_t, W_t\rangle
  + \eta^2\lVert u_t\rVert^2`; for SGD the middle term is 0.  The source's :math:`(1-2d)` form drops
  :math:`d^2\lVert W_t\rVert^2`.
* First-order bias: with :math:`e_t = x_t - \hat x_t` (exact minus the iterated :math:`(1-2d)` prediction,
  :math:`x = \lVert W\rVert^2`), :math:`e_{t+1} = (1-2d)e_t + d^2 x_t` exactly; for constant :math:`x`,
  :math:`e_t/x = \tfrac d2\,(1-(1-2d)^t)`: :math:`\approx d^2 t` early, saturating at :math:`d/2`.
* SGD fixed point: :math:`x^{*2} = \eta^2 G^2/(1-q^2) = \eta^2G^2/(2d-d^2)`; the map
  :math:`x \mapsto q^2 x + \eta^2G^2/x` has slope :math:`2q^2-1` there (stable for :math:`0<d<1`),
  relaxation time :math:`-1/\ln|2q^2-1| \approx 1/(4d)` steps.  **With momentum that is wrong by about
  :math:`1/(1-\mu)`**: the relaxation is the spectral radius of the second-moment map
  (:mod:`dynamics.heavyball`), about :math:`(1-\mu)/(4\eta\lambda)` steps per e-fold with coupled L2, or
  :math:`-2/\ln\mu` once its roots turn complex (19 steps at :math:`\mu = 0.9`).
* Per-step angle (SGD, exact): :math:`\tan\varphi_t = \eta\lVert g_t\rVert/(q\lVert W_t\rVert)`; at a stationary
  norm :math:`\cos\varphi^* = q` exactly, independent of :math:`\eta` and :math:`G`.
* Momentum :math:`\mu` (SGD+momentum, or AdamW with :math:`\mu=\beta_1`), gradients uncorrelated across
  steps (the random-walk regime of Kosson et al.): the stationary second moments give exactly
  :math:`\mathbb E\langle W_t,W_{t+1}\rangle/\mathbb E\lVert W_t\rVert^2 = (q+\mu)/(1+\mu q)`, i.e.
  :math:`1-\cos\varphi^* = d(1-\mu)/(1+\mu(1-d))`.  Coupled L2: :math:`1-\cos\varphi^* = \eta\lambda/(1+\mu)`.
* Published first-order forms: Kosson, Messmer & Jaggi, *Rotational Equilibrium* (ICML 2024,
  arXiv:2305.17212) give for AdamW :math:`\sqrt{2\eta\lambda(1-\beta_1)/(1+\beta_1)}` and
  :math:`\lVert W^*\rVert = \sqrt{\eta C/(2\lambda)}`; Wan et al., *Spherical Motion Dynamics*
  (NeurIPS 2021, arXiv:2006.08419) give for SGD+momentum with L2 :math:`\sqrt{2\eta\lambda/(1+\mu)}`.
  Both are the small-:math:`d` limits of the laws above (:math:`\arccos(1-\epsilon) \approx \sqrt{2\epsilon}`).

The optimizers researchers use now (one law each, derived in the module named, checked by float64 simulation of
the random-walk gauge in ``tests/test_dynamics_laws*.py`` with :mod:`dynamics.noise_sim`; the monitor applies them):

* SGD, coupled L2 or decoupled: :math:`x^{*2} = \eta^2G^2/(1-q^2)`, :math:`\cos\varphi^* = q`, relaxation
  :math:`-1/\ln|2q^2-1|` (exact; this module).
* SGD with momentum, Nesterov, dampening: :math:`x^{*2} = G^2 v_0` with :math:`v = (I-M)^{-1}f` of the
  second-moment map, relaxation :math:`-1/\ln\rho(J)` (:mod:`dynamics.heavyball`; closed forms for heavy ball:
  :func:`fixed_point_sgd`, :func:`fixed_point_l2`, :func:`dynamics.heavyball.heavy_ball_factor_closed`).
* AdamW: :math:`x^* = \eta^2C\nu(1+2qA)/(1-q^2)`; for :math:`\beta_2 \to 1` :math:`\nu = (1-\beta_1)/(1+\beta_1)`,
  :math:`A = \beta_1/(1-q\beta_1)`, and the finite window's scatter of :math:`\hat v` corrects both at first order
  in :math:`1-\beta_2` (:func:`adamw_update_moments`, :func:`fixed_point_adamw`; -1.1% in the norm at
  :math:`\beta_2 = 0.95`); relaxation :math:`-1/(2\ln q)`, but coupled to the lag of :math:`\hat v` a fresh
  optimizer approaches on a slow mode :math:`\approx 1/(2\eta\lambda) + 2/(1-\beta_2)` (:func:`adamw_relaxation_modes`;
  the transient: :func:`adamw_transient`, each gradient divided by the second moment of the step that uses it).
* Lion: the same balance with :math:`\nu = C` and :math:`A` the arcsine series of the sign correlations
  (:func:`dynamics.scalefree.lion_correlation_sum`); relaxation :math:`-1/(2\ln q)`.
* Muon: the same balance with :math:`\nu = \lVert\mathrm{NS}(M)\rVert_F^2 \to \min(m,k)` and :math:`A = 0`
  without momentum (measured with it); relaxation :math:`-1/(2\ln q)`.
* Adam with L2: no closed law (:data:`ADAM_L2_WHY`).  Adafactor with relative steps: no equilibrium
  (:data:`ADAFACTOR_WHY`; the angle bound :func:`adafactor_angle_bound`).

(:mod:`dynamics.scalefree` derives the balance of the scale-free updates, Lion / Muon, and AdamW's with the
moments of :func:`adamw_update_moments`.)  Steps to
equilibrium from a fresh optimizer iterate each law's own mean-field map: momentum buffers, bias corrections and
Adam's :math:`\hat v` lag all fill during the approach.

All functions take and return floats or numpy arrays (broadcasting); nothing here touches torch.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.signal import lfilter

from dynamics.heavyball import HeavyBall
from dynamics.scalefree import grow_until_settled
from dynamics.scalefree import relaxation_steps as scale_free_relaxation_steps
from dynamics.scalefree import steps_to_equilibrium as scale_free_steps
from rmsgauge import check_choice, check_range

OPTIMIZERS = ("sgd", "sgdm", "adamw")
DECAYS = ("source", "torch", "l2")

ADAM_L2_WHY = ("Adam with L2 (weight_decay in torch.optim.Adam): no closed law. The decay lambda W enters the "
               "gradient before the division by sqrt(v-hat), so each entry decays by lr lambda/(sqrt(v_i)+eps): set "
               "by the gradient's own per-entry scale, neither uniform nor radial, and the rotation rate depends "
               "on the gradient norm (Loshchilov & Hutter, arXiv:1711.05101; epfml/REQ: 'Adam does not have a regular "
               "rotational rate'). Measured angles and norms only.")
ADAFACTOR_WHY = ("no equilibrium: the update scales with the weight (Adafactor's relative step: lr = rho_t "
                 "max(eps2, RMS(W)), rho_t = min(1e-2, 1/sqrt(t)); Shazeer & Stern, arXiv:1804.04235). The step "
                 "turns W by about arctan(rho_t RMS(u)) <= arctan(clip rho_t) whatever its norm, so no decay-gradient "
                 "balance sets a norm; without decay the norm grows by (1 + tan^2 phi_t) per step.")


def adafactor_relative_step(step: int, warmup_init: bool = False) -> float:
    r"""Adafactor's relative step :math:`\rho_t = \min(10^{-6}t \text{ or } 10^{-2}, 1/\sqrt t)` (transformers'
    ``Adafactor._get_lr`` with ``relative_step=True``), ``step`` counted from 1."""
    if not isinstance(step, int) or step < 1:
        raise ValueError(f"step must be an integer in [1, inf), got {step!r}")
    return min(1e-6 * step if warmup_init else 1e-2, 1.0 / math.sqrt(step))


def adafactor_angle_bound(rel_step: float, clip_threshold: float = 1.0) -> float:
    r"""Largest per-step angle of a tangent Adafactor step: :math:`\arctan(\text{clip}\cdot\rho_t)` (the update's
    RMS is clipped to ``clip_threshold``, then scaled by :math:`\rho_t\,\mathrm{RMS}(W)`, i.e. by
    :math:`\rho_t\lVert W\rVert/\sqrt C`): independent of the norm."""
    return math.atan(clip_threshold * rel_step)


# --------------------------------------------------------------------------- conventions
def decoupled_decay(lr: float, wd: float, decay: str) -> float:
    r"""The per-step multiplicative decay :math:`d` (``W <- (1-d) W - lr u``) of a convention.

    The laws hold for :math:`0 \le d < 1` (a step that keeps the weight's sign, :math:`q = 1-d > 0`), and the coupled
    L2 laws for :math:`0 \le \eta\lambda < 1`: outside, a one-line ``ValueError`` names the parameter and its
    range (torch accepts, e.g., lr * weight_decay >= 1; no law describes it)."""
    check_choice("decay", decay, DECAYS)
    check_range("lr", lr, 0.0, None)
    check_range("weight_decay", wd, 0.0, None)
    if decay == "source":
        return float(check_range("weight_decay", wd, 0.0, 1.0, hi_open=True))
    check_range("lr * weight_decay", lr * wd, 0.0, 1.0, hi_open=True)
    if decay == "torch":
        return float(lr) * float(wd)
    return 0.0  # l2: the decay enters the update direction u (torch.optim.SGD's weight_decay)


def momentum_of(optimizer: str, momentum: float, betas: tuple[float, float]) -> float:
    r"""The heavy-ball coefficient :math:`\mu` of the update direction (0 for plain SGD, beta1 for AdamW); the one it
    reads (and AdamW's beta2) must lie in [0, 1)."""
    check_choice("optimizer", optimizer, OPTIMIZERS)
    if optimizer == "sgd":
        return 0.0
    if optimizer == "sgdm":
        return float(check_range("momentum", momentum, 0.0, 1.0, hi_open=True))
    check_range("betas[0]", betas[0], 0.0, 1.0, hi_open=True)
    check_range("betas[1]", betas[1], 0.0, 1.0, hi_open=True)
    return float(betas[0])


# --------------------------------------------------------------------------- one step
def norm_step(x, u2, lr: float, d: float, radial=0.0):
    r"""Exact :math:`\lVert qW - \eta u\rVert^2 = q^2 x - 2\eta q\langle u,W\rangle + \eta^2\lVert u\rVert^2`."""
    q = 1.0 - d
    return q * q * x - 2.0 * lr * q * radial + lr * lr * u2


def norm_step_first_order(x, u2, lr: float, d: float):
    r"""The source's form :math:`(1-2d)x + \eta^2\lVert u\rVert^2` (drops :math:`d^2 x`)."""
    return (1.0 - 2.0 * d) * x + lr * lr * u2


def first_order_one_step_error(x, x_next, d: float):
    r"""Relative one-step error of the :math:`(1-2d)` form when the exact identity holds: :math:`d^2 x_t/x_{t+1}`."""
    return d * d * np.asarray(x) / np.asarray(x_next)


def iterate_prediction(x0, forcing, a: float) -> np.ndarray:
    r"""Iterate :math:`\hat x_{t+1} = a\,\hat x_t + f_t` from :math:`\hat x_0 = x_0`; returns :math:`\hat x_{0..T}`.

    ``forcing`` is ``(T, ...)``; the result is ``(T+1, ...)``. A linear recursion, so one
    ``scipy.signal.lfilter`` call along time (no Python loop).
    """
    f = np.asarray(forcing, dtype=np.float64)  # (T, R)
    x0 = np.asarray(x0, dtype=np.float64)  # (R,)
    # y[t] = f[t-1] + a y[t-1], y[0] = 0; then add the homogeneous part a^t x0.
    shifted = np.concatenate([np.zeros_like(f[:1]), f], axis=0)  # (T+1, R)
    y = lfilter([1.0], [1.0, -a], shifted, axis=0)
    powers = a ** np.arange(f.shape[0] + 1, dtype=np.float64).reshape((-1,) + (1,) * (f.ndim - 1))
    return y + powers * x0


def first_order_bias(x, d: float) -> np.ndarray:
    r"""Exact gap :math:`e_t = x_t - \hat x_t` between the true squared norm and the iterated :math:`(1-2d)` form.

    Both recursions share the forcing :math:`\eta^2\lVert g_t\rVert^2`, so
    :math:`e_{t+1} = (1-2d)\,e_t + d^2 x_t`, :math:`e_0 = 0`: a deterministic, systematic bias
    (not noise), driven by the measured trajectory ``x`` (``(T+1, R)``; returns the same shape).
    """
    x = np.asarray(x, dtype=np.float64)
    return iterate_prediction(np.zeros_like(x[0]), d * d * x[:-1], 1.0 - 2.0 * d)


def first_order_bias_constant_norm(t, d: float):
    r"""Relative bias for a constant norm: :math:`e_t/x = \tfrac d2\,(1-(1-2d)^t)`."""
    return 0.5 * d * (1.0 - (1.0 - 2.0 * d) ** np.asarray(t, dtype=np.float64))


# --------------------------------------------------------------------------- fixed points
def fixed_point_sgd(lr: float, d: float, G2, momentum: float = 0.0):
    r"""Squared-norm fixed point :math:`x^*` for gradient-driven updates (SGD, SGD+momentum, decoupled decay).

    .. math:: x^{*2} = \frac{\eta^2 G^2}{1-q^2}\cdot\frac{1+\mu q}{(1-\mu^2)(1-\mu q)}

    with :math:`G^2 = \mathbb E\,\lVert g\rVert^2\lVert W\rVert^2` the mean-square gradient norm at unit
    weight norm. For :math:`\mu = 0` it is exact for constant :math:`G`; for fluctuating :math:`G` (and for
    momentum, which needs gradients uncorrelated across steps) it holds to leading order in the relative
    fluctuation of :math:`x`.
    """
    q = 1.0 - d
    mu = momentum
    amp = (1.0 + mu * q) / ((1.0 - mu * mu) * (1.0 - mu * q))
    return np.sqrt(lr * lr * np.asarray(G2) * amp / (1.0 - q * q))


def fixed_point_first_order(lr: float, d: float, G2, momentum: float = 0.0):
    r"""The source's fixed point :math:`2d\,x^{*2} = \eta^2G^2` (with the momentum gain :math:`1/(1-\mu)^2`)."""
    return np.sqrt(lr * lr * np.asarray(G2) / (2.0 * d * (1.0 - momentum) ** 2))


def fixed_point_l2(lr: float, wd: float, G2, momentum: float = 0.0):
    r"""Fixed point with coupled L2 (``torch.optim.SGD(weight_decay=wd, momentum=mu)``), random-walk regime.

    .. math:: x^{*2} = \frac{\eta(1+\mu)G^2}{2\lambda(1-\mu)\,\big((1+\mu) - \eta\lambda/2\big)}

    whose small-:math:`\eta\lambda` limit :math:`\eta G^2/(2\lambda(1-\mu))` is Wan et al.'s / Kosson et al.'s.
    """
    mu = momentum
    return np.sqrt(lr * (1.0 + mu) * np.asarray(G2) / (2.0 * wd * (1.0 - mu) * ((1.0 + mu) - lr * wd / 2.0)))


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
    0.5% below.  Neglected: :math:`O(\epsilon^2)`, of order :math:`\mathbb E\delta^4 = 3(2D)^2`.  Measured range
    (float64 simulation of ``torch.optim.AdamW``, ``tests/test_dynamics_laws_adamw.py``; 1024 entries,
    :math:`\eta\lambda = 0.005`): the squared norm's residual is +0.15% at :math:`\beta_2 = 0.95` and 0.9 (the
    limit's: -2.1% and -1.2%), within 0.05% at 0.99 and 0.999; with :math:`\beta_1 = 0` (no momentum to average
    the scatter) +0.5% at 0.95, which is :math:`2\epsilon^2`.  The neglected order grows with the momentum
    window: measured over :math:`\beta_1 \le 0.99`, :math:`\beta_2 \in [0.5, 0.9999]`, the remainder of
    :math:`\nu` stays below :math:`3(2D)^2(1 + 1/(6(1-\beta_1)))`, about 38x :math:`3(2D)^2` at
    :math:`\beta_1 = 0.99`: the expansion is for a momentum window well inside the second moment's.
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

    With :math:`\nu = \mathbb E\lVert g/(\sqrt{\hat v}+\epsilon)\rVert^2` (:math:`\approx C`, the number of
    entries, once :math:`\hat v` tracks :math:`g^2`) and ``beta2=None`` (:math:`\hat v = \mathbb E g^2`, the infinite
    window):

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
    q = 1.0 - d
    A = adamw_update_moments(d, beta1, beta2)[1]
    return q + A * (1.0 - q * q) / (1.0 + 2.0 * q * A)


def relaxation_factor(d: float, optimizer: str = "sgd", momentum: float = 0.0) -> float:
    r"""Per-step contraction of :math:`x - x^*` near the fixed point (decoupled decay :math:`d`).

    SGD: :math:`f'(x^*) = q^2 - \eta^2G^2/x^{*2} = 2q^2 - 1`, because the gauge gradient grows as the norm shrinks
    (a restoring force of its own).  SGD+momentum (``momentum`` :math:`\mu > 0`): the spectral radius of the
    second-moment map's Jacobian (:class:`dynamics.heavyball.HeavyBall`; closed form
    :func:`dynamics.heavyball.heavy_ball_factor_closed`), *not* :math:`2q^2-1`: the momentum buffer carries the
    decay for :math:`1/(1-\mu)` steps.  AdamW (and every scale-free update, :mod:`dynamics.scalefree`): the update
    size does not depend on :math:`\lVert W\rVert`, so :math:`f'(x^*) = q^2` whatever its momentum.
    """
    q = 1.0 - d
    if optimizer == "adamw":
        return q * q
    if optimizer == "sgdm" and momentum > 0.0:
        return HeavyBall(lr=1.0, d=d, momentum=momentum).relaxation_factor()
    return 2.0 * q * q - 1.0


def relaxation_time(factor: float) -> float:
    """Steps for the deviation to shrink by e: :math:`-1/\\ln|f'(x^*)|` (inf when the factor is +-1)."""
    a = abs(factor)
    if a >= 1.0:
        return math.inf
    if a == 0.0:
        return 0.0
    return -1.0 / math.log(a)


# --------------------------------------------------------------------------- angles
def equilibrium_cos(d: float, momentum: float = 0.0) -> float:
    r""":math:`\cos\varphi^* = (q+\mu)/(1+\mu q)` (decoupled decay; :math:`\mu=0`: exactly :math:`q`)."""
    check_range("d", d, 0.0, 1.0, hi_open=True)
    check_range("momentum", momentum, 0.0, 1.0, hi_open=True)
    q = 1.0 - d
    return (q + momentum) / (1.0 + momentum * q)


def equilibrium_cos_l2(lr: float, wd: float, momentum: float = 0.0) -> float:
    r""":math:`\cos\varphi^* = 1 - \eta\lambda/(1+\mu)` for coupled L2 (``torch.optim.SGD``'s ``weight_decay``)."""
    decoupled_decay(lr, wd, "l2")
    check_range("momentum", momentum, 0.0, 1.0, hi_open=True)
    return 1.0 - lr * wd / (1.0 + momentum)


def equilibrium_angle(optimizer: str, decay: str, lr: float, wd: float, momentum: float = 0.9,
                      betas: tuple[float, float] = (0.9, 0.999)) -> float:
    """Our equilibrium per-step angle (radians) for any supported optimizer/convention (AdamW's with the scatter of
    its second moment at ``betas[1]``: :func:`adamw_equilibrium_cos`)."""
    mu = momentum_of(optimizer, momentum, betas)
    d = decoupled_decay(lr, wd, decay)
    if decay == "l2":
        return math.acos(equilibrium_cos_l2(lr, wd, mu))
    if optimizer == "adamw":
        return math.acos(adamw_equilibrium_cos(d, mu, float(betas[1])))
    return math.acos(equilibrium_cos(d, mu))


def published_angle(optimizer: str, decay: str, lr: float, wd: float, momentum: float = 0.9,
                    betas: tuple[float, float] = (0.9, 0.999)) -> tuple[float, str]:
    r"""The published first-order prediction and its source, translated to this convention.

    * AdamW: Kosson et al. :math:`\sqrt{2\eta\lambda(1-\beta_1)/(1+\beta_1)}` with :math:`\eta\lambda \to d`.
    * SGD+momentum, coupled L2: Wan et al. :math:`\sqrt{2\eta\lambda/(1+\mu)}`.
    * SGD / SGD+momentum, decoupled: the same random-walk argument gives
      :math:`\sqrt{2d(1-\mu)/(1+\mu)}` (Kosson et al.'s SGDM row in decoupled form; :math:`\mu=0`: :math:`\sqrt{2d}`).
    """
    mu = momentum_of(optimizer, momentum, betas)
    if decay == "l2":
        return math.sqrt(2.0 * lr * wd / (1.0 + mu)), "Wan et al. 2021: sqrt(2 lr wd/(1+mu))"
    d = decoupled_decay(lr, wd, decay)
    if optimizer == "adamw":
        src = "Kosson et al. 2024: sqrt(2 lr wd (1-b1)/(1+b1))"
    elif optimizer == "sgdm":
        src = "random-walk first order: sqrt(2 d (1-mu)/(1+mu))"
    else:
        src = "Wan et al. / Kosson et al., mu=0: sqrt(2 d)"
    return math.sqrt(2.0 * d * (1.0 - mu) / (1.0 + mu)), src


def step_angle_sgd(lr: float, gnorm, wnorm, d: float):
    r"""Exact SGD step angle :math:`\arctan(\eta\lVert g\rVert/(q\lVert W\rVert))` for :math:`g \perp W`."""
    return np.arctan(lr * np.asarray(gnorm) / ((1.0 - d) * np.asarray(wnorm)))


def calibrate_lr(angle: float, gnorm: float, wnorm: float, d: float) -> float:
    r"""The lr whose SGD step turns W by exactly ``angle``: :math:`q\tan\varphi\,\lVert W\rVert/\lVert g\rVert`."""
    return (1.0 - d) * math.tan(angle) * wnorm / gnorm


def scaled_angle(angle_at_1, c, exponent: float = 2.0):
    r"""Step angle at norm scale :math:`c` when :math:`\tan\varphi \propto c^{-\text{exponent}}`.

    SGD on a gauge: :math:`\lVert g(cW)\rVert/\lVert cW\rVert = c^{-2}\lVert g\rVert/\lVert W\rVert`, so
    exponent 2; Adam's first step has :math:`\lVert u\rVert` independent of :math:`c` (exponent 1).
    """
    return np.arctan(np.tan(angle_at_1) / np.asarray(c, dtype=np.float64) ** exponent)


def fitted_exponent(c, angles) -> float:
    """Least-squares slope of log(angle) against log(c)."""
    lc = np.log(np.asarray(c, dtype=np.float64))
    la = np.log(np.asarray(angles, dtype=np.float64))
    return float(np.polyfit(lc, la, 1)[0])


# --------------------------------------------------------------------------- monitor-facing laws
def adamw_equilibrium_norm(lr: float, wd: float, numel: int, beta1: float = 0.9, decay: str = "torch",
                           beta2: float | None = None) -> float:
    r"""Equilibrium norm :math:`\sqrt{x^*}` of an AdamW gauge group of ``numel`` entries (random-walk regime).

    :func:`fixed_point_adamw` with :math:`\nu = C` (= ``numel``: each entry of :math:`g/\sqrt{\hat v}` has unit
    mean square once :math:`\hat v` tracks :math:`g^2`), with the scatter of :math:`\hat v` at ``beta2``
    (:func:`adamw_update_moments`; ``None``: the infinite-window limit); small :math:`d`: Kosson et al.'s
    :math:`\sqrt{\eta C/(2\lambda)}` (arXiv:2305.17212, Table 1).  Infinite without decay.
    """
    d = decoupled_decay(lr, wd, decay)
    check_range("numel", numel, 1, None)
    if d <= 0.0:
        return math.inf
    return float(np.sqrt(fixed_point_adamw(lr, d, beta1, float(numel), beta2)))


def random_walk_angle(lr: float, norm: float, numel: int, beta1: float = 0.9, d: float = 0.0,
                      beta2: float | None = None) -> float:
    r"""AdamW's per-step angle at the *current* norm (valid in the transient):
    :math:`\arctan\big(\eta\sqrt{C\nu}\,/\,((1-d)\lVert W\rVert)\big)`, :math:`\nu = (1-\beta_1)/(1+\beta_1)`
    (``beta2=None``) or the per-entry update moment of :func:`adamw_update_moments` at ``beta2``.

    Random-walk update size :math:`\mathbb E\lVert\Delta W\rVert^2 = \eta^2 C(1-\beta_1)/(1+\beta_1)`
    (Kosson et al., arXiv:2305.17212, §4); orthogonal to :math:`W` (Euler), so the angle is the arctangent.
    At :func:`adamw_equilibrium_norm` it equals :func:`equilibrium_angle` to first order in :math:`d`.
    """
    check_range("lr", lr, 0.0, None)
    check_range("norm", norm, 0.0, None, lo_open=True)
    check_range("numel", numel, 1, None)
    nu = adamw_update_moments(d, beta1, beta2)[0]
    return math.atan(lr * math.sqrt(numel * nu) / ((1.0 - d) * norm))


def equilibrium_norm(optimizer: str, decay: str, lr: float, wd: float, *, numel: int, G2: float | None = None,
                     momentum: float = 0.9, betas: tuple[float, float] = (0.9, 0.999)) -> float:
    r"""Predicted equilibrium norm :math:`\sqrt{x^*}` of a gauge group for any supported optimizer/convention.

    AdamW: :func:`adamw_equilibrium_norm` (no gradient scale needed: Adam's step ignores it).  SGD and
    SGD+momentum need :math:`G^2 = \mathbb E\lVert g\rVert^2\lVert W\rVert^2` (measured) and use
    :func:`fixed_point_sgd` (decoupled) or :func:`fixed_point_l2` (coupled L2).  ``inf`` without decay.
    """
    mu = momentum_of(optimizer, momentum, betas)
    d = decoupled_decay(lr, wd, decay)
    if optimizer == "adamw":
        return adamw_equilibrium_norm(lr, wd, numel, mu, decay, float(betas[1]))
    if G2 is None:
        raise ValueError("G2 (mean ||g||^2 ||W||^2) is needed for the SGD equilibrium norm")
    if decay == "l2":
        return math.inf if lr * wd <= 0 else float(np.sqrt(fixed_point_l2(lr, wd, G2, mu)))
    return math.inf if d <= 0 else float(np.sqrt(fixed_point_sgd(lr, d, G2, mu)))


def relaxation_steps(optimizer: str, decay: str, lr: float, wd: float, momentum: float = 0.9,
                     nesterov: bool = False) -> float:
    r"""Steps per e-fold of the squared-norm transient (exact within the random-walk model).

    AdamW: :math:`-1/(2\ln q)\approx 1/(2\eta\lambda)` (:func:`dynamics.scalefree.relaxation_steps`), the decay's
    own; coupled to the lag of :math:`\hat v` the norm has a fast and a slow mode (:func:`adamw_relaxation_modes`),
    and a fresh AdamW approaches on the slow one, :math:`\approx 1/(2\eta\lambda) + 2/(1-\beta_2)`.  SGD and
    SGD+momentum: :math:`-1/\ln\rho`, :math:`\rho` the spectral radius of the second-moment map's Jacobian
    (:class:`dynamics.heavyball.HeavyBall`): plain SGD :math:`-1/\ln|2q^2-1| \approx 1/(4d)`; with momentum and
    coupled L2 about :math:`(1-\mu)/(4\eta\lambda)`, or :math:`-2/\ln\mu` once the roots are complex (the
    decay term rides in the momentum buffer: it acts :math:`1/(1-\mu)` times).  ``momentum`` is read for ``sgdm``
    only (0 for ``sgd``, ``betas`` for ``adamw`` do not enter).
    """
    mu = momentum_of(optimizer, momentum, (0.9, 0.999))  # betas do not enter a relaxation time
    d = decoupled_decay(lr, wd, decay)
    if decay == "l2":
        d = lr * wd
    if d <= 0.0:
        return math.inf
    if optimizer == "adamw":
        return scale_free_relaxation_steps(d)
    if not isinstance(nesterov, bool):
        raise ValueError(f"nesterov must be True or False, got {nesterov!r}")
    if mu == 0.0 and not nesterov:  # log1p form of -1/ln|2q^2-1|: 2q^2 - 1 = 1 - 4d + 2d^2
        return relaxation_time(relaxation_factor(d, "sgd")) if d >= 0.5 else -1.0 / math.log1p(-4.0 * d + 2.0 * d * d)
    rule = HeavyBall(lr=lr, l2=wd, momentum=mu, nesterov=nesterov) if decay == "l2" else \
        HeavyBall(lr=lr, d=d, momentum=mu, nesterov=nesterov)
    return rule.relaxation_steps()


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
    that uses it* (dividing each by the moment of its own step instead overstates the divisor while the norm grows,
    for that moment is older and the gradients shrink as the norm grows: that placement, without the scatter below,
    trails a simulation by 13% of :math:`x^*` at step 30 and enters a 5% band 260 steps late from
    :math:`0.3\lVert W^*\rVert` at :math:`\beta = (0.9, 0.999)`).  With :math:`\hat v_t = V_t(1+\delta_t)`,
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
    d = decoupled_decay(lr, wd, "torch")
    momentum_of("adamw", 0.0, betas)
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


def adamw_relaxation_modes(d: float, beta2: float) -> tuple[float, float]:
    r"""``(fast, slow)``: steps per e-fold of the two modes of AdamW's norm coupled to the lag of :math:`\hat v`.

    The update is scale-free only once :math:`\hat v` has caught up with the gradient's scale
    :math:`s \propto 1/x`: with :math:`\xi = \delta x/x` and :math:`\zeta = \delta\hat v/\hat v`, the map
    linearized at :math:`x^*` (momentum quasi-static; the step's gradient enters :math:`\hat v` before it is divided)
    is :math:`\zeta' = \beta_2\zeta - (1-\beta_2)\xi`, :math:`\xi' = q^2\xi - (1-q^2)(\xi + \zeta')`: a norm
    displaced at a settled :math:`\hat v` returns on the
    fast mode (the lagging :math:`\hat v` adds a restoring force; faster than :math:`-1/(2\ln q)`), while a fresh
    optimizer far from :math:`x^*`, whose :math:`\hat v` starts at the first gradients' scale, approaches on the slow
    one, :math:`\approx 1/(2\eta\lambda) + 2/(1-\beta_2)`: 2,050 steps at :math:`\eta\lambda = 0.005`,
    :math:`\beta_2 = 0.999`, where :func:`relaxation_steps` gives the decay's own 100 (the trajectory of
    :func:`adamw_transient` from 4 or 0.09 times :math:`x^*` decays at that rate to 0.5%)."""
    q = 1.0 - check_range("d", d, 0.0, 1.0, hi_open=True)
    b2 = check_range("beta2", beta2, 0.0, 1.0, hi_open=True)
    c = 1.0 - q * q
    j11, j12, j21 = q * q - c * b2, -c * b2, -(1.0 - b2)  # (xi, zeta) -> (xi', zeta'), j22 = beta2
    half_trace, root = 0.5 * (j11 + b2), math.sqrt(0.25 * (j11 - b2) ** 2 + j12 * j21)
    lam = sorted((abs(half_trace - root), abs(half_trace + root)))
    return relaxation_time(lam[0]), relaxation_time(lam[1])


def adamw_trajectory(x0: float, lr: float, wd: float, numel: int, betas: tuple[float, float],
                     steps: int) -> np.ndarray:
    """Mean-field :math:`x_0 .. x_T` of a fresh AdamW on a gauge (:func:`adamw_transient` without the allowance)."""
    return adamw_transient(x0, lr, wd, numel, betas, steps)[0]


def adamw_steps_to_equilibrium(x0: float, lr: float, wd: float, numel: int, betas: tuple[float, float],
                               band: float) -> tuple[float, float]:
    """``(enter, settle)`` steps of a fresh AdamW from :func:`adamw_trajectory`, relative to the equilibrium of
    :func:`adamw_equilibrium_norm` at ``betas`` (:func:`dynamics.scalefree.grow_until_settled`, settled once four
    e-folds of the slow mode of :func:`adamw_relaxation_modes` stay inside half the band)."""
    d = decoupled_decay(lr, wd, "torch")
    momentum_of("adamw", 0.0, betas)
    if d == 0.0:
        return math.inf, math.inf
    x_star = adamw_equilibrium_norm(lr, wd, numel, betas[0], "torch", float(betas[1])) ** 2
    tau = max(scale_free_relaxation_steps(d), adamw_relaxation_modes(d, betas[1])[1])
    first = math.ceil(scale_free_steps(x0, x_star, d, band) + 4.0 * tau)
    return grow_until_settled(lambda n: adamw_trajectory(x0, lr, wd, numel, betas, n), x_star, tau, band, first)


def steps_to_equilibrium(x0: float, x_star: float, factor: float, band: float) -> float:
    r"""Steps until the squared norm is within ``band`` (relative) of :math:`x^*` for a *linear* map with slope
    ``factor``: :math:`\ln(\text{band}\,x^*/|x_0-x^*|)/\ln|f'(x^*)|` (0 when already inside; inf for
    :math:`|f'|\ge 1`).  Exact for the scale-free updates' :math:`q^2`; for the SGD family, whose map is not linear
    far from :math:`x^*`, and for fresh AdamW / Lion (momentum and :math:`\hat v` still filling) the monitor
    iterates the laws' own maps instead (:meth:`dynamics.heavyball.HeavyBall.steps_to_equilibrium`,
    :func:`adamw_steps_to_equilibrium`, :func:`dynamics.scalefree.lion_steps_to_equilibrium`)."""
    gap = abs(x0 - x_star)
    if gap <= band * x_star:
        return 0.0
    a = abs(factor)
    if a >= 1.0 or not math.isfinite(x_star):
        return math.inf
    return math.log(band * x_star / gap) / math.log(a) if a > 0 else 1.0


def tensor_angle(a, b) -> float:
    r"""Angle between two vectors, stable near 0: :math:`2\,\operatorname{atan2}(\lVert\hat a-\hat b\rVert,
    \lVert\hat a+\hat b\rVert)` (no ``acos`` of a number near 1)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    ua, ub = a / np.linalg.norm(a), b / np.linalg.norm(b)
    return float(2.0 * np.arctan2(np.linalg.norm(ua - ub), np.linalg.norm(ua + ub)))
