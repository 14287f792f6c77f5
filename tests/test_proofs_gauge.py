"""The gauge proofs: each holds, and the proof machinery rejects near-miss identities."""

from __future__ import annotations

import pytest
import sympy as sp

from proofs import PROOFS, run_proofs
from proofs import gauge_identities as gi
from proofs.core import is_zero

GAUGE = sorted(name for name in PROOFS if name.startswith("gauge."))


def test_gauge_proofs_registered():
    for name in ("gauge.forward_invariance", "gauge.forward_sign_flip", "gauge.euler_radial_gradient",
                 "gauge.jacobian_null_space", "gauge.jacobian_closed_form", "gauge.epsilon_breaking"):
        assert name in GAUGE


@pytest.mark.parametrize("name", GAUGE)
def test_gauge_proof_holds(name):
    result = PROOFS[name]()
    assert result.holds, str(result)
    assert result.id.startswith("gauge.") and result.dimension


def test_run_proofs_prefix_returns_only_gauge():
    assert all(r.id.startswith("gauge.") for r in run_proofs("gauge.forward"))


def test_wrong_scaling_law_is_not_proved():
    # RMSNorm(cz) = c RMSNorm(z) is false for c != 1: the same machinery must refuse it
    lhs = gi._c * gi._z[gi._j] / gi._rms(sp.Sum((gi._c * gi._z[gi._i]) ** 2, (gi._i, 1, gi._n)))
    assert not is_zero(lhs - gi._c * gi._z[gi._j] / gi._rms(gi._sum_sq()))


def test_wrong_first_order_coefficient_is_not_proved():
    r, m = gi._eps_ratio()
    wrong = sp.series(r, gi._eps, 0, 2).removeO() - 1 - gi._eps / m * (1 - 1 / gi._c**2)  # missing the 1/2
    assert not is_zero(wrong)


def test_eps_breaks_the_composite_euler_identity():
    # with eps > 0 the radial coefficient is (eps/rho^2) y, not 0
    ws, ys, _ = gi._composite()
    coeff = sum(w * sp.diff(ys[0], w) for w in ws)
    assert not is_zero(coeff)
    assert is_zero(coeff.subs(gi._eps, 0))
