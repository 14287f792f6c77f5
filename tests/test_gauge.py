"""The RMSNorm scale gauge: property tests of the laws, the checks on a tiny real model, and the CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from table_check import assert_table_shows_numbers

from gauge import (
    GaugeConfig,
    break_scales,
    build_setup,
    census_table,
    check_census,
    check_epsilon_breaking,
    check_euler_radial_gradient,
    check_forward_invariance,
    check_jacobian_null_space,
    check_per_row_scaling,
    eps_ratio_minus_one,
    eps_ratio_minus_one_leading,
    predicted_deviation,
    predicted_gauges,
    predicted_radial_eps,
    q_norm_output,
    scaled,
)
from gauge.__main__ import main
from gauge.scope import is_power_of_two
from lm import rms_norm, rms_norm_jacobian
from rmsgauge import assert_close, tolerance

DT = {"float32": torch.float32, "float64": torch.float64}
dtypes = st.sampled_from(["float32", "float64"])
scales = st.floats(min_value=1e-2, max_value=1e2, allow_nan=False, allow_infinity=False)
eps_values = st.floats(min_value=1e-8, max_value=1e-2, allow_nan=False, allow_infinity=False)
seeds = st.integers(min_value=0, max_value=2**31 - 1)


def _draw_problem(data, dtype: str):
    """Random rows x (N, D_in), weight W (H*hd, D_in), gain (hd,) or None, from drawn sizes."""
    N = data.draw(st.integers(1, 8), label="tokens")
    d_in = data.draw(st.integers(1, 16), label="d_in")
    H = data.draw(st.integers(1, 3), label="heads")
    hd = data.draw(st.sampled_from([2, 4, 8, 16]), label="head_dim")
    gen = torch.Generator().manual_seed(data.draw(seeds, label="seed"))
    x = torch.randn(N, d_in, generator=gen, dtype=torch.float64).to(DT[dtype])
    W = torch.randn(H * hd, d_in, generator=gen, dtype=torch.float64).to(DT[dtype])
    gain = None
    if data.draw(st.booleans(), label="gain"):
        gain = (1.0 + 0.5 * torch.randn(hd, generator=gen, dtype=torch.float64)).to(DT[dtype])
    return x, W, H, gain, gen


LOSSES = ("cubic", "cross_entropy", "quartic_norm", "logsumexp")


def _loss(kind: str, y: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Arbitrary downstream losses built on the RMSNorm outputs ``y (N, H, hd)``."""
    t = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.dtype)
    if kind == "cubic":
        return (t * y**3).sum()
    if kind == "cross_entropy":
        logits = y.flatten(1) @ t.flatten(1).T  # (N, N)
        return torch.nn.functional.cross_entropy(logits, torch.arange(y.shape[0]))
    if kind == "quartic_norm":
        return ((y - t) ** 2).sum() ** 2
    return torch.logsumexp((y * t).flatten(), dim=0)


# ----------------------------------------------------------------- forward invariance


@given(st.data(), dtypes, scales)
def test_forward_invariance(data, dtype, c):
    x, W, H, gain, _ = _draw_problem(data, dtype)
    ref = q_norm_output(x, W, H, 0.0, gain)
    out = q_norm_output(x, torch.tensor(c, dtype=W.dtype) * W, H, 0.0, gain)
    scale = float(ref.abs().max())
    # the error of each entry is absolute (~ ulp of the row's RMS scale), so atol is scaled by the largest output
    assert_close(out, ref, dtype=dtype, size=x.shape[1], depth=3, atol=tolerance(dtype, size=x.shape[1], depth=3,
                                                                                     scale=scale).atol,
                 what=f"RMSNorm(x (cW)^T) vs RMSNorm(x W^T), c={c:g}")


@given(st.data(), dtypes, scales)
def test_forward_sign_flip_is_not_a_gauge(data, dtype, c):
    x, W, H, gain, _ = _draw_problem(data, dtype)
    ref = q_norm_output(x, W, H, 0.0, gain)
    out = q_norm_output(x, torch.tensor(-c, dtype=W.dtype) * W, H, 0.0, gain)
    scale = float(ref.abs().max())
    tol = tolerance(dtype, size=x.shape[1], depth=3, scale=scale)
    assert_close(out, -ref, dtype=dtype, atol=tol.atol, size=x.shape[1], depth=3, what="RMSNorm(-cz) = -RMSNorm(z)")


