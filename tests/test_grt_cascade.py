"""The rotation cascade's structural claims: det > 0, length preservation, Jacobians, mixing.

Claims ``grt.det_positive``, ``grt.length_preservation``, ``grt.jacobian`` (cascade part), ``grt.mixing``.
Exactness is checked in float64 with tolerances from ``rmsgauge.tolerance``.
"""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from grt_model import RotationCascade, butterfly_pairs, materialize, reference_cascade
from grt_model.butterfly import n_strides
from grt_model.cascade import UNIT_RAW_SCALE
from grt_model.claims.tools import flat_jacobian, gradcheck, mixing_profile, unit_scale_cascade
from rmsgauge import assert_close, tolerance

F64 = torch.float64
widths = st.sampled_from([2, 4, 8, 16, 32])
seeds = st.integers(0, 2**16)
CLEARLY_NONZERO = 1e3  # a structural nonzero must exceed the round-off tolerance by three orders of magnitude


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randomize(c: RotationCascade, seed: int, scale_std: float, coupling_std: float = 0.02) -> RotationCascade:
    g = _gen(seed)
    with torch.no_grad():
        c.angles.copy_((torch.rand(c.angles.shape, generator=g, dtype=F64) * 2 - 1) * math.pi)
        c.raw_scales.copy_(UNIT_RAW_SCALE + scale_std * torch.randn(c.raw_scales.shape, generator=g, dtype=F64))
        if c.coupling is not None:
            c.coupling.copy_(coupling_std * torch.randn(c.coupling.shape, generator=g, dtype=F64))
    return c


# ------------------------------------------------------------------------------------- grt.det_positive


@given(widths, st.integers(1, 8), st.integers(1, 3), seeds, st.floats(0.0, 2.0, allow_nan=False,
                                                                      allow_infinity=False))
def test_det_positive(width, stages, heads, seed, scale_std):
    c = _randomize(RotationCascade(width, stages, coupling=False, heads=heads, dtype=F64), seed, scale_std)
    with torch.no_grad():
        sign, logabs = torch.linalg.slogdet(materialize(c))  # (H,)
        predicted = torch.log(c.scales()).sum(dim=(1, 2, 3))  # sum over stages and pairs of log(s0 s1)
    assert bool((sign > 0).all()), f"det sign {sign.tolist()} (never a reflection)"
    assert_close(logabs, predicted, dtype=F64, size=width, depth=stages, scale=max(1.0, float(predicted.abs().max())),
                 what="log det vs sum log(s0 s1)")
    assert_close(c.log_det(), predicted, dtype=F64, size=width, depth=stages, what="log_det()")


@given(st.floats(-3, 3, allow_nan=False, allow_infinity=False), st.floats(-3, 3, allow_nan=False,
                                                                          allow_infinity=False),
       st.floats(-math.pi, math.pi, allow_nan=False, allow_infinity=False),
       st.floats(0.1, 10, allow_nan=False, allow_infinity=False), st.floats(0.2, 3, allow_nan=False,
                                                                             allow_infinity=False))
def test_det_positive_needs_coupling_off(w1, w2, phi, r, s):
    """One coupled pair: det J = s0 s1 (1 + sech^2(u)(w2 cos phi - w1 sin phi)) (proofs: grt.coupled_stage_det),
    so with coupling on the Jacobian determinant is NOT always positive."""
    c = RotationCascade(2, 1, coupling=True, dtype=F64)
    with torch.no_grad():
        c.angles.fill_(0.3)
        c.raw_scales.fill_(math.log(math.expm1(s)))  # s0 = s1 = s
        c.coupling.zero_()
        c.coupling[0, 0, 1, 0], c.coupling[0, 0, 2, 0] = w1, w2  # rows P+p, 2P+p: the x0, x1 features of pair 0
    x = torch.tensor([r * math.cos(phi), r * math.sin(phi)], dtype=F64)
    det = float(torch.linalg.det(flat_jacobian(c, x)))
    u = w1 * math.cos(phi) + w2 * math.sin(phi)
    expected = s * s * (1 + (1 - math.tanh(u) ** 2) * (w2 * math.cos(phi) - w1 * math.sin(phi)))
    assert abs(det - expected) <= tolerance(F64, size=4, depth=4, scale=s * s * (1 + abs(w1) + abs(w2))).atol


def test_det_positive_coupled_witness():
    c = RotationCascade(2, 1, coupling=True, dtype=F64)
    with torch.no_grad():
        c.angles.zero_()
        c.coupling.zero_()
        c.coupling[0, 0, 2, 0] = 5.0
    det = float(torch.linalg.det(flat_jacobian(c, torch.tensor([-1.0, 0.0], dtype=F64))))
    assert abs(det + 4.0) <= tolerance(F64, size=4, scale=4.0).atol  # 1 + 5 cos(pi) = -4


# ------------------------------------------------------------------------------ grt.length_preservation


