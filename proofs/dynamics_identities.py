r"""Symbolic (sympy) identities behind the weight-norm dynamics claims (``dynamics.*``).

Source: ``../shared/seeds/000_af2b73d9d39ee98c.txt``.  Notation as in ``dynamics/laws.py``: one step is
:math:`W' = qW - \eta u`, :math:`q = 1 - d` (``source``: :math:`d = \lambda`; ``torch``: :math:`d = \eta\lambda`),
:math:`x = \lVert W\rVert^2`; for a scale gauge :math:`\langle g, W\rangle = 0` and
:math:`\lVert g\rVert = G/\lVert W\rVert`.

* ``dynamics.norm_identity`` --
  :math:`\lVert qW - \eta u\rVert^2 = q^2x - 2\eta q\langle u,W\rangle + \eta^2\lVert u\rVert^2`
  (concrete :math:`n = 4`: the expansion is bilinear term by term, so one size shows the algebra).
* ``dynamics.norm_identity_first_order`` -- with :math:`u = g \perp W` the source's :math:`(1-2d)` form misses
  by exactly :math:`d^2 x`.
* ``dynamics.gradient_scaling`` -- :math:`L(W) = f(W/\lVert W\rVert)` (undefined :math:`f`, :math:`n = 2`) has
  :math:`g(cW) = g(W)/c` for :math:`c > 0` (why the fixed point is implicit and the rate goes as :math:`c^{-2}`).
* ``dynamics.trajectory_tracking`` -- the gap between the exact and the iterated :math:`(1-2d)` trajectories obeys
  :math:`e_{t+1} = (1-2d)e_t + d^2x_t`; for constant :math:`x`, :math:`e_t = \tfrac{dx}2(1-(1-2d)^t)` (symbolic
  :math:`t`), whose limits are :math:`d^2 x\,t` (early, series in :math:`d`) and :math:`dx/2`.
* ``dynamics.equilibrium_norm`` -- :math:`x^{*2} = \eta^2G^2/(1-q^2)` is the fixed point of
  :math:`f(x) = q^2x + \eta^2G^2/x`; :math:`f'(x^*) = 2q^2 - 1`, :math:`|f'| < 1` for :math:`0 < q^2 < 1`;
  :math:`x^{*2}\,2d/(\eta^2G^2) = 1/(1-d/2)` (the source's form drops :math:`d^2`); relaxation time
  :math:`-1/\ln|2q^2-1| = 1/(4d) - 3/8 + O(d)`.
* ``dynamics.equilibrium_norm_momentum`` -- the stationary second moments of SGD+momentum (decoupled and coupled
  L2) and AdamW under uncorrelated gradients, solved by sympy, give the fixed points used in ``dynamics/laws.py``.
* ``dynamics.relaxation_momentum`` -- the Jacobian of the heavy-ball second-moment map (:mod:`dynamics.heavyball`)
  at its fixed point has the characteristic polynomial :math:`(z-\mu^2)(z^2 - (1+\mu-4\epsilon+2\epsilon^2/(1+\mu))z
  + \mu)` with coupled L2 (:math:`\epsilon = \eta\lambda`) and :math:`(z-\mu^2q^2)(z^2+Bz+\mu q)` with decoupled
  decay; the slow root is :math:`1 - 4\epsilon/(1-\mu) + O(\epsilon^2)`: the relaxation time is
  :math:`(1-\mu)/(4\eta\lambda)`, not the plain-SGD :math:`1/(4\eta\lambda)`.
* ``dynamics.equilibrium_angle`` -- SGD: stationary norm and :math:`g\perp W` give :math:`\cos\varphi^* = q`,
  :math:`\tan\varphi^* = \sqrt{1-q^2}/q`; :math:`\arccos(1-d) = \sqrt{2d}\,(1 + d/12 + O(d^2))`.
* ``dynamics.equilibrium_angle_momentum`` -- from the solved moments,
  :math:`\mathbb E\langle W,W'\rangle/\mathbb E x = (q+\mu)/(1+\mu q)` (decoupled) and :math:`1 - \eta\lambda/(1+\mu)`
  (coupled L2); their first-order limits are Kosson et al.'s :math:`\sqrt{2d(1-\mu)/(1+\mu)}` and Wan et al.'s
  :math:`\sqrt{2\eta\lambda/(1+\mu)}`.
* ``dynamics.angular_rate_scaling`` -- the exact per-step angle
  :math:`\tan\varphi = \eta\lVert g\rVert/(q\lVert W\rVert)`
  (2-D frame spanned by :math:`W` and :math:`g`), and with :math:`g(cW) = g/c`:
  :math:`\tan\varphi(c) = \tan\varphi(1)/c^2`, :math:`d\ln\tan\varphi/d\ln c = -2`; Adam's first step
  :math:`u = g/(|g|+c\,\epsilon)` tends to a scale-free :math:`u` as :math:`\epsilon\to0`: exponent :math:`-1`.
"""

