r"""Closed-form rotational-equilibrium predictions for a scale-invariant (gauge) weight.

Dependency-free (``math`` only): the training loop calls these once per logged step.

Setting.  A weight :math:`W` (a tensor of :math:`C` numbers) is a *gauge* of the loss when
:math:`L(cW) = L(W)` for every :math:`c > 0` (the RMSNorm scale gauge: a projection followed by
an RMSNorm with :math:`\epsilon = 0`, e.g. QK-norm).  Then, by Euler's theorem for functions
homogeneous of degree 0, :math:`\langle\nabla L, W\rangle = 0` exactly: the gradient is tangent to
the sphere :math:`\lVert W\rVert = \text{const}`, and only weight decay touches the norm.

Conventions (PyTorch's).  Learning rate :math:`\eta`, weight decay :math:`\lambda`, and the decay
acts as :math:`W \leftarrow (1 - \eta\lambda)W - \eta\,u` where :math:`u` is the optimizer's update
direction (AdamW, Loshchilov & Hutter arXiv:1711.05101: :math:`u = \hat m/(\sqrt{\hat v}+\epsilon)`;
SGD with coupled L2 ``weight_decay``: :math:`u = \nabla L`, the same :math:`(1-\eta\lambda)` factor).
The source text writes the decay as ``W <- W - lr g - wd W``; its ``wd`` is our :math:`\eta\lambda`.

**SGD, exact (no momentum).**  Because :math:`\langle g, W\rangle = 0`,

.. math::  \lVert W_{t+1}\rVert^2 = (1-\eta\lambda)^2\lVert W_t\rVert^2 + \eta^2\lVert g_t\rVert^2,
           \qquad \tan\varphi_t = \frac{\eta\lVert g_t\rVert}{(1-\eta\lambda)\lVert W_t\rVert},

with :math:`\varphi_t` the angle between :math:`W_t` and :math:`W_{t+1}` -- both identities exact.
For a gauge, :math:`\lVert g\rVert \propto 1/\lVert W\rVert`; write :math:`G = \lVert g\rVert\lVert W\rVert`
(scale-free).  With :math:`G` stationary the fixed point of the norm recursion is

.. math::  \lVert W^*\rVert^4 = \frac{\eta^2 G^2}{1-(1-\eta\lambda)^2},
           \qquad \cos\varphi^* = 1-\eta\lambda \;\;\Longrightarrow\;\;
           \varphi^* = \arccos(1-\eta\lambda) = \sqrt{2\eta\lambda}\,\big(1 + O(\eta\lambda)\big),

an equilibrium angle independent of the gradient's size (substitute :math:`\lVert W^*\rVert` into
:math:`\tan\varphi`: :math:`\tan^2\varphi^* = (1-(1-\eta\lambda)^2)/(1-\eta\lambda)^2`).

**AdamW (Kosson, Messmer & Jaggi, "Rotational Equilibrium: How Weight Decay Balances Learning
Across Neural Networks", arXiv:2305.17212, §4 and Table 1).**  Their random-walk model: gradients
uncorrelated across steps and orthogonal to :math:`W`, Adam's normalized update has
:math:`\mathbb E\,u_i^2 = 1` per coordinate before momentum.  The first moment with coefficient
:math:`\beta_1` keeps each gradient's *total* contribution at 1 (so the norm sees :math:`\eta^2 C`
per step) but shrinks the *per-step* update to :math:`\mathbb E\lVert\Delta W\rVert^2 =
\eta^2 C\,\frac{1-\beta_1}{1+\beta_1}`.  Balancing decay against growth:

.. math::  \widehat{\lVert W\rVert} = \sqrt{\frac{\eta C}{2\lambda}}, \qquad
           \widehat{\varphi} = \frac{\sqrt{\mathbb E\lVert\Delta W\rVert^2}}{\widehat{\lVert W\rVert}}
           = \sqrt{\frac{2\eta\lambda\,(1-\beta_1)}{1+\beta_1}} .

(The often-quoted :math:`\sqrt{2\eta\lambda}` is the :math:`\beta_1 = 0` case; the public implementation
of the paper's rotational optimizers, ``adamw_etar_func``, computes ``(2*lr*wd*(1-beta1)/(1+beta1))**0.5``.)
It holds per scale-invariant group and, since it does not depend on :math:`C`, also for any union of
such groups (a whole QK-norm projection is a union of per-head gauges).  SGD with momentum :math:`\alpha`:
:math:`\widehat\varphi = \sqrt{2\eta\lambda/(1+\alpha)}` (same paper, Table 1).

**Transient.**  Equilibrium is approached on the time scale of the norm recursion's contraction,
:math:`\lVert W_t\rVert^2 - \lVert W^*\rVert^2 \propto (1-\eta\lambda)^{2t}`, i.e. about
:math:`1/(2\eta\lambda)` steps per e-fold.  Short runs sit in the transient; for them the same
random-walk model predicts the angle *from the measured norm*,
:math:`\varphi_t \approx \eta\sqrt{C(1-\beta_1)/(1+\beta_1)}\,/\,\lVert W_t\rVert`
(:func:`adamw_random_walk_angle`), which equals :math:`\widehat\varphi` at :math:`\widehat{\lVert W\rVert}`.
"""