@given(widths, st.integers(1, 8), st.integers(1, 3), st.booleans(), seeds,
       st.floats(0.0, 3.0, allow_nan=False, allow_infinity=False), st.floats(-3, 3, allow_nan=False,
                                                                             allow_infinity=False))
def test_length_preservation(width, stages, heads, coupling, seed, coupling_std, log10_scale):
    c = unit_scale_cascade(width, stages, coupling, heads, coupling_std=coupling_std)
    with torch.no_grad():
        c.angles.copy_((torch.rand(c.angles.shape, generator=_gen(seed), dtype=F64) * 2 - 1) * math.pi)
    x = torch.randn(5, heads * width, generator=_gen(seed + 1), dtype=F64) * 10**log10_scale
    y = c(x).view(5, heads, width)
    n_in = torch.linalg.vector_norm(x.view(5, heads, width), dim=-1)
    assert_close(torch.linalg.vector_norm(y, dim=-1), n_in, dtype=F64, size=width, depth=stages,
                 what="per-head norm at unit scales")
    if not coupling:
        M = materialize(c)  # (H, d, d)
        eye = torch.eye(width, dtype=F64).expand_as(M)
        assert_close(M.transpose(-1, -2) @ M, eye, dtype=F64, size=width, depth=stages, scale=1.0, what="M^T M")
        sign, logabs = torch.linalg.slogdet(M)
        assert bool((sign > 0).all()), "coupling off, unit scales: in SO(d), never a reflection"
        assert_close(logabs, torch.zeros_like(logabs), dtype=F64, size=width, depth=stages, scale=1.0)


@given(widths, st.integers(1, 6), st.booleans(), seeds, st.floats(0.05, 1.5, allow_nan=False,
                                                                   allow_infinity=False))
def test_length_preservation_scale_bounds(width, stages, coupling, seed, scale_std):
    """prod_s min s <= ||C x|| / ||x|| <= prod_s max s (coupling on too); coupling off: the singular values."""
    c = _randomize(RotationCascade(width, stages, coupling=coupling, dtype=F64), seed, scale_std, coupling_std=0.5)
    s = c.scales().detach()[0]  # (S, P, 2)
    lo, hi = float(s.amin(dim=(1, 2)).prod()), float(s.amax(dim=(1, 2)).prod())
    tol = tolerance(F64, size=width, depth=stages)
    x = torch.randn(16, width, generator=_gen(seed + 7), dtype=F64)
    with torch.no_grad():
        ratio = torch.linalg.vector_norm(c(x), dim=-1) / torch.linalg.vector_norm(x, dim=-1)
    assert float(ratio.min()) >= lo * (1 - tol.rtol) and float(ratio.max()) <= hi * (1 + tol.rtol)
    if not coupling:
        with torch.no_grad():
            sv = torch.linalg.svdvals(materialize(c)[0])
        assert float(sv[-1]) >= lo * (1 - tol.rtol) and float(sv[0]) <= hi * (1 + tol.rtol)


# ------------------------------------------------------------------------------ grt.jacobian (cascade)


@given(st.sampled_from([2, 4, 8]), st.integers(1, 3), st.integers(1, 2), st.booleans(), st.integers(0, 4), seeds)
def test_jacobian(width, stages, heads, coupling, first_stage, seed):
    """gradcheck (float64) of the fast cascade w.r.t. its input and every parameter."""
    c = _randomize(RotationCascade(width, stages, coupling=coupling, heads=heads, first_stage=first_stage,
                                   dtype=F64), seed, 0.5, coupling_std=0.5)
    x = torch.randn(2, heads * width, generator=_gen(seed + 1), dtype=F64, requires_grad=True)
    params = [p for p in (c.angles, c.raw_scales, c.coupling) if p is not None]

    def fn(x, *ps):
        return torch.func.functional_call(c, dict(zip(["angles", "raw_scales", "coupling"], ps)), (x,))

    assert gradcheck(fn, (x, *params), size=width, depth=stages)


@given(widths, st.integers(1, 6), seeds)
def test_jacobian_coupling_off_is_the_linear_map(width, stages, seed):
    c = _randomize(RotationCascade(width, stages, coupling=False, dtype=F64), seed, 0.5)
    x = torch.randn(width, generator=_gen(seed + 1), dtype=F64)
    assert_close(flat_jacobian(c, x), materialize(c)[0], dtype=F64, size=width, depth=stages, scale=1.0,
                 what="Jacobian vs materialized matrix")


@given(st.sampled_from([8, 16, 32]), st.integers(2, 6), seeds)
def test_jacobian_coupling_on_not_orthogonal(width, stages, seed):
    """Unit scales: the coupled map preserves lengths but its Jacobian is not orthogonal (W != 0);
    with W = 0 it is (the control that makes this test able to fail)."""
    c = unit_scale_cascade(width, stages, True, coupling_std=0.02)
    x = torch.randn(width, generator=_gen(seed), dtype=F64)
    J = flat_jacobian(c, x)
    eye = torch.eye(width, dtype=F64)
    tol = tolerance(F64, size=width, depth=stages)
    dev = float(torch.linalg.matrix_norm(J.T @ J - eye, 2))
    assert dev > CLEARLY_NONZERO * tol.atol, f"coupled Jacobian unexpectedly orthogonal (||J^T J - I|| = {dev:.3g})"
    with torch.no_grad():
        c.coupling.zero_()
    J0 = flat_jacobian(c, x)
    assert_close(J0.T @ J0, eye, dtype=F64, size=width, depth=stages, scale=1.0, what="W = 0: orthogonal")


