r"""Symbolic proofs of the RMSNorm scale-gauge identities (``python -m proofs --only gauge.``).

Notation: :math:`z \in \mathbb{R}^n`, :math:`m = \frac1n\sum_i z_i^2`, :math:`\rho = \sqrt{m + \epsilon}`,
:math:`\operatorname{RMSNorm}_\epsilon(z) = z/\rho` (the gain :math:`\gamma` multiplies after and
changes none of the statements; Zhang & Sennrich 2019, arXiv:1910.07467).

Where sympy can carry a symbolic dimension (``Sum`` over ``IndexedBase`` with symbolic
``n``, ``D``) we use it: forward invariance, the sign flip, ``J(z) z``, the exact eps
ratio and the linearity lemma of ``z = x W^T``.  Two statements need concrete sizes,
because sympy cannot differentiate an undefined function of a symbolic number of
arguments: Euler's theorem for a generic degree-0 function (``n = 3``) and the
composite "loss of RMSNorm(x W^T)" (2 tokens, input width 2, head width 2: the
smallest case with several rows sharing one ``W``, which is where the per-row
factors :math:`\epsilon/\rho_r^2` differ).
"""

from __future__ import annotations

import sympy as sp

from proofs.core import ProofResult, is_zero

_n = sp.Symbol("n", positive=True, integer=True)
_D = sp.Symbol("D", positive=True, integer=True)
_i, _j, _k = sp.symbols("i j k", integer=True, positive=True)
_z = sp.IndexedBase("z", real=True)
_eps = sp.Symbol("epsilon", positive=True)
_c = sp.Symbol("c", positive=True)


def _in_range(expr: sp.Expr) -> sp.Expr:
    """Keep the first branch of every ``Piecewise``.

    ``Sum(... KroneckerDelta(i, j) ...).doit()`` returns ``Piecewise((value, j <= n), (0, True))``;
    every free index here ranges over ``1..n`` (or ``1..D``) by definition, so the first branch is the
    one that applies.  Raises if a ``Piecewise`` has any other shape.
    """

    def first(pw: sp.Piecewise) -> sp.Expr:
        if len(pw.args) != 2 or pw.args[1].cond is not sp.true or not isinstance(pw.args[0].cond, sp.Rel):
            raise ValueError(f"unexpected Piecewise {pw}")
        return pw.args[0].expr

    return expr.replace(lambda e: isinstance(e, sp.Piecewise), first)


def _canonical_sums(expr: sp.Expr, index: sp.Symbol = _i) -> sp.Expr:
    """Rename the dummy index of every single-limit ``Sum`` to ``index`` so equal sums compare equal."""

    def rename(s: sp.Sum) -> sp.Expr:
        if len(s.limits) != 1:
            return s
        var, lo, hi = s.limits[0]
        return sp.Sum(s.function.xreplace({var: index}), (index, lo, hi))

    return expr.replace(lambda e: isinstance(e, sp.Sum), rename)


def _sum_sq(z: sp.Expr | sp.IndexedBase = _z, idx: sp.Symbol = _i) -> sp.Expr:
    return sp.Sum(z[idx] ** 2, (idx, 1, _n))


def _rms(s: sp.Expr, eps: sp.Expr = 0) -> sp.Expr:
    """rho from the sum of squares ``s``."""
    return sp.sqrt(s / _n + eps)


def forward_invariance() -> ProofResult:
    # RMSNorm(cz)_j with the scaled vector written out: the sum of (c z_i)^2, not c^2 times the sum
    lhs = _c * _z[_j] / _rms(sp.Sum((_c * _z[_i]) ** 2, (_i, 1, _n)))
    rhs = _z[_j] / _rms(_sum_sq())
    res = sp.simplify(lhs - rhs)
    return ProofResult("gauge.forward_invariance", "RMSNorm(c z) = RMSNorm(z) for every c > 0 (eps = 0)",
                       is_zero(res), str(res), "symbolic n (Sum over z[i], i = 1..n)")


def forward_sign_flip() -> ProofResult:
    a = sp.Symbol("a", positive=True)  # c = -a < 0
    lhs = -a * _z[_j] / _rms(sp.Sum((-a * _z[_i]) ** 2, (_i, 1, _n)))
    res = sp.simplify(lhs + _z[_j] / _rms(_sum_sq()))
    return ProofResult("gauge.forward_invariance",
                       "RMSNorm(c z) = -RMSNorm(z) for every c < 0 (sign flip; not a gauge)",
                       is_zero(res), str(res), "symbolic n")


