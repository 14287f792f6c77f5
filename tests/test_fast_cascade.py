"""The fused cascade (numba kernels) against the eager path and the explicit-matrix reference, and the rule that
picks between them.

Values and gradients (input and every parameter) agree within the dtype's tolerance
(``rmsgauge.assert_close``: ``16 eps sqrt(size * depth)``, size = the terms a gradient sums, depth = the
stages) over widths, stage counts, heads, coupling on/off, first stages, anisotropic scales, odd token
counts, float32 and float64, and every split of a coupled cascade's stages into kept angle nudges and
recomputed ones; the FFN kernel against the eager pad/expand/RadialGELU/contract/truncate composition, through both
of its backward paths (stage inversion, and storing with checkpoints); which path a module call takes; the
fallback to eager where the kernels are unavailable; the polynomial transcendentals against ``math``; and the
benchmark CLI.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grt_model.cascade import RotationCascade, cascade_eager, reference_cascade
from grt_model.cascade_ops import ffn_eager
from grt_model.kernels import (
    MIN_TOKENS,
    TUNING,
    FusedStats,
    Tuning,
    cascade_fused,
    feed_forward,
    ffn_fused,
    fused_available,
    policy,
    runtime,
    use_kernels,
)
from grt_model.kernels.fused import ffn_active_pairs, pair_tables
from rmsgauge import assert_close, eps_of

needs_numba = pytest.mark.skipif(not fused_available(), reason="numba kernels unavailable")
DTYPES = (torch.float32, torch.float64)


def _cascade(data, dtype, *, max_width_log2=5, coupling=None) -> tuple[RotationCascade, Tuning]:
    width = 2 ** data.draw(st.integers(1, max_width_log2), label="log2 width")
    stages = data.draw(st.integers(1, 6), label="stages")
    heads = data.draw(st.integers(1, 3), label="heads")
    first = data.draw(st.integers(0, 4), label="first_stage")
    cpl = data.draw(st.booleans(), label="coupling") if coupling is None else coupling
    std = data.draw(st.floats(0.0, 0.6, allow_nan=False, allow_infinity=False), label="coupling std")
    c = RotationCascade(width, stages, coupling=cpl, heads=heads, first_stage=first, coupling_init_std=std,
                        dtype=dtype)
    spread = data.draw(st.floats(0.0, 0.4, allow_nan=False, allow_infinity=False), label="raw scale spread")
    with torch.no_grad():  # anisotropic positive scales around 1 (softplus(0.5413) = 1)
        c.raw_scales.add_(torch.randn(c.raw_scales.shape, dtype=dtype) * spread)
    # coupled: keep the nudges of no stage, of some (the budget fits 0..S stages), or of all
    budget = data.draw(st.sampled_from([0, 64, 256, 1 << 20]), label="angle budget")
    return c, Tuning(angle_bytes_per_token=budget)


def _input(data, c: RotationCascade, *lead: int, dtype) -> torch.Tensor:
    """``[*lead, Hin*width]`` with ``Hin`` drawn among the divisors of ``heads`` (shared input heads)."""
    hin = data.draw(st.sampled_from([d for d in range(1, c.heads + 1) if c.heads % d == 0]), label="input heads")
    return torch.randn(*lead, hin * c.width, dtype=dtype)


def _args(c: RotationCascade) -> tuple:
    return c.angles, c.raw_scales, c.coupling, c.width, c.first_stage


def _fused(c: RotationCascade, tuning: Tuning = TUNING, stats: FusedStats | None = None):
    return lambda x: cascade_fused(x, *_args(c), tuning=tuning, stats=stats)


def _eager(c: RotationCascade):
    return lambda x: cascade_eager(x, *_args(c), c.feature_norm)


def _grads(c: RotationCascade, x: torch.Tensor, g: torch.Tensor, fn) -> list[torch.Tensor]:
    xg = x.detach().requires_grad_(True)
    y = fn(xg)
    return [y.detach(), *torch.autograd.grad(y, [xg, *c.parameters()], g)]


def _compare(actual: list[torch.Tensor], expected: list[torch.Tensor], dtype, n_tokens: int, c: RotationCascade,
             what: str) -> None:
    names = ["output", "grad x", *[n for n, _ in c.named_parameters()]]
    for a, e, name in zip(actual, expected, names):
        # a parameter gradient sums n_tokens terms; every value runs through the stages (x heads' features)
        assert_close(a, e, dtype=dtype, size=max(1, n_tokens) * c.width, depth=c.n_stages, what=f"{what}: {name}")


@needs_numba
@given(data=st.data())
def test_fused_matches_eager(data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    c, tuning = _cascade(data, dtype)
    n = data.draw(st.integers(1, 70), label="tokens")
    x = _input(data, c, n, dtype=dtype)
    g = torch.randn(n, c.heads * c.width, dtype=dtype)
    fused_out = _grads(c, x, g, _fused(c, tuning))
    _compare(fused_out, _grads(c, x, g, _eager(c)), dtype, n * c.heads, c, "fused vs eager")


@needs_numba
@given(data=st.data())
def test_fused_matches_reference(data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    c, tuning = _cascade(data, dtype, max_width_log2=4)
    n = data.draw(st.integers(1, 6), label="tokens")
    x = _input(data, c, n, dtype=dtype)
    g = torch.randn(n, c.heads * c.width, dtype=dtype)
    fused_out = _grads(c, x, g, _fused(c, tuning))
    _compare(fused_out, _grads(c, x, g, lambda t: reference_cascade(c, t)), dtype, n * c.heads, c,
             "fused vs reference")


@needs_numba
@given(data=st.data())
def test_fused_segmented_backward_matches_eager(data):
    """A tiny scratch budget forces checkpointed segments (and, anisotropic, the storing fallback)."""
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    c, tuning = _cascade(data, dtype)
    tuning = dataclasses.replace(tuning, scratch_bytes=data.draw(st.integers(1, 4096), label="scratch bytes"),
                                 invert=data.draw(st.booleans(), label="invert"))
    n = data.draw(st.integers(1, 40), label="tokens")
    x = _input(data, c, 2, n, dtype=dtype)  # leading dims flatten into tokens
    g = torch.randn(2, n, c.heads * c.width, dtype=dtype)
    fused_out = _grads(c, x, g, _fused(c, tuning))
    _compare(fused_out, _grads(c, x, g, _eager(c)), dtype, 2 * n * c.heads, c, "segmented fused vs eager")


def _ffn_pair(data, dtype):
    width = 2 ** data.draw(st.integers(2, 6), label="log2 d_ff")
    s1 = data.draw(st.integers(1, 12), label="expand stages")
    s2 = data.draw(st.integers(1, 12), label="contract stages")
    spread = data.draw(st.floats(0.0, 0.5, allow_nan=False, allow_infinity=False), label="raw scale spread")
    e = RotationCascade(width, s1, coupling=False, dtype=dtype)
    c = RotationCascade(width, s2, coupling=False, dtype=dtype)
    with torch.no_grad():
        for m in (e, c):
            m.raw_scales.add_(torch.randn(m.raw_scales.shape, dtype=dtype) * spread)
    d_in = data.draw(st.integers(1, width), label="d_in")
    d_out = data.draw(st.integers(1, width), label="d_out")
    return e, c, d_in, d_out


def _ffn_params(e: RotationCascade, c: RotationCascade) -> tuple:
    return e.angles, e.raw_scales, c.angles, c.raw_scales


@needs_numba
@given(data=st.data())
def test_fused_ffn_matches_eager(data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    e, c, d_in, d_out = _ffn_pair(data, dtype)
    tuning = Tuning(invert=data.draw(st.booleans(), label="invert"))
    if data.draw(st.booleans(), label="tiny scratch"):
        tuning = dataclasses.replace(tuning, scratch_bytes=1)  # one stage per segment
    n = data.draw(st.integers(1, 70), label="tokens")
    scale = data.draw(st.floats(0.1, 4.0, allow_nan=False, allow_infinity=False), label="input scale")
    z = torch.randn(n, d_in, dtype=dtype) * scale
    if data.draw(st.booleans(), label="a zero token"):
        z[0] = 0.0  # RadialGELU at r = 0: Phi(0) = 1/2, finite gradient
    params = [*e.parameters(), *c.parameters()]

    def run(fn):
        zg = z.detach().requires_grad_(True)
        y = fn(zg)
        return [y.detach(), *torch.autograd.grad(y, [zg, *params], g)]

    g = torch.randn(n, d_out, dtype=dtype)
    got = run(lambda t: ffn_fused(t, *_ffn_params(e, c), d_out, tuning=tuning))
    want = run(lambda t: ffn_eager(t, *_ffn_params(e, c), d_out))
    names = ("output", "grad z", "expand angles", "expand raw_scales", "contract angles", "contract raw_scales")
    for a, b, name in zip(got, want, names):
        assert_close(a, b, dtype=dtype, size=n * e.width, depth=e.n_stages + c.n_stages + 1, what=f"ffn: {name}")


@needs_numba
def test_inversion_backward_used_and_falls_back():
    """Near-unit scales: every backward pass inverts.  Far-apart scales in float32: the drift check sends
    tiles to the storing path, and the gradients still match eager."""
    e = RotationCascade(64, 9, coupling=False)
    c = RotationCascade(64, 9, coupling=False)
    z = torch.randn(200, 16)
    g = torch.randn(200, 16)

    def grads(fn):
        zg = z.detach().requires_grad_(True)
        y = fn(zg, *_ffn_params(e, c), 16)
        return torch.autograd.grad(y, [zg, *e.parameters(), *c.parameters()], g)

    stats = FusedStats()
    grads(lambda *a: ffn_fused(*a, stats=stats))
    assert stats.backward_passes > 0 and stats.stored_passes == 0
    with torch.no_grad():
        for m in (e, c):
            m.raw_scales.copy_(torch.randn(m.raw_scales.shape) * 2.0)  # scales from 0.1 to 6: ill-conditioned
    stats = FusedStats()
    got = grads(lambda *a: ffn_fused(*a, stats=stats))
    assert stats.stored_passes > 0
    for a, b in zip(got, grads(ffn_eager)):
        assert_close(a, b, dtype=torch.float32, size=200 * 64, depth=19, what="fallback gradients")


@needs_numba
def test_double_backward_goes_through_eager_graph():
    c = RotationCascade(8, 3, coupling=True, heads=2, dtype=torch.float64, coupling_init_std=0.3)
    x = torch.randn(5, 16, dtype=torch.float64, requires_grad=True)

    def hvp(fn):
        (gx,) = torch.autograd.grad(fn(x).square().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.sum(), x)[0]

    assert_close(hvp(_fused(c)), hvp(_eager(c)), dtype=torch.float64, size=16, depth=3, what="second derivative")


@needs_numba
def test_the_rule_picks_the_path_from_the_tensors(monkeypatch):
    """Module calls take the kernels from MIN_TOKENS tokens on, for float32/float64 CPU tensors of one dtype,
    pair-energy features and no torch.func transform; the FFN's one kernel only with both cascades coupling-off."""
    calls = []
    for name in ("cascade_fused", "ffn_fused"):
        real = getattr(policy, name)
        monkeypatch.setattr(policy, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    c = RotationCascade(8, 2, coupling=True)
    small, big = torch.randn(4, 8), torch.randn(MIN_TOKENS, 8)
    assert not use_kernels(small, c.angles) and use_kernels(big, c.angles, c.raw_scales, c.coupling)
    assert not use_kernels(big.double(), c.angles)  # mixed dtypes: the eager path's type promotion decides
    assert not use_kernels(big.half(), c.angles.half())
    c(small)
    assert calls == []
    c(big)
    assert calls == ["cascade_fused"]
    RotationCascade(8, 2, coupling=True, feature_norm="feature_rms")(big)  # the kernels' features are pair_energy
    RotationCascade(8, 2, coupling=False, feature_norm="feature_rms")(big)  # coupling off: no features at all
    assert calls == ["cascade_fused"] * 2
    seen = []

    def loss(x):
        seen.append(use_kernels(x, c.angles))
        return c(x).square().sum()

    grad = torch.func.grad(loss)(big)  # under torch.func the cascade runs its eager graph
    assert seen == [False] and calls == ["cascade_fused"] * 2
    xb = big.detach().requires_grad_(True)
    want = torch.autograd.grad(_eager(c)(xb).square().sum(), xb)[0]
    assert_close(grad, want, dtype=torch.float32, size=8, depth=2, what="torch.func gradient")
    e, k = RotationCascade(16, 2, coupling=False), RotationCascade(16, 2, coupling=False)
    calls.clear()
    feed_forward(torch.randn(MIN_TOKENS, 8), e, k, 8)
    assert calls == ["ffn_fused"]
    feed_forward(torch.randn(MIN_TOKENS, 8), e, RotationCascade(16, 2, coupling=True), 8)
    assert calls == ["ffn_fused", "cascade_fused", "cascade_fused"]  # coupled: the two cascades' own calls


def test_a_cascade_holds_its_parameters_and_shape():
    c = RotationCascade(8, 2, coupling=True, heads=2)
    assert set(c.state_dict()) == {"angles", "raw_scales", "coupling"}
    assert not {"settings", "runtime", "stats", "backend"} & set(vars(c))
    with pytest.raises(ValueError, match=r"tile_tokens must be in \[1, 2\^30\], got 0"):
        Tuning(tile_tokens=0)


@needs_numba
def test_kept_angle_nudges_cost_their_bytes():
    """The forward keeps the last stages' nudges within the budget (4 bytes per pair and head in float32),
    saved for the backward beside the input; with no budget it saves the input alone."""
    c = RotationCascade(16, 5, coupling=True, heads=3)
    x = torch.randn(300, 48, requires_grad=True)
    per_stage = 3 * 8 * 4  # heads * P * float32

    def saved(budget):
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _fused(c, Tuning(angle_bytes_per_token=budget))(x)
        return sum(seen.values())

    tt = TUNING.tile_tokens
    tiles = -(-300 // tt)
    base = saved(0)
    placeholder = per_stage * tt  # with nothing kept the forward still saves a one-tile, one-stage empty record
    assert saved(2 * per_stage) - base == tiles * tt * 2 * per_stage - placeholder  # two stages kept per token
    assert Tuning(angle_bytes_per_token=2 * per_stage).stored_stages(3, 8, 5, 4) == 2


def test_fallback_when_kernels_unavailable(monkeypatch, caplog):
    """Without numba (simulated), module calls and explicit fused calls run eager with one logged notice, and the
    same numbers."""
    rt = runtime.KernelRuntime()  # a runtime of its own in place of the process's
    monkeypatch.setattr(runtime, "RUNTIME", rt)
    c = RotationCascade(8, 3, coupling=True, heads=2)
    x = torch.randn(MIN_TOKENS, 16)
    with caplog.at_level(logging.WARNING, logger="grt_model.kernels"):
        rt.mark_unavailable("ModuleNotFoundError: No module named 'numba' (simulated)")
        y = c(x)
    assert [r.getMessage() for r in caplog.records] == [
        "grt_model: fused rotation-cascade kernels unavailable (ModuleNotFoundError: No module named 'numba' "
        "(simulated)); using the eager PyTorch path"]
    assert not fused_available()
    assert torch.equal(y, _eager(c)(x)) and torch.equal(_fused(c)(x), y)  # bit-identical: the same eager code ran
    e = RotationCascade(8, 2, coupling=False)
    k = RotationCascade(8, 2, coupling=False)
    z = torch.randn(3, 4)
    assert torch.equal(ffn_fused(z, *_ffn_params(e, k), 4), ffn_eager(z, *_ffn_params(e, k), 4))


@needs_numba
def test_fallback_when_a_kernel_cannot_compile(monkeypatch, caplog):
    """A numba compile error at first use: one notice, the call (and every later one) runs eager."""
    import numba

    shared = runtime.RUNTIME
    rt = runtime.KernelRuntime()
    monkeypatch.setattr(runtime, "RUNTIME", rt)
    k = rt.kernels()

    def broken(*args):
        raise numba.core.errors.TypingError("simulated compile failure")

    monkeypatch.setattr(k, "coupled_cascade_fwd", broken)
    c = RotationCascade(8, 3, coupling=True, heads=2)
    x = torch.randn(5, 16, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="grt_model.kernels"):
        y = _fused(c)(x)
    assert "numba could not compile the kernels: TypingError" in caplog.text
    assert not fused_available() and shared.available()  # only this runtime gave up
    y.sum().backward()  # the eager graph
    assert torch.equal(y, _eager(c)(x))


def test_fused_ffn_rejects_bad_shapes():
    e, c = RotationCascade(8, 2, coupling=False), RotationCascade(8, 2, coupling=False)
    with pytest.raises(ValueError, match="single-head"):
        ffn_fused(torch.randn(2, 4), *_ffn_params(e, RotationCascade(8, 2, coupling=False, heads=2)), 4)
    with pytest.raises(ValueError, match=r"d_out must be in \[1, 8\]"):
        ffn_fused(torch.randn(2, 4), *_ffn_params(e, c), 9)


@needs_numba
def test_polynomial_transcendentals_are_below_float32_roundoff():
    """The float32 kernels' tanh, erf, exp, sin, cos against ``math``: the fits to ~1e-9, the float32
    results within a few float32 ulps (what the eager float32 path's own functions promise)."""
    k = runtime.RUNTIME.kernels()
    eps32 = eps_of("float32")
    u = np.linspace(0.0, 40.0, 4001)
    rel = max(abs(k.exp_neg(v) / math.exp(-v) - 1.0) for v in u)
    assert rel < 2**6 * 8 * eps_of("float64"), rel  # six squarings double the Taylor + rounding error six times
    for fit, fn, top in ((k.erf_rational, math.erf, 4.0), (k.tanh_rational, math.tanh, 9.0)):
        xs = np.linspace(0.0, top, 4001)
        err = max(abs(fit(v)[0] / fit(v)[1] - fn(v)) for v in xs)
        assert err < 2e-9, (fn.__name__, err)
    zs = np.linspace(-12.0, 12.0, 4801).astype(np.float32)
    err = max(abs(float(k.tanh_fast32(z)) - math.tanh(float(z))) for z in zs)
    assert err <= 2 * eps32, err
    err = max(abs(float(k.erf_fast32(abs(z))) - math.erf(abs(float(z)))) for z in zs)
    assert err <= 2 * eps32, err
    ds = np.linspace(-1.0, 1.0, 2001).astype(np.float32)
    assert max(abs(float(k.sin_small32(d)) - math.sin(float(d))) for d in ds) <= eps32
    assert max(abs(float(k.cos_small32(d)) - math.cos(float(d))) for d in ds) <= eps32
    for r in np.linspace(0.0, 8.0, 81).astype(np.float32):
        cdf, pdf = k.cdf_pdf_fast32(r)
        rr = float(r)
        assert abs(float(cdf) - 0.5 * (1 + math.erf(rr / math.sqrt(2)))) <= eps32
        assert abs(float(pdf) - math.exp(-rr * rr / 2) / math.sqrt(2 * math.pi)) <= eps32 * 0.4


def test_ffn_active_pairs_cover_the_signal():
    """Expand: live pairs grow from the input's coordinates; contract: they shrink onto the kept ones."""
    eact, cact = ffn_active_pairs(16, 5, 5, 4, 2)
    i0, i1 = pair_tables(16, 0, 5)
    live = np.zeros(16, bool)
    live[:4] = True
    for s in range(5):  # a pair is computed iff one of its inputs can be nonzero
        assert np.array_equal(eact[s].astype(bool), live[i0[s]] | live[i1[s]])
        live[i0[s][eact[s] == 1]] = live[i1[s][eact[s] == 1]] = True
    assert cact[-1].sum() == 1  # the last stage (stride 1) only needs pair (0, 1) for coordinates 0, 1
    assert cact[0].sum() == 8  # the first contract stage feeds everything


def test_bench_cli_help_and_errors(capsys):
    from lm.bench import __main__ as bench

    with pytest.raises(SystemExit) as ex:
        bench.main(["--help"])
    assert ex.value.code == 0
    assert "--json" in capsys.readouterr().out
    for argv, msg in ((["--batch-size", "0"], "--batch-size must be in [1, 1024], got 0"),
                      (["--case", "cascade,gpu"], "--case must be a comma-separated subset"),
                      (["--repeats", "1000"], "--repeats must be in [1, 100], got 1000")):
        with pytest.raises(SystemExit):
            bench.main(argv)
        assert msg in capsys.readouterr().err


@needs_numba
def test_bench_runs_and_writes_json(tmp_path, capsys):
    """A small run (no timing is checked): the table, the claim records against their targets, verdict last."""
    from lm.bench import TARGETS
    from lm.bench import __main__ as bench

    out = tmp_path / "bench.json"
    assert bench.main(["--case", "cascade,model", "--batch-size", "1", "--repeats", "1", "--warmup", "0",
                       "--threads", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "float32" in text and "mixer" in text and "model" in text and "load average" in text
    assert "claims hold" in text.strip().splitlines()[-1]  # the verdict is the last line
    rec = json.loads(out.read_text())
    assert {r["impl"] for r in rec["rows"] if r["case"] == "mixer"} == {"reference", "eager", "fused", "dense"}
    assert {r["impl"] for r in rec["rows"] if r["case"] == "ffn"} == {"eager", "fused", "dense"}
    assert len(rec["load_average"]["start"]) == 3 and rec["config"]["batch_size"] == 1
    claims = {c["id"]: c for c in rec["claims"]}
    assert set(claims) == {"bench.fused_vs_reference", "bench.qkvo_vs_dense", "bench.mixer_vs_dense",
                           "bench.ffn_vs_dense", "bench.model_step_vs_dense"}
    for cid, c in claims.items():
        target, sense, _ = TARGETS[cid]
        assert c["stated"] == target and c["measured"] > 0
        assert c["holds"] == (c["measured"] <= target if sense == "le" else c["measured"] >= target)
