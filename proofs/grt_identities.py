r"""Symbolic (sympy) identities behind the GRT's structural claims (``grt.*``).

Source: ``../shared/seeds/001_cfb910613b442095.txt``.  One proof per identity:

* ``grt.det_positive`` -- a stage's per-pair map :math:`M = \mathrm{diag}(s_0, s_1)R(\theta)` has
  :math:`\det M = s_0 s_1` (symbolic :math:`\theta, s_0, s_1`).
* ``grt.length_preservation`` -- with unit scales :math:`R^\top R = I` and :math:`\lVert Rx\rVert = \lVert x\rVert`.
* ``grt.clifford_features`` -- with :math:`x = r(\cos\varphi, \sin\varphi)`,
  :math:`x' = r'(\cos\varphi', \sin\varphi')`: signed area :math:`x_0x_1' - x_1x_0' = r r'\sin(\varphi'-\varphi)`
  and energy :math:`x_0^2+x_1^2 = r^2`.
* ``grt.butterfly_permutation`` -- every stage's pairing is a permutation (:math:`\Pi^\top\Pi = I`) and the
  stage's rotation :math:`\Pi^\top \mathrm{blockdiag}(R(\theta_p))\,\Pi` is orthogonal with det 1, with
  symbolic angles.  Concrete :math:`d \in \{4, 8, 16\}` and every stride of each: the wiring is a bit
  pattern (:math:`i \leftrightarrow i \oplus 2^k`), not an expression in a symbolic :math:`d`; these sizes
  cover strides 1 to 8 and the cycling back to stride 1; larger widths are property-tested.
* ``grt.radial_gelu_angle`` -- :math:`y = \Phi(r)\,x` is parallel to :math:`x` (cross product 0), points the
  same way (:math:`y\cdot x = \Phi(r) r^2`, and :math:`\Phi(r) = \tfrac12(1+\operatorname{erf}(r/\sqrt2)) > 0`
  because :math:`\operatorname{erf} > -1` on :math:`\mathbb R`), and has radius
  :math:`r\Phi(r) = \operatorname{GELU}(r)`.
* ``grt.pearlnorm_invariance`` -- :math:`\operatorname{PearlNorm}(cx) = \operatorname{PearlNorm}(x)` for
  :math:`c > 0` and Euler's :math:`J(x)\,x = 0` (symbolic :math:`d = 4`, gain symbolic).
* ``grt.residual_det_sign`` -- the engine of the negative-determinant witness: for :math:`v^\top u = 1`,
  :math:`\det(I + a(I - uv^\top)) = (1+a)^{d-1}` (symbolic :math:`d = 4`; the matrix determinant lemma gives it
  for every :math:`d`).  With :math:`a = -g/\mu` (mixer angle :math:`\pi`) this is :math:`(1-g/\mu)^{d-1} < 0`
  for even :math:`d` and :math:`\mu < g`.
* ``grt.coupled_stage_det`` -- why "det > 0" needs coupling off: one pair (:math:`P = 1`) with coupling
  :math:`\Delta\theta = \tanh(w_0 + w_1 x_0/r + w_2 x_1/r)`: the Jacobian determinant is
  :math:`s_0 s_1\,(1 + \operatorname{sech}^2(u)\,(w_2\cos\varphi - w_1\sin\varphi))`, negative e.g. at
  :math:`w_2 = 5, \varphi = \pi`.
"""

from __future__ import annotations

import sympy as sp

from proofs.core import ProofResult, is_zero


def _rot(theta: sp.Expr) -> sp.Matrix:
    return sp.Matrix([[sp.cos(theta), -sp.sin(theta)], [sp.sin(theta), sp.cos(theta)]])


def _all_zero(M: sp.Matrix) -> tuple[bool, str]:
    S = M.applyfunc(sp.simplify)
    return all(is_zero(e) for e in S), str(S.tolist())


def det_positive() -> ProofResult:
    theta = sp.symbols("theta", real=True)
    s0, s1 = sp.symbols("s0 s1", positive=True)
    M = sp.diag(s0, s1) * _rot(theta)
    res = sp.simplify(M.det() - s0 * s1)
    return ProofResult("grt.det_positive", "det(diag(s0, s1) R(theta)) = s0 s1 > 0", is_zero(res), str(res),
                       "symbolic theta, s0 > 0, s1 > 0 (one pair; a stage is block-diagonal, so its det is the "
                       "product)")


def length_preservation() -> ProofResult:
    theta, x0, x1 = sp.symbols("theta x0 x1", real=True)
    R = _rot(theta)
    ok1, r1 = _all_zero(R.T * R - sp.eye(2))
    y = R * sp.Matrix([x0, x1])
    res2 = sp.simplify(y.dot(y) - (x0**2 + x1**2))
    return ProofResult("grt.length_preservation", "unit scales: R^T R = I and ||R x||^2 = ||x||^2",
                       ok1 and is_zero(res2), f"R^T R - I = {r1}; norm residual {res2}", "symbolic theta, x")


