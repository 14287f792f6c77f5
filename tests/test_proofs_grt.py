"""The GRT's symbolic identities (proofs/grt_identities.py) all prove, and name the claims they support."""

from __future__ import annotations

import pytest

from proofs import PROOFS, run_proofs

GRT_PROOFS = (
    "grt.det_positive",
    "grt.length_preservation",
    "grt.clifford_features",
    "grt.butterfly_permutation",
    "grt.radial_gelu_angle",
    "grt.pearlnorm_invariance",
    "grt.residual_det_sign",
    "grt.coupled_stage_det",
)


def test_grt_proofs_registered():
    assert set(GRT_PROOFS) == {n for n in PROOFS if n.startswith("grt.")}


@pytest.mark.parametrize("name", GRT_PROOFS)
def test_grt_proof_holds(name):
    r = PROOFS[name]()
    assert r.id == name
    assert r.holds is True, f"{name} not proved: residual {r.residual}"
    assert r.dimension  # says symbolic or which concrete sizes, and why


def test_run_proofs_prefix_selects_grt():
    names = [r.id for r in run_proofs("grt.det_positive")]
    assert names == ["grt.det_positive"]