from __future__ import annotations

import sympy as sp

from proofs.core import ProofResult, is_zero

q, mu, eta, lam = sp.symbols("q mu eta lambda", positive=True)
d = sp.Symbol("d", positive=True)
x, G, gamma, nu = sp.symbols("x G gamma nu", positive=True)
t = sp.Symbol("t", nonnegative=True, integer=True)


def norm_identity() -> ProofResult:
    n = 4
    W = sp.Matrix(sp.symbols(f"w0:{n}", real=True))
    u = sp.Matrix(sp.symbols(f"u0:{n}", real=True))
    Wn = q * W - eta * u
    lhs = Wn.dot(Wn)
    rhs = q**2 * W.dot(W) - 2 * eta * q * u.dot(W) + eta**2 * u.dot(u)
    res = sp.expand(lhs - rhs)
    return ProofResult("dynamics.norm_identity",
                       "||q W - eta u||^2 = q^2 ||W||^2 - 2 eta q <u,W> + eta^2 ||u||^2 (u = g for SGD)",
                       is_zero(res), str(res),
                       "concrete n = 4 (the expansion is coordinatewise bilinear, the same for every n)")


def norm_identity_first_order() -> ProofResult:
    g2 = sp.Symbol("g2", positive=True)
    exact = (1 - d) ** 2 * x + eta**2 * g2  # <g, W> = 0
    source = (1 - 2 * d) * x + eta**2 * g2
    res = sp.expand(exact - source - d**2 * x)
    return ProofResult("dynamics.norm_identity_first_order",
                       "with <g,W> = 0: exact - (1-2d) form = d^2 ||W||^2 exactly (what the source drops)",
                       is_zero(res), f"exact - source - d^2 x = {res}", "symbolic d, x, eta, ||g||^2")


def gradient_scaling() -> ProofResult:
    w0, w1 = sp.symbols("w0 w1", real=True)
    c = sp.Symbol("c", positive=True)
    a, b = sp.symbols("a b", real=True)
    rr = sp.sqrt(a**2 + b**2)
    loss = sp.Function("f")(a / rr, b / rr)
    grad = [sp.diff(loss, v) for v in (a, b)]
    at_c = [gi.subs({a: c * w0, b: c * w1}) for gi in grad]
    at_1 = [gi.subs({a: w0, b: w1}) for gi in grad]
    res = [sp.simplify(p - q_ / c) for p, q_ in zip(at_c, at_1)]
    radial = sp.simplify(at_1[0] * w0 + at_1[1] * w1)
    ok = all(is_zero(e) for e in res) and is_zero(radial)
    return ProofResult("dynamics.gradient_scaling",
                       "L = f(W/||W||): g(cW) = g(W)/c for c > 0, and <g, W> = 0",
                       ok, f"g(cW) - g(W)/c = {res}; <g,W> = {radial}",
                       "n = 2 with an undefined f (sympy cannot differentiate f of a symbolic number of arguments)")