def clifford_features() -> ProofResult:
    r, rp = sp.symbols("r r_next", nonnegative=True)
    phi, phip = sp.symbols("phi phi_next", real=True)
    x0, x1 = r * sp.cos(phi), r * sp.sin(phi)
    y0, y1 = rp * sp.cos(phip), rp * sp.sin(phip)
    area = sp.simplify(sp.expand_trig(x0 * y1 - x1 * y0 - r * rp * sp.sin(phip - phi)))
    energy = sp.simplify(x0**2 + x1**2 - r**2)
    return ProofResult("grt.clifford_features",
                       "signed area x0 x1' - x1 x0' = r r' sin(phi' - phi); energy x0^2 + x1^2 = r^2",
                       is_zero(area) and is_zero(energy), f"area {area}; energy {energy}", "symbolic r, r', phi, phi'")


def butterfly_permutation() -> ProofResult:
    from grt_model.butterfly import butterfly_pairs, n_strides

    residuals = []
    ok = True
    for d in (4, 8, 16):
        P = d // 2
        for stage in range(n_strides(d) + 1):  # every stride, then the cycle back to stride 1
            pairs = butterfly_pairs(d, stage)
            Pi = sp.zeros(d, d)  # row p <- coordinate i0 of pair p; row P + p <- coordinate i1
            for p, (i0, i1) in enumerate(pairs):
                Pi[p, i0] = 1
                Pi[P + p, i1] = 1
            perm_ok = Pi.T * Pi == sp.eye(d) and abs(Pi.det()) == 1
            th = sp.symbols(f"t0:{P}", real=True)
            c = sp.diag(*[sp.cos(t) for t in th])
            s = sp.diag(*[sp.sin(t) for t in th])
            B = sp.Matrix(sp.BlockMatrix([[c, -s], [s, c]]))  # pair p rotates rows (p, P + p)
            G = Pi.T * B * Pi
            pyth = {sp.sin(t) ** 2: 1 - sp.cos(t) ** 2 for t in th}  # sin^2 = 1 - cos^2, then expand

            def reduce(e, pyth=pyth):
                return sp.expand(sp.expand(e).subs(pyth))

            g_ok = (G.T * G - sp.eye(d)).applyfunc(reduce) == sp.zeros(d, d)
            # det G = det(Pi)^2 det B, and for commuting diagonal blocks det [[C, -S], [S, C]] = det(C^2 + S^2)
            # C^2 + S^2 is diagonal: its det is 1 iff every diagonal entry reduces to 1
            det_ok = all(reduce(e) == 1 for e in (c * c + s * s).diagonal()) and Pi.det() ** 2 == 1
            if d == 4:  # and directly, where the full symbolic determinant is cheap
                det_ok = det_ok and reduce(G.det() - 1) == 0
            ok &= bool(perm_ok and g_ok and det_ok)
            residuals.append(f"d={d} stage={stage}: perm={perm_ok} orth={g_ok} det1={det_ok}")
    return ProofResult("grt.butterfly_permutation",
                       "each stage's pairing is a permutation; the stage rotation Pi^T blockdiag(R) Pi is in SO(d)",
                       ok, "; ".join(residuals),
                       "concrete d = 4, 8, 16, every stride (the wiring is a bit pattern, not symbolic in d); "
                       "symbolic angles; det G = det(Pi)^2 det(C^2 + S^2) (commuting blocks), directly at d = 4")


def radial_gelu_angle() -> ProofResult:
    r = sp.symbols("r", positive=True)
    phi = sp.symbols("phi", real=True)
    Phi = (1 + sp.erf(r / sp.sqrt(2))) / 2
    x = sp.Matrix([r * sp.cos(phi), r * sp.sin(phi)])
    y = Phi * x
    cross = sp.simplify(y[0] * x[1] - y[1] * x[0])
    dot = sp.simplify(y.dot(x) - Phi * r**2)
    radius = sp.simplify(y.dot(y) - (r * Phi) ** 2)
    ok = is_zero(cross) and is_zero(dot) and is_zero(radius)
    return ProofResult("grt.radial_gelu_angle",
                       "y = Phi(r) x: cross(y, x) = 0, y.x = Phi(r) r^2 > 0, |y| = r Phi(r) = GELU(r)",
                       ok, f"cross {cross}; dot {dot}; radius^2 {radius}",
                       "symbolic r > 0, phi; Phi(r) > 0 since erf > -1 (at r = 0 the output is 0 = GELU(0))")