def euler_generic() -> ProofResult:
    """Euler for an arbitrary degree-0 function f(W) = F(W / ||W||): sum_i W_i d f / d W_i = 0."""
    w = sp.symbols("w1:4", real=True)
    norm = sp.sqrt(sum(v**2 for v in w))
    F = sp.Function("F")  # arbitrary (undefined) smooth function: every degree-0 f has this form
    f = F(*[v / norm for v in w])
    res = sp.simplify(sum(v * sp.diff(f, v) for v in w))
    return ProofResult("gauge.euler_radial_gradient",
                       "Euler, degree 0: f(cW) = f(W) for c > 0 implies <grad f(W), W> = 0 "
                       "(f = F(W/||W||), F arbitrary)",
                       is_zero(res), str(res), "n = 3 (sympy cannot differentiate F of a symbolic number of arguments)")


def _composite(tokens: int = 2, d_in: int = 2, n: int = 2):
    """Rows y_r = RMSNorm_eps(x_r W^T) of one shared W: returns (W entries, outputs, rho of each output)."""
    x = sp.Matrix(tokens, d_in, lambda a, b: sp.Symbol(f"x{a}{b}", real=True))
    W = sp.Matrix(n, d_in, lambda a, b: sp.Symbol(f"w{a}{b}", real=True))
    Z = x * W.T  # (tokens, n)
    ys, rhos = [], []
    for r in range(tokens):
        rho = sp.sqrt(sum(v**2 for v in Z[r, :]) / n + _eps)
        ys += [v / rho for v in Z[r, :]]
        rhos += [rho] * n
    return list(W), ys, rhos


def euler_composite() -> ProofResult:
    r"""For ANY loss L(y) of y = RMSNorm(x W^T): <grad_W L, W> = sum_k (dL/dy_k) c_k with c_k = sum_ab W_ab dy_k/dW_ab.

    Every c_k simplifies to 0 at eps = 0, so the radial gradient vanishes whatever L is.
    """
    ws, ys, _ = _composite()
    coeffs = [sp.simplify(sum(w * sp.diff(y, w) for w in ws).subs(_eps, 0)) for y in ys]
    bad = [c for c in coeffs if not is_zero(c)]
    return ProofResult("gauge.euler_radial_gradient",
                       "any loss L(RMSNorm(x W^T)), eps = 0: <grad_W L, W> = sum_k dL/dy_k * (W . grad_W y_k) = 0",
                       not bad, str(bad[0] if bad else 0),
                       "2 tokens, input width 2, head width 2 (rows share W; symbolic sizes make sympy's "
                       "derivative of the nested square roots intractable)")


def euler_composite_eps() -> ProofResult:
    ws, ys, rhos = _composite()
    res = [sp.simplify(sum(w * sp.diff(y, w) for w in ws) - _eps / rho**2 * y) for y, rho in zip(ys, rhos)]
    bad = [r for r in res if not is_zero(r)]
    return ProofResult("gauge.epsilon_breaking",
                       "eps > 0: W . grad_W y_k = (eps/rho_r^2) y_k, "
                       "so <grad_W L, W> = eps sum_r <dL/dy_r, y_r>/rho_r^2",
                       not bad, str(bad[0] if bad else 0), "2 tokens, input width 2, head width 2")


def linear_lemma() -> ProofResult:
    """z_k = sum_b x_b W_kb is degree-1 homogeneous in W: sum_{a,b} W_ab dz_k/dW_ab = z_k (carries J z = 0 to W)."""
    a, b, cc = sp.symbols("a b cc", integer=True, positive=True)
    x, W = sp.IndexedBase("x", real=True), sp.IndexedBase("W", real=True)
    zk = sp.Sum(x[b] * W[_k, b], (b, 1, _D))
    inner = _in_range(sp.Sum(W[a, cc] * sp.diff(zk, W[a, cc]), (a, 1, _n)).doit())  # the delta picks row k
    radial = _in_range(sp.Sum(inner, (cc, 1, _D)).doit())
    res = sp.simplify(_canonical_sums(radial, b) - _canonical_sums(zk, b))
    return ProofResult("gauge.euler_radial_gradient", "z = x W^T is linear: sum_{a,b} W_ab dz_k/dW_ab = z_k",
                       is_zero(res), str(res), "symbolic D (input width) and n (output width)")


def _jacobian_entry(eps: sp.Expr) -> sp.Expr:
    """d y_k / d z_j of y = z/rho, differentiated by sympy through the Sum (symbolic n)."""
    yk = _z[_k] / _rms(_sum_sq(), eps)
    return _in_range(sp.diff(yk, _z[_j]).doit())