def trajectory_tracking() -> ProofResult:
    F, e = sp.symbols("F e", real=True)  # F = eta^2 ||g_t||^2 (shared forcing), e = x_t - xhat_t
    xhat = x - e
    x_next = (1 - d) ** 2 * x + F
    xhat_next = (1 - 2 * d) * xhat + F
    rec = sp.expand((x_next - xhat_next) - ((1 - 2 * d) * e + d**2 * x))
    e_t = d * x / 2 * (1 - (1 - 2 * d) ** t)
    closed = sp.simplify(e_t.subs(t, t + 1) - ((1 - 2 * d) * e_t + d**2 * x))
    early = sp.series(e_t.subs(t, 5) / x, d, 0, 3).removeO()  # t = 5: d^2 t + O(d^3)
    ok = is_zero(rec) and is_zero(closed) and is_zero(sp.expand(early - 5 * d**2))
    return ProofResult("dynamics.trajectory_tracking",
                       "e_(t+1) = (1-2d) e_t + d^2 x_t; constant x: e_t = (d x/2)(1 - (1-2d)^t) ~ d^2 x t early, "
                       "-> d x/2",
                       ok, f"recursion {rec}; closed form {closed}; early(t=5)/x = {early}",
                       "symbolic d, x, t (the early-time series shown at t = 5)")


def equilibrium_norm() -> ProofResult:
    X = sp.Symbol("X", positive=True)
    fmap = q**2 * X + eta**2 * G**2 / X
    xs = sp.sqrt(eta**2 * G**2 / (1 - q**2))
    fixed = sp.simplify(fmap.subs(X, xs) - xs)
    slope = sp.simplify(sp.diff(fmap, X).subs(X, xs) - (2 * q**2 - 1))
    # |2q^2 - 1| < 1  <=>  0 < q^2 < 1
    Q = sp.Symbol("Q", positive=True)  # Q = q^2
    stable = sp.solve_univariate_inequality(sp.Abs(2 * Q - 1) < 1, Q, relational=False)
    ratio = sp.simplify((xs**2 * 2 * d / (eta**2 * G**2)).subs(q, 1 - d) - 1 / (1 - d / 2))
    tau = -1 / sp.log(2 * (1 - d) ** 2 - 1)
    tau_series = sp.series(tau, d, 0, 1).removeO()
    tau_ok = is_zero(sp.simplify(tau_series - (1 / (4 * d) - sp.Rational(3, 8))))
    ok = is_zero(fixed) and is_zero(slope) and stable == sp.Interval.open(0, 1) and is_zero(ratio) and tau_ok
    return ProofResult("dynamics.equilibrium_norm",
                       "x*^2 = eta^2 G^2/(1-q^2) is the fixed point of x -> q^2 x + eta^2 G^2/x; slope 2q^2-1, stable "
                       "iff 0 < q^2 < 1; x*^2 2d/(eta^2 G^2) = 1/(1-d/2); tau = 1/(4d) - 3/8 + O(d)",
                       ok, f"f(x*)-x* = {fixed}; f'(x*)-(2q^2-1) = {slope}; stable q^2 in {stable}; ratio residual "
                       f"{ratio}; tau series {tau_series}", "symbolic q, eta, G, d")


def _decoupled_moments() -> dict[str, sp.Expr]:
    """Stationary E||W||^2, E<W_t, v_(t-1)>, E||v||^2 for v_t = mu v_(t-1) + g_t, W' = qW - eta v (g uncorrelated)."""
    X, B, C = sp.symbols("X B C")
    eqs = [sp.Eq(C, mu**2 * C + gamma), sp.Eq(B, q * mu * B - eta * C),
           sp.Eq(X, q**2 * X - 2 * eta * q * mu * B + eta**2 * C)]
    return {str(s): v for s, v in sp.solve(eqs, [X, B, C], dict=True)[0].items()}