from __future__ import annotations

import math


def _check(name: str, value: float, lo: float, hi: float | None = None, *, lo_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value > lo if lo_open else value >= lo)
    if ok and hi is not None:
        ok = value < hi
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo:g}, {'inf' if hi is None else f'{hi:g}'})"
        raise ValueError(f"{name} must be in {rng}, got {value!r}")
    return float(value)


def adamw_equilibrium_angle(lr: float, wd: float, beta1: float = 0.9) -> float:
    r"""Expected per-step rotation (radians) at AdamW equilibrium, :math:`\sqrt{2\eta\lambda(1-\beta_1)/(1+\beta_1)}`.

    Kosson, Messmer & Jaggi, arXiv:2305.17212, Table 1 (AdamW row).
    """
    lr, wd = _check("lr", lr, 0.0), _check("wd", wd, 0.0)
    beta1 = _check("beta1", beta1, 0.0, 1.0)
    return math.sqrt(2.0 * lr * wd * (1.0 - beta1) / (1.0 + beta1))


def adamw_equilibrium_norm(lr: float, wd: float, numel: int) -> float:
    r"""Equilibrium norm of a gauge tensor of ``numel`` numbers under AdamW: :math:`\sqrt{\eta C/(2\lambda)}`.

    Infinite when ``wd == 0`` (without decay nothing stops the random walk's growth).
    """
    lr, wd = _check("lr", lr, 0.0), _check("wd", wd, 0.0)
    _check("numel", numel, 1)
    return math.inf if wd == 0.0 else math.sqrt(lr * numel / (2.0 * wd))


def adamw_random_walk_angle(lr: float, norm: float, numel: int, beta1: float = 0.9) -> float:
    r"""Random-walk per-step angle at the *current* norm: :math:`\eta\sqrt{C(1-\beta_1)/(1+\beta_1)}/\lVert W\rVert`.

    Valid in the transient too; equals :func:`adamw_equilibrium_angle` at :func:`adamw_equilibrium_norm`.
    """
    lr = _check("lr", lr, 0.0)
    norm = _check("norm", norm, 0.0, lo_open=True)
    beta1 = _check("beta1", beta1, 0.0, 1.0)
    _check("numel", numel, 1)
    return lr * math.sqrt(numel * (1.0 - beta1) / (1.0 + beta1)) / norm


def sgd_equilibrium_angle(lr: float, wd: float, momentum: float = 0.0) -> float:
    r"""Per-step rotation at SGD equilibrium.

    ``momentum == 0``: the exact :math:`\arccos(1-\eta\lambda)` (module docstring).  ``momentum > 0``:
    Kosson et al.'s random-walk value :math:`\sqrt{2\eta\lambda/(1+\alpha)}` (no exact form exists there:
    momentum correlates consecutive steps).
    """
    lr, wd = _check("lr", lr, 0.0), _check("wd", wd, 0.0)
    momentum = _check("momentum", momentum, 0.0, 1.0)
    a = lr * wd
    if a > 1.0:
        raise ValueError(f"lr*wd must be in [0, 1] (decay factor 1 - lr*wd >= 0), got {a!r}")
    if momentum == 0.0:
        return math.acos(1.0 - a)
    return math.sqrt(2.0 * a / (1.0 + momentum))


def sgd_norm_step(norm_sq: float, lr: float, wd: float, grad_sq: float) -> float:
    r"""Exact next squared norm of a gauge under SGD: :math:`(1-\eta\lambda)^2 n + \eta^2\lVert g\rVert^2`."""
    return (1.0 - lr * wd) ** 2 * norm_sq + lr * lr * grad_sq


def sgd_equilibrium_norm(lr: float, wd: float, grad_times_norm: float) -> float:
    r"""Fixed point of :func:`sgd_norm_step` with :math:`\lVert g\rVert = G/\lVert W\rVert`:
    :math:`\big(\eta^2G^2/(1-(1-\eta\lambda)^2)\big)^{1/4}`."""
    lr, wd = _check("lr", lr, 0.0), _check("wd", wd, 0.0)
    G = _check("grad_times_norm", grad_times_norm, 0.0)
    a = lr * wd
    if a == 0.0:
        return math.inf
    return (lr * lr * G * G / (1.0 - (1.0 - a) ** 2)) ** 0.25


def relaxation_steps(lr: float, wd: float) -> float:
    r"""Steps per e-fold of the squared-norm transient: :math:`-1/(2\ln(1-\eta\lambda)) \approx 1/(2\eta\lambda)`."""
    lr, wd = _check("lr", lr, 0.0), _check("wd", wd, 0.0)
    a = lr * wd
    if a == 0.0:
        return math.inf
    if a >= 1.0:
        raise ValueError(f"lr*wd must be in [0, 1), got {a!r}")
    return -1.0 / (2.0 * math.log1p(-a))