def pearlnorm_invariance() -> ProofResult:
    xs = sp.symbols("x0:4", real=True)
    gs = sp.symbols("g0:4", real=True)
    c = sp.symbols("c", positive=True)

    def pn(v):
        mu = (sp.sqrt(v[0] ** 2 + v[1] ** 2) + sp.sqrt(v[2] ** 2 + v[3] ** 2)) / 2
        return sp.Matrix([v[i] / mu * gs[i] for i in range(4)])

    x = sp.Matrix(xs)
    ok1, r1 = _all_zero(pn(c * x) - pn(x))
    J = pn(x).jacobian(x)
    ok2, r2 = _all_zero(J * x)
    return ProofResult("grt.pearlnorm_invariance",
                       "PearlNorm(c x) = PearlNorm(x) for c > 0 (degree-0 homogeneity) and J(x) x = 0 (Euler)",
                       ok1 and ok2, f"PN(cx) - PN(x) = {r1}; J x = {r2}",
                       "symbolic d = 4 (two pairs), symbolic gain; mu = mean pair radius; the per-pair step "
                       "sqrt((c x0)^2 + (c x1)^2) = c sqrt(x0^2 + x1^2) is the whole argument for any d")


def residual_det_sign() -> ProofResult:
    a = sp.symbols("a", real=True)
    u = sp.symbols("u0:4", real=True)
    v = sp.symbols("v0:4", real=True)
    U = sp.Matrix(u)
    V = sp.Matrix(v)
    # impose v^T u = 1 by solving for u3 (v3 != 0 generically)
    u3 = sp.solve(sp.Eq(V.dot(U), 1), u[3])[0]
    M = (sp.eye(4) + a * (sp.eye(4) - U * V.T)).subs(u[3], u3)
    res = sp.factor(sp.simplify(M.det() - (1 + a) ** 3))
    return ProofResult("grt.residual_det_sign",
                       "v^T u = 1  =>  det(I + a (I - u v^T)) = (1 + a)^(d-1); a = -g/mu gives (1 - g/mu)^(d-1)",
                       is_zero(res), str(res),
                       "symbolic d = 4 (d - 1 = 3 odd, like every even d); the matrix determinant lemma "
                       "det(cI + a u v^T) = c^d (1 + a v^T u / c) gives it for every d")


def coupled_stage_det() -> ProofResult:
    x0, x1, th, w0, w1, w2 = sp.symbols("x0 x1 theta w0 w1 w2", real=True)
    s0, s1 = sp.symbols("s0 s1", positive=True)
    # step 1, any nudge h(x): det d/dx [S R(theta + h(x)) x] = s0 s1 (1 + x0 h_x1 - x1 h_x0) = s0 s1 (1 + dh/dphi)
    h = sp.Function("h")(x0, x1)
    y = sp.diag(s0, s1) * _rot(th + h) * sp.Matrix([x0, x1])
    res1 = sp.simplify(y.jacobian([x0, x1]).det() - s0 * s1 * (1 + x0 * sp.diff(h, x1) - x1 * sp.diff(h, x0)))
    # step 2, the GRT nudge at P = 1 (m = r^2; features (1, x0/r, x1/r, 0)): dh/dphi = sech^2(u) (w2 x0 - w1 x1)/r
    r = sp.sqrt(x0**2 + x1**2)
    u = w0 + w1 * x0 / r + w2 * x1 / r
    hh = sp.tanh(u)
    res2 = sp.simplify(x0 * sp.diff(hh, x1) - x1 * sp.diff(hh, x0) - (1 - sp.tanh(u) ** 2) * (w2 * x0 - w1 * x1) / r)
    # a negative value: w = (0, 0, 5), x = (-1, 0): u = 0, det = 1 + 1 * (5 * (-1)) = -4
    neg = sp.nsimplify((s0 * s1 * (1 + (1 - sp.tanh(u) ** 2) * (w2 * x0 - w1 * x1) / r)).subs(
        {s0: 1, s1: 1, w0: 0, w1: 0, w2: 5, x0: -1, x1: 0}))
    ok = is_zero(res1) and is_zero(res2) and bool(neg < 0)
    return ProofResult("grt.coupled_stage_det",
                       "coupling on, one pair: det J = s0 s1 (1 + sech^2(u) (w2 cos phi - w1 sin phi)), "
                       f"u = w0 + w1 cos phi + w2 sin phi; at w2 = 5, phi = pi it is {neg} < 0",
                       ok, f"step 1 (any nudge h): {res1}; step 2 (tanh nudge): {res2}",
                       "symbolic x, theta, w, s0, s1 > 0 and an arbitrary nudge function h; P = 1, so the area "
                       "feature is 0 and the energy feature is 1")


PROOFS = {  # name -> proof, in name order (the order they run and print)
    "grt.butterfly_permutation": butterfly_permutation,
    "grt.clifford_features": clifford_features,
    "grt.coupled_stage_det": coupled_stage_det,
    "grt.det_positive": det_positive,
    "grt.length_preservation": length_preservation,
    "grt.pearlnorm_invariance": pearlnorm_invariance,
    "grt.radial_gelu_angle": radial_gelu_angle,
    "grt.residual_det_sign": residual_det_sign,
}