@given(st.sampled_from([2, 4, 8, 16]), st.integers(1, 4), st.integers(1, 3), st.booleans(), st.integers(0, 5), seeds)
def test_fast_matches_reference(width, stages, heads, coupling, first_stage, seed):
    """The vectorized cascade equals the explicit Givens/scale-matrix reference in value and gradient."""
    c = _randomize(RotationCascade(width, stages, coupling=coupling, heads=heads, first_stage=first_stage,
                                   dtype=F64), seed, 0.5, coupling_std=0.5)
    x = torch.randn(3, heads * width, generator=_gen(seed + 1), dtype=F64, requires_grad=True)
    y, y_ref = c(x), reference_cascade(c, x)
    assert_close(y, y_ref, dtype=F64, size=width, depth=stages, what="fast vs reference value")
    w = torch.randn(y.shape, generator=_gen(seed + 2), dtype=F64)
    params = [x] + [p for p in (c.angles, c.raw_scales, c.coupling) if p is not None]
    g = torch.autograd.grad((y * w).sum(), params)
    g_ref = torch.autograd.grad((y_ref * w).sum(), params)
    for a, b in zip(g, g_ref):
        assert_close(a, b, dtype=F64, size=width * heads, depth=2 * stages, what="fast vs reference gradient")


# ------------------------------------------------------------------------------------------- grt.mixing


def _reach_sets(width: int, k: int) -> list[set[int]]:
    """Which inputs each output can depend on after stages 0..k-1, from the written pair lists alone."""
    reach = [{i} for i in range(width)]
    for s in range(k):
        new = [set(r) for r in reach]
        for i0, i1 in butterfly_pairs(width, s):
            new[i0] = new[i1] = reach[i0] | reach[i1]
        reach = new
    return reach


@given(st.sampled_from([4, 8, 16, 32, 64]), seeds)
def test_mixing(width, seed):
    """Coupling off: after k <= log2 d stages each output depends on exactly 2^k inputs (the aligned block
    containing it); every output depends on every input after exactly log2 d stages, and not before."""
    torch.manual_seed(seed)
    L = n_strides(width)
    assert mixing_profile(width, L) == [2**k for k in range(1, L + 1)]
    c = _randomize(RotationCascade(width, L, coupling=False, dtype=F64), seed, 0.3)
    tol = tolerance(F64, size=width, depth=L)
    for k in range(1, L + 1):
        sub = RotationCascade(width, k, coupling=False, dtype=F64)
        with torch.no_grad():
            sub.angles.copy_(c.angles[:, :k])
            sub.raw_scales.copy_(c.raw_scales[:, :k])
            M = materialize(sub)[0]
        structural = _reach_sets(width, k)
        for i in range(width):
            block = set(range(i - i % 2**k, i - i % 2**k + 2**k))
            assert structural[i] == block
            # exact zeros outside the block (no dependence at all), whatever the angles
            outside = [j for j in range(width) if j not in block]
            assert all(float(M[i, j]) == 0.0 for j in outside)
        assert (k == L) == bool((M.abs() > tol.atol).all()), f"full dependence must appear at stage {L}, not {k}"


def test_mixing_wiring_written_out():
    assert [butterfly_pairs(4, s) for s in range(3)] == [[(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]]
    assert butterfly_pairs(16, 2) == [(0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15)]
    assert butterfly_pairs(64, 5)[:3] == [(0, 32), (1, 33), (2, 34)]
    assert butterfly_pairs(64, 6) == butterfly_pairs(64, 0)  # the strides cycle
    # the reference config's strides: Q/K/V/O (width 64, 11 stages) and the FFN (width 1024, 21 stages)
    assert RotationCascade(64, 11).strides() == [1, 2, 4, 8, 16, 32, 1, 2, 4, 8, 16]
    assert RotationCascade(1024, 21, coupling=False).strides()[-1] == 1  # RadialGELU's adjacent pairs


def test_mixing_coupling_on_reaches_everything_in_one_stage():
    """With coupling on, one stage already makes every output depend on every input (through W and the
    token-wide feature normalization) -- only through the angles, so rank <= P of that part."""
    c = RotationCascade(16, 1, coupling=True, dtype=F64)
    J = flat_jacobian(c, torch.randn(16, dtype=F64))
    assert bool((J != 0).all())
    with torch.no_grad():
        c.coupling.zero_()
    J0 = flat_jacobian(c, torch.randn(16, dtype=F64))
    assert int((J0 != 0).sum(dim=1).max()) == 2