def _l2_moments() -> dict[str, sp.Expr]:
    """Coupled L2: v_t = mu v_(t-1) + g_t + lam W_t, W' = W - eta v_t; stationary second moments."""
    X, P, C = sp.symbols("X P C")
    eqs = [sp.Eq(C, mu**2 * C + gamma + lam**2 * X + 2 * mu * lam * P), sp.Eq(P, mu * P + lam * X - eta * C),
           sp.Eq(X, X - 2 * eta * (mu * P + lam * X) + eta**2 * C)]
    return {str(s): v for s, v in sp.solve(eqs, [X, P, C], dict=True)[0].items()}


def equilibrium_norm_momentum() -> ProofResult:
    dec = _decoupled_moments()
    k_dec = sp.simplify(dec["X"] / gamma)  # x = k gamma and gamma = G^2/x for a gauge  =>  x^2 = k G^2
    law_dec = eta**2 * (1 + mu * q) / ((1 - mu**2) * (1 - mu * q) * (1 - q**2))
    r1 = sp.simplify(k_dec - law_dec)
    l2 = _l2_moments()
    k_l2 = sp.simplify(l2["X"] / gamma)
    law_l2 = eta * (1 + mu) / (2 * lam * (1 - mu) * ((1 + mu) - eta * lam / 2))
    r2 = sp.simplify(k_l2 - law_l2)
    # AdamW: v = m/s with m_t = b1 m + (1-b1) g: SGD-momentum with mu = b1 and gradient (1-b1) g/s,
    # E||g/s||^2 = nu; the update size does not scale with ||W||, so x* is linear in nu
    b1 = mu
    x_adam = dec["X"].subs(gamma, (1 - b1) ** 2 * nu)
    law_adam = eta**2 * nu * (1 - b1) * (1 + b1 * q) / ((1 + b1) * (1 - b1 * q) * (1 - q**2))
    r3 = sp.simplify(x_adam - law_adam)
    first = sp.simplify(sp.limit(law_adam.subs(q, 1 - eta * lam) * lam / (eta * nu), eta, 0) - sp.Rational(1, 2))
    ok = all(is_zero(e) for e in (r1, r2, r3, first))
    return ProofResult("dynamics.equilibrium_norm_momentum",
                       "stationary moments: x*^2 = eta^2 G^2 (1+mu q)/((1-mu^2)(1-mu q)(1-q^2)) (decoupled); "
                       "eta(1+mu)G^2/(2 lam (1-mu)((1+mu) - eta lam/2)) (L2); AdamW x* = eta^2 nu (1-b1)(1+b1 q)/"
                       "((1+b1)(1-b1 q)(1-q^2)) -> eta nu/(2 lam) (Kosson et al.)",
                       ok, f"decoupled {r1}; l2 {r2}; adamw {r3}; adamw small-eta limit {first}",
                       "symbolic q, mu, eta, lambda, gamma = E||g||^2 (uncorrelated across steps)")


def _heavy_ball_charpoly(l2: sp.Expr, qq: sp.Expr, z: sp.Symbol) -> sp.Expr:
    """Characteristic polynomial of the heavy-ball moment map's Jacobian at its fixed point (dynamics.heavyball)."""
    X, Y, Z, G2 = sp.symbols("X Y Z G2", positive=True)
    P = G2 / X
    Wb = mu * Y + l2 * X
    bb = mu**2 * Z + 2 * mu * l2 * Y + P + l2**2 * X
    F = [qq**2 * X - 2 * eta * qq * Wb + eta**2 * bb, qq * Wb - eta * bb, bb]
    sol = sp.solve([sp.Eq(F[1], Y), sp.Eq(F[2], Z)], [Y, Z], dict=True)[0]
    xs = [r for r in sp.solve(sp.Eq(F[0].subs(sol), X), X) if r.could_extract_minus_sign() is False]
    J = sp.Matrix(F).jacobian([X, Y, Z]).subs(sol).subs(X, xs[0])
    return sp.expand(sp.simplify(J.charpoly(z).as_expr()))