# ----------------------------------------------------------------- Euler: zero radial gradient for any loss


@given(st.data(), dtypes, st.sampled_from(LOSSES))
def test_euler_radial_gradient(data, dtype, kind):
    x, W, H, gain, gen = _draw_problem(data, dtype)
    W = W.clone().requires_grad_(True)
    loss = _loss(kind, q_norm_output(x, W, H, 0.0, gain), gen)
    (g,) = torch.autograd.grad(loss, W)
    W = W.detach()
    scale = float(g.norm() * W.norm())
    tol = tolerance(dtype, size=x.shape[1], depth=4, scale=scale)
    # Euler per head: each head's row block is a gauge on its own, so the radial part vanishes block by block
    per_head = (g * W).view(H, -1).sum(dim=1)
    assert per_head.abs().max() <= tol.bound(), f"{kind}: per-head <g,W> = {per_head.tolist()}, tol {tol.bound():.3g}"


@given(st.data(), st.sampled_from(LOSSES), scales)
def test_gradient_is_homogeneous_of_degree_minus_one(data, kind, c):
    x, W, H, gain, gen = _draw_problem(data, "float64")
    state = gen.get_state()
    grads = []
    for s in (1.0, c):
        gen.set_state(state)  # the same targets for both losses
        Ws = (s * W).requires_grad_(True)
        (g,) = torch.autograd.grad(_loss(kind, q_norm_output(x, Ws, H, 0.0, gain), gen), Ws)
        grads.append(g)
    assert_close(c * grads[1], grads[0], dtype="float64", size=x.shape[1], depth=4,
                 scale=float(grads[0].abs().max()), what="c g(cW) = g(W)")


# ----------------------------------------------------------------- eps: the exact law, the break scales, the radial law


@given(st.data(), dtypes, scales, eps_values)
def test_epsilon_breaking(data, dtype, c, eps):
    x, W, H, gain, _ = _draw_problem(data, dtype)
    ref = q_norm_output(x, W, H, eps, gain)
    c_t = torch.tensor(c, dtype=W.dtype)
    out = q_norm_output(x, c_t * W, H, eps, gain)
    z = (x @ W.T).unflatten(-1, (H, -1)).reshape(-1, ref.shape[-1]).double()  # (R, hd)
    y = ref.reshape(z.shape).double()
    c64 = c_t.double().reshape(1)
    pred = float(predicted_deviation(c64, z, y, eps)[0])
    meas = float((out - ref).abs().max())
    tol = tolerance(dtype, size=x.shape[1], depth=3, scale=float(ref.abs().max()))
    assert abs(meas - pred) <= tol.bound(pred), f"measured {meas:.6g} vs exact law {pred:.6g}"
    # the first-order law is accurate up to relative O(eps / (c^2 m)) (+ the same O(eps/m) near c = 1)
    m = z.pow(2).mean(-1)
    exact = eps_ratio_minus_one(c64, m, eps)
    lead = eps_ratio_minus_one_leading(c64, m, eps)
    small = eps / (min(c, 1.0) ** 2 * m)  # plus its square: the cross term of the two first-order factors
    assert bool(((lead - exact).abs() <= (small + small**2) * exact.abs() + tolerance("float64").atol).all())


@given(st.data(), eps_values, st.floats(min_value=0.02, max_value=0.9), st.floats(min_value=1.2, max_value=10.0))
def test_break_scales_invert_the_law(data, eps, c_lo, c_hi):
    x, W, H, gain, _ = _draw_problem(data, "float64")
    y = q_norm_output(x, W, H, eps, gain)
    z = (x @ W.T).unflatten(-1, (H, -1)).reshape(-1, y.shape[-1])
    y = y.reshape(z.shape)
    for c, side in ((c_lo, 0), (c_hi, 1)):
        tol = float(predicted_deviation(torch.tensor([c], dtype=torch.float64), z, y, eps)[0])
        got = break_scales(z, y, eps, tol)[side]
        cond = abs(c * c - 1.0) / 2 + 1.0  # relative condition number of c given the deviation, (c^2 - 1)/2
        t = tolerance("float64", size=z.shape[-1], depth=4)
        assert abs(got - c) <= t.rtol * cond * c, f"side {side}: {got!r} vs {c!r}"


