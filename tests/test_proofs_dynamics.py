"""The symbolic side of the dynamics claims, and its agreement with the numeric laws in ``dynamics/laws.py``."""

from __future__ import annotations

import math

import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

from dynamics import laws
from proofs import PROOFS, run_proofs
from proofs import dynamics_identities as di
from rmsgauge import tolerance

DYNAMICS_PROOFS = sorted(name for name in PROOFS if name.startswith("dynamics."))
unit = st.floats(0.01, 0.95, allow_nan=False, allow_infinity=False)


@pytest.fixture(scope="module")
def results():
    return {r_name: PROOFS[r_name]() for r_name in DYNAMICS_PROOFS}  # sympy is slow: run each proof once


def test_every_dynamics_claim_has_a_proof(results):
    ids = {r.id for r in results.values()}
    assert {"dynamics.norm_identity", "dynamics.trajectory_tracking", "dynamics.equilibrium_norm",
            "dynamics.equilibrium_angle", "dynamics.angular_rate_scaling"} <= ids
    assert len(run_proofs("dynamics.norm_identity_first")) == 1  # the runner finds them by prefix


@pytest.mark.parametrize("name", DYNAMICS_PROOFS)
def test_proof_holds(results, name):
    r = results[name]
    assert r.holds, f"{r.id}: {r.residual}"


def test_first_order_form_is_not_the_identity():
    x, d, eta, g2 = sp.symbols("x d eta g2", positive=True)
    gap = sp.expand((1 - d) ** 2 * x + eta**2 * g2 - ((1 - 2 * d) * x + eta**2 * g2))
    assert gap == d**2 * x  # nonzero: the source's form is first order


@pytest.fixture(scope="module")
def solved():
    dec, l2 = di._decoupled_moments(), di._l2_moments()
    args = (di.q, di.mu, di.eta, di.lam, di.gamma)
    return {k: sp.lambdify(args, v) for k, v in
            {"dec_x": dec["X"], "dec_b": dec["B"], "l2_x": l2["X"], "l2_p": l2["P"]}.items()}


@given(q=unit, mu=st.floats(0.0, 0.95, allow_nan=False, allow_infinity=False), eta=unit, lam=unit,
       gamma=st.floats(0.1, 10.0, allow_nan=False, allow_infinity=False))
def test_laws_match_the_solved_moments(solved, q, mu, eta, lam, gamma):
    """dynamics/laws.py's closed forms equal sympy's solution of the stationary second-moment system."""
    tol = tolerance("float64", depth=64).rtol  # a few dozen float64 operations on either side
    d = 1 - q
    x = solved["dec_x"](q, mu, eta, lam, gamma)
    # x = k gamma with gamma = G^2/x  =>  x^2 = k G^2: feed G^2 = x gamma to the fixed-point law
    assert float(laws.fixed_point_sgd(eta, d, x * gamma, mu)) == pytest.approx(x, rel=tol)
    rho = (q * x - eta * mu * solved["dec_b"](q, mu, eta, lam, gamma)) / x
    assert laws.equilibrium_cos(d, mu) == pytest.approx(rho, rel=tol)
    if eta * lam < 1:  # the coupled-L2 stationary state exists for eta*lam < 2(1+mu); stay well inside
        xl = solved["l2_x"](q, mu, eta, lam, gamma)
        assert float(laws.fixed_point_l2(eta, lam, xl * gamma, mu)) == pytest.approx(xl, rel=tol)
        pl = solved["l2_p"](q, mu, eta, lam, gamma)
        assert laws.equilibrium_cos_l2(eta, lam, mu) == pytest.approx((xl - eta * (mu * pl + lam * xl)) / xl, rel=tol)


@given(d=st.floats(1e-4, 0.9, allow_nan=False, allow_infinity=False))
def test_relaxation_time_series(d):
    tau = laws.relaxation_time(laws.relaxation_factor(d))
    if d < 0.05:  # the proof's series 1/(4d) - 3/8 + O(d)
        assert tau == pytest.approx(1 / (4 * d) - 3 / 8, abs=2 * d + 1e-9)
    assert math.isfinite(tau) and tau >= 0