def relaxation_momentum() -> ProofResult:
    z, eps, w = sp.Symbol("z"), sp.Symbol("epsilon", positive=True), sp.Symbol("w", positive=True)
    e = eta * lam
    l2 = _heavy_ball_charpoly(lam, sp.Integer(1), z) - sp.expand(
        (z - mu**2) * (z**2 - (1 + mu - 4 * e + 2 * e**2 / (1 + mu)) * z + mu))
    B = (1 + mu**2 * q**2 - 2 * mu**2 - 2 * mu * q - 2 * q**2) / (1 + mu * q)
    dec = _heavy_ball_charpoly(sp.Integer(0), q, z) - sp.expand((z - mu**2 * q**2) * (z**2 + B * z + mu * q))
    s = (1 + mu - 4 * eps + 2 * eps**2 / (1 + mu)).subs(mu, 1 - w)  # mu = 1 - w, 0 < w: sqrt((1-mu)^2) = 1 - mu
    slow = sp.series((s + sp.sqrt(s**2 - 4 * (1 - w))) / 2, eps, 0, 2).removeO()
    r3 = sp.simplify(slow - (1 - 4 * eps / w))
    ok = all(is_zero(sp.simplify(r)) for r in (l2, dec, r3))
    return ProofResult("dynamics.relaxation_momentum",
                       "heavy ball: charpoly (z - mu^2)(z^2 - (1+mu-4e+2e^2/(1+mu)) z + mu) (L2, e = eta lam) and "
                       "(z - mu^2 q^2)(z^2 + B z + mu q) (decoupled); slow root 1 - 4e/(1-mu) + O(e^2)",
                       ok, f"l2 {sp.simplify(l2)}; decoupled {sp.simplify(dec)}; slow-root series {r3}",
                       "symbolic q, mu, eta, lambda, G (random-walk second moments, mean field)")


def equilibrium_angle() -> ProofResult:
    w, g = sp.symbols("w g_norm", positive=True)
    W = sp.Matrix([w, 0])
    gv = sp.Matrix([0, g])  # tangent gradient
    Wn = q * W - eta * gv
    stationary = {g: sp.sqrt(1 - q**2) * w / eta}  # ||W'|| = ||W||  <=>  eta^2 g^2 = (1 - q^2) w^2
    cos_phi = sp.simplify((W.dot(Wn) / (W.norm() * Wn.norm())).subs(stationary))
    tan_phi = sp.simplify((eta * g / (q * w)).subs(stationary))
    r1 = sp.simplify(cos_phi - q)
    r2 = sp.simplify(tan_phi - sp.sqrt(1 - q**2) / q)
    series = sp.series(sp.acos(1 - d) / sp.sqrt(2 * d), d, 0, 2).removeO()
    r3 = sp.simplify(series - (1 + d / 12))
    ok = is_zero(r1) and is_zero(r2) and is_zero(r3)
    return ProofResult("dynamics.equilibrium_angle",
                       "SGD, g tangent, stationary norm: cos(phi*) = q = 1-d exactly, tan(phi*) = sqrt(1-q^2)/q; "
                       "arccos(1-d) = sqrt(2d)(1 + d/12 + O(d^2)): the published sqrt(2d) undershoots by d/12",
                       ok, f"cos - q = {r1}; tan residual {r2}; series residual {r3}", "symbolic q, eta, ||W||, d")


