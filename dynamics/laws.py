r"""The exact laws of weight-norm dynamics for a scale gauge, next to the source's first-order forms.

One step, every optimizer: :math:`W_{t+1} = q\,W_t - \eta\,u_t`, :math:`q = 1 - d`, with :math:`u_t` the update
direction (:math:`g_t` for SGD, the momentum buffer, AdamW's :math:`\hat m/(\sqrt{\hat v}+\epsilon)`) and :math:`d`
the decoupled decay per step of the convention: ``source`` :math:`W \leftarrow W - \eta g - \lambda W`
(:math:`d = \lambda`), ``torch`` (``torch.optim.AdamW``, SGD-W: :math:`d = \eta\lambda`), ``l2`` (:math:`\lambda W`
added to the gradient, ``torch.optim.SGD``'s ``weight_decay``, Wan et al.'s setting: :math:`d = 0`, the decay
enters :math:`u`).  A scale gauge has :math:`\langle g, W\rangle = 0` (Euler) and :math:`g(cW) = g(W)/c`, so
:math:`\lVert g(W)\rVert = G(\hat W)/\lVert W\rVert` with :math:`G` the gradient norm at unit norm.

* Norm identity (exact): :math:`\lVert W_{t+1}\rVert^2 = q^2\lVert W_t\rVert^2 - 2\eta q\langle u_t, W_t\rangle
  + \eta^2\lVert u_t\rVert^2`; the source's :math:`(1-2d)` form drops :math:`d^2\lVert W_t\rVert^2`, a systematic
  bias :math:`e_{t+1} = (1-2d)e_t + d^2 x_t` (:func:`first_order_bias`).
* Fixed points and relaxation: SGD :math:`x^{*2} = \eta^2G^2/(1-q^2)`, slope :math:`2q^2-1`; with momentum the
  relaxation is the spectral radius of the second-moment map (:mod:`dynamics.heavyball`), not :math:`2q^2-1`;
  AdamW, Lion and Muon are scale-free, :math:`x^* = \eta^2C\nu(1+2qA)/(1-q^2)`, relaxation :math:`-1/(2\ln q)`
  (:mod:`dynamics.scalefree`; AdamW's finite :math:`\beta_2` and fresh-optimizer transient:
  :mod:`dynamics.adamw_window`).
* Angles: SGD :math:`\cos\varphi^* = q` exactly; momentum :math:`\mu` (random-walk regime of Kosson et al.)
  :math:`\cos\varphi^* = (q+\mu)/(1+\mu q)`; coupled L2 :math:`1-\eta\lambda/(1+\mu)`.  The published forms, Kosson,
  Messmer & Jaggi, *Rotational Equilibrium* (ICML 2024, arXiv:2305.17212) for AdamW and Wan et al., *Spherical
  Motion Dynamics* (NeurIPS 2021, arXiv:2006.08419) for SGD+momentum with L2, are their small-:math:`d` limits.
* No law: Adam with L2 (:data:`ADAM_L2_WHY`); Adafactor with relative steps has no equilibrium
  (:data:`ADAFACTOR_WHY`, :func:`adafactor_angle_bound`).

Symbolic checks in ``proofs/dynamics_identities.py``; measured in ``dynamics/checks.py`` and by float64 simulation
in ``tests/test_dynamics_laws*.py``.  Floats or numpy arrays in and out (broadcasting); no torch.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.signal import lfilter

from dynamics.adamw_window import adamw_equilibrium_cos, adamw_update_moments, fixed_point_adamw
from dynamics.heavyball import HeavyBall
from dynamics.scalefree import e_fold
from dynamics.scalefree import relaxation_steps as scale_free_relaxation_steps
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
    return e_fold(abs(factor))


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
    own (a fresh AdamW approaches on the slower mode coupled to the lag of :math:`\hat v`,
    :func:`dynamics.adamw_window.adamw_relaxation_modes`).  SGD and SGD+momentum: :math:`-1/\ln\rho`, :math:`\rho`
    the spectral radius of the second-moment map's Jacobian (:class:`dynamics.heavyball.HeavyBall`): plain SGD
    :math:`-1/\ln|2q^2-1| \approx 1/(4d)`; with momentum and coupled L2 about :math:`(1-\mu)/(4\eta\lambda)`, or
    :math:`-2/\ln\mu` once the roots are complex.  ``momentum`` is read for ``sgdm`` only.
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


def steps_to_equilibrium(x0: float, x_star: float, factor: float, band: float) -> float:
    r"""Steps until the squared norm is within ``band`` (relative) of :math:`x^*` for a *linear* map with slope
    ``factor``: :math:`\ln(\text{band}\,x^*/|x_0-x^*|)/\ln|f'(x^*)|` (0 when already inside; inf for
    :math:`|f'|\ge 1`).  Exact for the scale-free updates' :math:`q^2`; for the SGD family, whose map is not linear
    far from :math:`x^*`, and for fresh AdamW / Lion (momentum and :math:`\hat v` still filling) the monitor
    iterates the laws' own maps instead (:meth:`dynamics.heavyball.HeavyBall.steps_to_equilibrium`,
    :func:`dynamics.adamw_window.adamw_steps_to_equilibrium`, :func:`dynamics.scalefree.lion_steps_to_equilibrium`)."""
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
