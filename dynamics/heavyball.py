r"""The SGD family on a scale gauge, exactly: the second-moment map of SGD, heavy-ball momentum and Nesterov.

One step of ``torch.optim.SGD`` (momentum :math:`\mu`, dampening :math:`\tau`, coupled L2 :math:`\lambda`, optional
Nesterov), after an optional decoupled decay :math:`d` (SGD-W), :math:`q = 1-d`, :math:`\kappa = 1-\tau`:

.. math::  h_t = g_t + \lambda W_t,\quad b_t = \mu b_{t-1} + \kappa h_t,\quad
           u_t = b_t \;\text{(heavy ball)}\;\text{or}\; h_t + \mu b_t \;\text{(Nesterov)},\quad
           W_{t+1} = qW_t - \eta u_t .

In the random-walk model (Kosson et al., arXiv:2305.17212, §3; Wan et al., arXiv:2006.08419: on a gauge
:math:`\langle g_t, W_t\rangle = 0`, :math:`\lVert g_t\rVert^2 = G^2/\lVert W_t\rVert^2`, gradients uncorrelated
across steps) the second moments :math:`s_t = (X, Y, Z) = (\lVert W_t\rVert^2, \langle W_t, b_{t-1}\rangle,
\lVert b_{t-1}\rVert^2)` obey a closed map, linear in :math:`s` and in the forcing :math:`P_t = G^2/X_t`:
:math:`s_{t+1} = M s_t + P_t f` (:meth:`HeavyBall.moment_step`; every cross term with :math:`g_t` vanishes).

* **Fixed point**: :math:`s^* = P^* v`, :math:`v = (I-M)^{-1}f`, so :math:`X^{*2} = G^2 v_0` (:math:`\mu = 0`:
  :math:`\eta^2G^2/(1-q^2)`; heavy ball: :func:`dynamics.laws.fixed_point_sgd`, :func:`dynamics.laws.fixed_point_l2`).
* **Equilibrium angle**: :math:`\cos\varphi^* = q - \eta\langle W,u\rangle^*/X^*`.
* **Relaxation**: the Jacobian at the fixed point, :math:`J = M - f e_0^\top/v_0` (independent of :math:`G`), decays
  the transient as :math:`\rho^t`, :math:`\rho` its spectral radius.  For heavy ball the characteristic polynomial
  factors (sympy proof ``dynamics.relaxation_momentum``): decoupled :math:`(z-\mu^2q^2)(z^2 + Bz + \mu q)`,
  :math:`B = (1+\mu^2q^2-2\mu^2-2\mu q-2q^2)/(1+\mu q)`; coupled L2 (:math:`\epsilon = \eta\lambda`)
  :math:`(z-\mu^2)(z^2 - (1+\mu-4\epsilon+2\epsilon^2/(1+\mu))z + \mu)`.  The slow L2 root is
  :math:`1 - 4\epsilon/(1-\mu) + O(\epsilon^2)`: relaxation :math:`(1-\mu)/(4\eta\lambda)`, *not* plain SGD's
  :math:`1/(4\eta\lambda)`; past :math:`\epsilon \gtrsim (1-\sqrt\mu)^2/4` the roots are complex with modulus
  :math:`\sqrt\mu` and the norm rings in :math:`-2/\ln\mu` steps per e-fold (19 at 0.9).
* **Steps to equilibrium** (:meth:`HeavyBall.steps_to_equilibrium`): the map iterated from the start state (a fresh
  optimizer has :math:`Y = Z = 0`), which keeps its nonlinearity far from :math:`X^*`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dynamics.scalefree import e_fold, grow_until_settled
from rmsgauge import check_range


@dataclass(frozen=True)
class HeavyBall:
    """Hyperparameters of one SGD-family rule (``d``: decoupled decay per step; ``l2``: coupled coefficient)."""

    lr: float
    d: float = 0.0
    l2: float = 0.0
    momentum: float = 0.0
    nesterov: bool = False
    dampening: float = 0.0

    def __post_init__(self) -> None:
        check_range("lr", self.lr, 0.0, None, lo_open=True)
        check_range("d", self.d, 0.0, 1.0, hi_open=True)
        check_range("l2", self.l2, 0.0, None)
        check_range("momentum", self.momentum, 0.0, 1.0, hi_open=True)
        check_range("dampening", self.dampening, 0.0, 1.0, hi_open=True)
        if self.d == 0.0 and self.l2 == 0.0:
            raise ValueError("HeavyBall needs a decay: d (decoupled) or l2 (coupled) in (0, inf); without one the "
                             "norm grows without bound (no equilibrium)")

    def moment_step(self, X, Y, Z, P):
        """One step of the second-moment map (vectorized: arrays broadcast); returns ``(X', Y', Z')``."""
        q, eta, mu, lam, k = 1.0 - self.d, self.lr, self.momentum, self.l2, 1.0 - self.dampening
        h2 = P + lam * lam * X  # ||h||^2
        Wb = mu * Y + k * lam * X  # <W_t, b_t>
        bb = mu * mu * Z + 2.0 * mu * k * lam * Y + k * k * h2  # ||b_t||^2
        if self.nesterov:  # u = h + mu b = (1 + mu k) h + mu^2 b_{t-1}
            a = 1.0 + mu * k
            Wu = a * lam * X + mu * mu * Y
            uu = a * a * h2 + 2.0 * a * mu * mu * lam * Y + mu**4 * Z
            ub = mu * a * lam * Y + mu**3 * Z + k * a * h2 + k * mu * mu * lam * Y
        else:
            Wu, uu, ub = Wb, bb, bb
        return q * q * X - 2.0 * eta * q * Wu + eta * eta * uu, q * Wb - eta * ub, bb

    def matrices(self) -> tuple[np.ndarray, np.ndarray]:
        """``(M, f)`` with ``s' = M s + P f`` (the map is linear in ``(X, Y, Z, P)``: read off on unit vectors)."""
        eye = np.eye(4)
        cols = np.array(self.moment_step(eye[0], eye[1], eye[2], eye[3]))  # (3, 4)
        return cols[:, :3], cols[:, 3]

    def _v(self) -> np.ndarray:
        M, f = self.matrices()
        return np.linalg.solve(np.eye(3) - M, f)

    def fixed_point(self, G2) -> np.ndarray:
        r"""Squared-norm fixed point :math:`X^* = \sqrt{G^2 v_0}` (``G2`` may be an array)."""
        return np.sqrt(np.asarray(G2, dtype=np.float64) * self._v()[0])

    def equilibrium_cos(self) -> float:
        r""":math:`\cos\varphi^* = q - \eta\langle W,u\rangle^*/X^*` (independent of :math:`G`)."""
        v = self._v()
        X, Y = 1.0, v[1] / v[0]  # the fixed state scaled to X = 1
        q, eta, mu, lam, k = 1.0 - self.d, self.lr, self.momentum, self.l2, 1.0 - self.dampening
        Wu = (1.0 + mu * k) * lam * X + mu * mu * Y if self.nesterov else mu * Y + k * lam * X
        return float(q - eta * Wu)

    def jacobian(self) -> np.ndarray:
        r""":math:`J = M - f e_0^\top / v_0` at the fixed point."""
        M, f = self.matrices()
        J = M.copy()
        J[:, 0] -= f / self._v()[0]
        return J

    def relaxation_factor(self) -> float:
        """Spectral radius of the Jacobian: the per-step contraction of the slowest mode."""
        return float(np.abs(np.linalg.eigvals(self.jacobian())).max())

    def relaxation_steps(self) -> float:
        """Steps per e-fold of the transient, :math:`-1/\\ln\\rho`."""
        return e_fold(self.relaxation_factor())

    def trajectory(self, x0: float, G2: float, steps: int, y0: float = 0.0, z0: float = 0.0) -> np.ndarray:
        """``X_0 .. X_steps`` of the mean-field map from ``(x0, y0, z0)`` (a fresh optimizer: ``y0 = z0 = 0``)."""
        M, f = self.matrices()
        (a, b, c), (d_, e, g_), (h, i, j) = M.tolist()
        f0, f1, f2 = f.tolist()
        X, Y, Z = float(x0), float(y0), float(z0)
        out = np.empty(steps + 1)
        for t in range(steps):  # a nonlinear recursion: sequential by nature (a handful of flops per step)
            out[t] = X
            P = G2 / X
            X, Y, Z = a * X + b * Y + c * Z + f0 * P, d_ * X + e * Y + g_ * Z + f1 * P, h * X + i * Y + j * Z + f2 * P
        out[steps] = X
        return out

    def steps_to_equilibrium(self, x0: float, G2: float, band: float, y0: float = 0.0,
                             z0: float = 0.0) -> tuple[float, float]:
        r"""``(enter, settle)``: first step with :math:`|X_t/X^*-1| \le` ``band`` and first from which it stays, for
        the mean-field map from ``(x0, y0, z0)`` (:func:`dynamics.scalefree.grow_until_settled`)."""
        xs, tau = float(self.fixed_point(G2)), self.relaxation_steps()
        first = math.ceil(4.0 * tau * max(1.0, math.log(abs(x0 / xs - 1.0) / band + 1.0)))
        return grow_until_settled(lambda n: self.trajectory(x0, G2, n, y0, z0), xs, tau, band, first)


def heavy_ball_factor_closed(lr: float, mu: float, *, d: float = 0.0, l2: float = 0.0) -> float:
    r"""Closed-form relaxation factor of heavy ball (no Nesterov, no dampening), one decay kind at a time.

    Decoupled (:math:`d`, :math:`q=1-d`): roots of :math:`z^2 + Bz + \mu q` and :math:`\mu^2q^2`;
    coupled L2 (:math:`\epsilon = \eta\lambda`): roots of :math:`z^2 - (1+\mu-4\epsilon+2\epsilon^2/(1+\mu))z + \mu`
    and :math:`\mu^2`.  Returns the largest modulus (the module docstring derives both).
    """
    if (d > 0.0) == (l2 > 0.0):
        raise ValueError(f"exactly one of d and l2 must be in (0, inf), got d={d!r}, l2={l2!r}")
    if d > 0.0:
        q = 1.0 - d
        B = (1.0 + mu * mu * q * q - 2.0 * mu * mu - 2.0 * mu * q - 2.0 * q * q) / (1.0 + mu * q)
        roots = [*np.roots([1.0, B, mu * q]), mu * mu * q * q]
    else:
        eps = lr * l2
        s = 1.0 + mu - 4.0 * eps + 2.0 * eps * eps / (1.0 + mu)
        roots = [*np.roots([1.0, -s, mu]), mu * mu]
    return float(np.abs(np.asarray(roots)).max())