def equilibrium_angle_momentum() -> ProofResult:
    dec = _decoupled_moments()
    rho_dec = sp.simplify((q * dec["X"] - eta * mu * dec["B"]) / dec["X"])  # E<W_t, W_t+1>/E x
    r1 = sp.simplify(rho_dec - (q + mu) / (1 + mu * q))
    l2 = _l2_moments()
    rho_l2 = sp.simplify((l2["X"] - eta * (mu * l2["P"] + lam * l2["X"])) / l2["X"])
    r2 = sp.simplify(rho_l2 - (1 - eta * lam / (1 + mu)))
    one_minus = sp.simplify((1 - (q + mu) / (1 + mu * q)).subs(q, 1 - d))
    lead = sp.simplify(sp.limit(one_minus / d, d, 0) - (1 - mu) / (1 + mu))  # 2(1-rho) ~ phi^2 = 2d(1-mu)/(1+mu)
    ok = is_zero(r1) and is_zero(r2) and is_zero(lead)
    return ProofResult("dynamics.equilibrium_angle_momentum",
                       "E<W,W'>/E||W||^2 = (q+mu)/(1+mu q) (decoupled; AdamW mu = b1), 1 - eta lam/(1+mu) (L2); "
                       "first order: phi* ~ sqrt(2d(1-mu)/(1+mu)) (Kosson et al.), sqrt(2 eta lam/(1+mu)) (Wan et al.)",
                       ok, f"decoupled {r1}; l2 {r2}; (1-rho)/d -> (1-mu)/(1+mu) residual {lead}",
                       "symbolic q, mu, eta, lambda, gamma (gradients uncorrelated across steps)")


def angular_rate_scaling() -> ProofResult:
    w, g, c, eps = sp.symbols("w g_norm c epsilon", positive=True)
    Wn = q * sp.Matrix([w, 0]) - eta * sp.Matrix([0, g])  # one step from W = (w, 0) along the tangent g = (0, g)
    tan_phi = sp.simplify(-Wn[1] / Wn[0])  # angle of W' from W in the (W, g) plane
    r1 = sp.simplify(tan_phi - eta * g / (q * w))
    tan_c = tan_phi.subs({w: c * w, g: g / c})  # ||cW|| = c||W||, ||g(cW)|| = ||g||/c
    r2 = sp.simplify(tan_c - tan_phi / c**2)
    expo = sp.simplify(sp.diff(sp.log(tan_c), c) * c)
    # Adam's first step per coordinate: u = g/(|g| + c eps) at scale c (g -> g/c); eps -> 0: scale-free
    u_c = (g / c) / (g / c + eps)
    tan_adam = eta * sp.limit(u_c, eps, 0) / (q * c * w)
    expo_adam = sp.simplify(sp.diff(sp.log(tan_adam), c) * c)
    ok = is_zero(r1) and is_zero(r2) and is_zero(expo + 2) and is_zero(expo_adam + 1)
    return ProofResult("dynamics.angular_rate_scaling",
                       "tan(phi) = eta ||g||/(q ||W||) exactly; tan(phi(c)) = tan(phi(1))/c^2 (exponent -2, not the "
                       "text's 1/||W||); Adam's scale-free first step (eps -> 0): exponent -1",
                       ok, f"tan residual {r1}; scaling residual {r2}; d ln tan/d ln c = {expo}; Adam {expo_adam}",
                       "the 2-D plane spanned by W and the tangent g (the step never leaves it); symbolic c > 0")


PROOFS = {  # name -> proof, in name order (the order they run and print)
    "dynamics.angular_rate_scaling": angular_rate_scaling,
    "dynamics.equilibrium_angle": equilibrium_angle,
    "dynamics.equilibrium_angle_momentum": equilibrium_angle_momentum,
    "dynamics.equilibrium_norm": equilibrium_norm,
    "dynamics.equilibrium_norm_momentum": equilibrium_norm_momentum,
    "dynamics.gradient_scaling": gradient_scaling,
    "dynamics.norm_identity": norm_identity,
    "dynamics.norm_identity_first_order": norm_identity_first_order,
    "dynamics.relaxation_momentum": relaxation_momentum,
    "dynamics.trajectory_tracking": trajectory_tracking,
}