@given(st.data(), dtypes, eps_values, st.sampled_from(LOSSES))
def test_radial_gradient_eps_law(data, dtype, eps, kind):
    x, W, H, gain, gen = _draw_problem(data, dtype)
    W = W.clone().requires_grad_(True)
    y = q_norm_output(x, W, H, eps, gain)
    g, u = torch.autograd.grad(_loss(kind, y, gen), [W, y])
    W = W.detach()
    z = (x @ W.T).unflatten(-1, (H, -1))
    pred = float(predicted_radial_eps(u.double(), y.detach().double(), z.double(), eps))
    radial = float((g * W).sum())
    tol = tolerance(dtype, size=x.shape[1], depth=4, scale=float(g.norm() * W.norm()))
    assert abs(radial - pred) <= tol.bound(pred), f"<g,W> = {radial:.6g}, law {pred:.6g}"


# ----------------------------------------------------------------- the Jacobian null space


@given(st.integers(1, 6), st.sampled_from([2, 3, 8, 32]), dtypes, st.one_of(st.just(0.0), eps_values), seeds)
def test_jacobian_null_space(rows, n, dtype, eps, seed):
    z = torch.randn(rows, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(DT[dtype])
    J = rms_norm_jacobian(z, eps)  # (rows, n, n)
    J_auto = torch.func.vmap(torch.func.jacrev(lambda t: rms_norm(t, eps)))(z)
    rho = (z.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    assert_close(J, J_auto, dtype=dtype, size=n, depth=3, scale=float((1 / rho).max()), what="closed-form J")
    jz = (J @ z.unsqueeze(-1)).squeeze(-1)
    assert_close(jz, eps / rho**3 * z, dtype=dtype, size=n, depth=3, scale=float((z.norm(dim=-1) / rho[:, 0]).max()),
                 what="J z = eps/rho^3 z")


# ----------------------------------------------------------------- per-row (one neuron) vs per-head scaling


@given(st.data(), dtypes, st.floats(min_value=1.5, max_value=10.0), st.booleans())
def test_per_row_scaling(data, dtype, c, shrink):
    """Scaling a head's row block changes nothing; scaling one row (neuron) changes the output by the exact law."""
    c = 1.0 / c if shrink else c
    x, W, H, gain, _ = _draw_problem(data, dtype)
    hd = W.shape[0] // H
    row = data.draw(st.integers(0, W.shape[0] - 1), label="row")
    h, j = divmod(row, hd)
    ref = q_norm_output(x, W, H, 0.0, gain)  # (N, H, hd)
    tol = tolerance(dtype, size=x.shape[1], depth=3, scale=float(ref.abs().max())).bound()
    Wh = W.clone()
    Wh[h * hd:(h + 1) * hd] *= c  # the whole head block: a gauge
    assert float((q_norm_output(x, Wh, H, 0.0, gain) - ref).abs().max()) <= tol
    Wr = W.clone()
    Wr[row] *= c  # one neuron
    measured = (q_norm_output(x, Wr, H, 0.0, gain) - ref)[:, h]  # (N, hd): only head h can move
    # exact law (float64): row j's entry becomes c z_j, so rho_c^2 = rho^2 + (c^2 - 1) z_j^2 / hd
    z = (x.double() @ W.double().T).unflatten(-1, (H, hd))[:, h]  # (N, hd)
    rho = z.pow(2).mean(-1, keepdim=True).sqrt()
    rho_c = (rho**2 + (c * c - 1.0) * z[:, j:j + 1] ** 2 / hd).sqrt()
    zc = z.clone()
    zc[:, j] *= c
    law = zc / rho_c - z / rho  # (N, hd)
    if gain is not None:
        law = law * gain.double()
    assert float((measured.double() - law).abs().max()) <= tol
    if float(law.abs().max()) > 2 * tol:  # the law says the neuron is visible above round-off: so is the measurement
        assert float(measured.abs().max()) > tol


# ----------------------------------------------------------------- the checks on a tiny real model


TINY = GaugeConfig(d_model=16, n_heads=2, n_layers=2, batch_size=2, block_size=16, train_steps=3, c_points=101,
                   eps=(1e-6, "torch"))


@pytest.fixture(scope="module")
def tiny_setups():
    setups = {qk: build_setup(TINY, qk_norm=qk) for qk in (True, False)}
    setups[True].plain = setups[False]  # the census compares the model with and without QK-norm
    return setups


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("check", [check_forward_invariance, check_euler_radial_gradient, check_jacobian_null_space,
                                   check_epsilon_breaking, check_per_row_scaling], ids=lambda f: f.__name__)
def test_checks_hold_on_tiny_model(tiny_setups, check, dtype):
    claim = check(tiny_setups[True], dtype)
    assert claim.holds, claim
    assert claim.dtype == dtype and claim.id.startswith("gauge.")


def test_table_shows_every_claims_deciding_number(tiny_setups):
    claims = [check(tiny_setups[True], dt) for check in (check_forward_invariance, check_euler_radial_gradient,
                                                         check_jacobian_null_space, check_epsilon_breaking,
                                                         check_per_row_scaling, check_census)
              for dt in ("float64", "float32")]
    assert_table_shows_numbers(claims)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_census(tiny_setups, dtype):
    claim = check_census(tiny_setups[True], dtype)
    assert claim.holds, claim.measured
    assert claim.details["QK-norm"]["per_tensor"]["blocks.0.attn.q_proj.weight"]["gauge"]
    rows = {r["name"]: r for r in census_table(tiny_setups[True], dtype)}
    assert {n for n, r in rows.items() if r["gauge"]} == set(predicted_gauges(tiny_setups[True]))
    for name in ("blocks.0.mlp.up.weight", "blocks.0.mlp.down.weight", "tok_emb.weight", "blocks.0.attn.q_norm.weight"):
        assert not rows[name]["gauge"], name
    assert not any(r["gauge"] for r in census_table(tiny_setups[False], dtype))


def test_scaled_restores_bits(tiny_setups):
    W = tiny_setups[True].weight("float32")
    before = W.detach().clone()
    with scaled(W, 0.3):
        assert not torch.equal(W, before)
    assert torch.equal(W, before)


# ----------------------------------------------------------------- CLI


TINY_ARGS = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--batch-size", "2", "--block-size", "8",
             "--train-steps", "2", "--quiet"]


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--dtype", "--d-model", "--n-layers", "--batch-size", "--block-size", "--seed", "--c-min", "--c-max",
                 "--c-points", "--eps", "--json", "--quiet", "--verbose", "--census"):
        assert flag in out