def jacobian_closed_form() -> ProofResult:
    rho = _rms(_sum_sq(), _eps)
    closed = (sp.KroneckerDelta(_j, _k) - _z[_k] * _z[_j] / (_n * rho**2)) / rho
    res = sp.simplify(_jacobian_entry(_eps) - closed)
    return ProofResult("gauge.jacobian_null_space", "J(z) = (I - z z^T/(n rho^2))/rho, rho^2 = ms(z) + eps",
                       is_zero(res), str(res), "symbolic n")


def jacobian_null_space() -> ProofResult:
    rho = _rms(_sum_sq(), _eps)
    jz = _in_range(sp.Sum(_jacobian_entry(_eps) * _z[_j], (_j, 1, _n)).doit())
    jz = _canonical_sums(jz)  # the Jacobian's sum (dummy i) and the contraction's (dummy j) are one sum
    res_eps = sp.simplify(jz - _eps / rho**3 * _z[_k])
    res0 = sp.simplify(jz.subs(_eps, 0))
    ok = is_zero(res_eps) and is_zero(res0)
    return ProofResult("gauge.jacobian_null_space", "J(z) z = (eps/rho^3) z; = 0 at eps = 0 (backward kills the scale)",
                       ok, f"eps: {res_eps}; eps=0: {res0}", "symbolic n")


def _eps_ratio() -> tuple[sp.Expr, sp.Symbol]:
    m = sp.Symbol("m", positive=True)  # the row mean square, m = S/n
    return _c * sp.sqrt(m + _eps) / sp.sqrt(_c**2 * m + _eps), m


def epsilon_breaking() -> ProofResult:
    """RMSNorm_eps(cz) = r(c) RMSNorm_eps(z) exactly; r - 1 in closed form and to first order in eps."""
    S = _sum_sq()
    scaled = _c * _z[_j] / _rms(sp.Sum((_c * _z[_i]) ** 2, (_i, 1, _n)), _eps)
    base = _z[_j] / _rms(S, _eps)
    r, m = _eps_ratio()
    exact = sp.simplify(scaled - r.subs(m, S / _n) * base)
    stable = sp.simplify(r - 1 - _eps * (_c**2 - 1) / ((_c**2 * m + _eps) * (1 + r)))
    first = sp.simplify(sp.series(r, _eps, 0, 2).removeO() - 1 - _eps / (2 * m) * (1 - 1 / _c**2))
    ok = is_zero(exact) and is_zero(stable) and is_zero(first)
    return ProofResult("gauge.epsilon_breaking",
                       "RMSNorm_eps(cz) = r(c) RMSNorm_eps(z), r = c sqrt(m+eps)/sqrt(c^2 m+eps); "
                       "r - 1 = eps(c^2-1)/((c^2 m+eps)(1+r)) = (eps/2m)(1 - 1/c^2) + O(eps^2)",
                       ok, f"exact: {exact}; stable form: {stable}; first order: {first}", "symbolic n")


def epsilon_break_scale() -> ProofResult:
    """The break scales solve |r(c) - 1| = delta exactly: c^2 = (1 -+ delta)^2 eps / (eps +- m delta (2 -+ delta))."""
    r, m = _eps_ratio()
    delta = sp.Symbol("delta", positive=True)
    res = []
    for s in (-1, 1):
        c2 = (1 + s * delta) ** 2 * _eps / (_eps - s * m * delta * (2 + s * delta))  # the form gauge.laws uses
        res.append(sp.simplify((r**2).subs(_c, sp.sqrt(c2)) - (1 + s * delta) ** 2))  # r^2 avoids sqrt branches
    ok = all(is_zero(x) for x in res)
    return ProofResult("gauge.epsilon_breaking",
                       "r(c_lo) = 1 - delta and r(c_hi) = 1 + delta at "
                       "c^2 = (1 -+ delta)^2 eps/(eps +- m delta (2 -+ delta))",
                       ok, str(res), "symbolic (scalars m, eps, delta)")


PROOFS = {  # name -> proof, in name order (the order they run and print)
    "gauge.epsilon_break_scale": epsilon_break_scale,
    "gauge.epsilon_breaking": epsilon_breaking,
    "gauge.euler_radial_gradient": euler_generic,
    "gauge.euler_radial_gradient_eps": euler_composite_eps,
    "gauge.euler_radial_gradient_loss": euler_composite,
    "gauge.forward_invariance": forward_invariance,
    "gauge.forward_sign_flip": forward_sign_flip,
    "gauge.jacobian_closed_form": jacobian_closed_form,
    "gauge.jacobian_null_space": jacobian_null_space,
    "gauge.linear_lemma": linear_lemma,
}