@pytest.mark.parametrize("argv, flag", [  # GaugeConfig names the field it refuses, the parser the flag
    (["--c-min", "0"], "c_min must be in"),
    (["--c-min", "-1"], "c_min must be in"),
    (["--c-max", "0.001"], "c_max must be in"),
    (["--eps", "1e-6,-1e-5"], "eps must be in"),
    (["--eps", "abc"], "--eps"),
    (["--dtype", "float16"], "--dtype"),
    (["--c-points", "1"], "c_points must be in"),
    (["--n-heads", "3"], "n_heads"),
    (["--heads", "2"], "unknown flag --heads"),
    (["--census-c", "0"], "census_c must be in"),
    (["--layer", "9"], "layer must be in"),
    (["--batch-size", "0"], "batch_size must be in"),
    (["--threads", "0"], "--threads must be in"),
])
def test_cli_rejects_bad_flags(capsys, argv, flag):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


def test_cli_json(tmp_path):
    path = tmp_path / "gauge.json"
    assert main([*TINY_ARGS, "--dtype", "float64", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    ids = [c["id"] for c in doc["claims"]]
    assert ids == ["gauge.forward_invariance", "gauge.euler_radial_gradient", "gauge.jacobian_null_space",
                   "gauge.epsilon_breaking", "gauge.per_row_scaling", "gauge.census"]
    for rec in doc["claims"]:
        for key in ("id", "statement", "stated", "measured", "tolerance", "holds"):
            assert key in rec
        assert rec["dtype"] == "float64" and rec["holds"] is True


def test_cli_json_path_checked_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([*TINY_ARGS, "--json", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(f"--json {tmp_path} is a directory; give a file path such as {tmp_path / 'claims.json'}")


def test_cli_default_output_ends_on_the_verdict(capsys):
    assert main([a for a in TINY_ARGS if a != "--quiet"] + ["--dtype", "float64"]) == 0
    lines = capsys.readouterr().out.rstrip("\n").splitlines()
    assert lines[-1] == "6 of 6 claims hold"
    assert len(lines) < 60 and max(map(len, lines)) <= 100
    assert not any(line.lstrip().startswith(("GAUGE", "census (")) for line in lines)  # census only on request


# ----------------------------------------------------------------- what the checks measure (pinned)


def test_census_scales_are_not_powers_of_two():
    # 2^k scaling is exact in binary floats: a census at such scales sees |dL| = 0 for every tensor that merely
    # rescales exactly, so the defaults must stay off powers of two (and the claim fails on them)
    assert GaugeConfig().census_c
    for c in GaugeConfig().census_c:
        assert not is_power_of_two(c), c
    assert [is_power_of_two(c) for c in (2.0, 0.5, 1.0, 10.0, 0.1, 3.0)] == [True, True, True, False, False, False]


def test_census_fails_on_power_of_two_scales(tiny_setups):
    setup = tiny_setups[True]
    exact = dataclasses.replace(setup, config=dataclasses.replace(TINY, census_c=(2.0, 0.5)), plain=None)
    claim = check_census(exact, "float64")
    assert not claim.holds and claim.details["scales_exact_in_floats"] == [2.0, 0.5]


@pytest.mark.parametrize("check", [check_forward_invariance, check_euler_radial_gradient,
                                   check_jacobian_null_space, check_epsilon_breaking, check_per_row_scaling],
                         ids=lambda f: f.__name__)
def test_measured_tensor_is_q_proj(tiny_setups, check):
    # the record names the tensor it measured, read off the model by identity, not the label it meant
    claim = check(tiny_setups[True], "float64")
    assert claim.details["tensor"] == "blocks.0.attn.q_proj.weight"
    assert claim.details["shape"] == [TINY.d_model, TINY.d_model]


def test_details_are_structured_data(tiny_setups):
    # names -> numbers (or lists / dicts of them, or a tensor name): no prose to parse, no '=' inside a key
    def walk(v, where):
        if isinstance(v, dict):
            for k, x in v.items():
                assert "=" not in str(k), (where, k)
                walk(x, f"{where}.{k}")
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x, where)
        else:
            assert v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and " " not in v), (where, v)

    for check in (check_forward_invariance, check_euler_radial_gradient, check_jacobian_null_space,
                  check_epsilon_breaking, check_per_row_scaling):
        claim = check(tiny_setups[True], "float64")
        walk(claim.details, claim.id)
        walk(claim.measured, claim.id)


def test_claim_record_is_keyword_only_and_spells_dtype_once():
    import numpy as np

    from rmsgauge import Claim
    from rmsgauge.claims import dtype_name

    with pytest.raises(TypeError):
        Claim("gauge.x", "s", None, 1.0, None, True)  # positional records are refused
    for spelling in (torch.float64, np.float64, np.dtype("float64"), "float64", "torch.float64", "f64"):
        c = Claim(id="gauge.x", statement="s", stated=None, measured=1.0, tolerance=None, holds=True, dtype=spelling)
        assert c.dtype == "float64" == dtype_name(spelling)
    assert dtype_name([torch.float64, torch.float32]) == "float64, float32" and dtype_name(None) == "n/a"
