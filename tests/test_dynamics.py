"""Weight-norm dynamics of a scale gauge under weight decay (``dynamics/``).

Documented ranges of the property tests:
  lr in [1e-3, 1], wd in [0, 0.5] (source convention, d = wd; torch convention d = lr*wd), seed in [0, 2**16);
  fixed points: d in [0.01, 0.25] (the phase toy's contraction |2(1-d)^2-1| stays in [0.125, 0.9602]);
  equilibrium angles: d in [0.02, 0.2], noise toy n = 64 x 8 replicas (tolerance 4 standard errors + 1/n).
Every tolerance comes from ``rmsgauge.tolerance`` or from the statistics of the run (see dynamics/context.py).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from table_check import assert_table_shows_numbers

from dynamics import laws
from dynamics.__main__ import main
from dynamics.checks_angle import noise_angle_row, rate_row
from dynamics.checks_norm import phase_fixed_point, tracking
from dynamics.context import (
    SOURCE_ANGLES,
    SOURCE_SCALES,
    equilibration_steps,
    identity_tolerance,
    predicted_noise_equilibrium,
)
from dynamics.problems import NoiseToy, PhaseToy, QKNormProblem, QKNormSpec, RegressionConfig, RegressionToy
from dynamics.simulate import OptimConfig, run
from lm import DenseConfig, rms_norm
from rmsgauge import Claim, tolerance

SMALL_TOY = RegressionConfig(d_in=8, d_out=8, n_samples=64, batch=16)
lrs = st.floats(1e-3, 1.0, allow_nan=False, allow_infinity=False)
wds = st.floats(0.0, 0.5, allow_nan=False, allow_infinity=False)
seeds = st.integers(0, 2**16 - 1)


def _toy_run(cfg: OptimConfig, steps: int, seed: int, dtype: str = "float64"):
    return run(RegressionToy(SMALL_TOY, seed=seed, dtype=dtype), cfg, steps)


# ----------------------------------------------------------------------------- 1. identity
@given(lr=lrs, wd=wds, seed=seeds, decay=st.sampled_from(["source", "torch"]), dtype=st.sampled_from(["float64",
                                                                                                        "float32"]))
def test_norm_identity(lr, wd, seed, decay, dtype):
    cfg = OptimConfig(optimizer="sgd", decay=decay, lr=lr, wd=wd)
    tr = _toy_run(cfg, 12, seed, dtype)
    res = tr.identity_residuals()
    tol = identity_tolerance(dtype, tr.group_size)
    assert res["zero_radial"].max() <= tol  # (1-d)^2 x + lr^2 ||g||^2, radial term dropped: exact for a gauge
    # the source's (1-2d) form misses by exactly d^2 x_t / x_(t+1)
    drop = laws.first_order_one_step_error(tr.x, tr.x_next, cfg.d)
    assert np.abs(res["first_order"] - drop).max() <= tol


@given(seed=seeds, optimizer=st.sampled_from(["sgdm", "adamw"]))
def test_norm_identity_momentum_needs_the_radial_term(seed, optimizer):
    cfg = OptimConfig(optimizer=optimizer, decay="torch", lr=0.05 if optimizer == "sgdm" else 1e-2, wd=0.1)
    tr = _toy_run(cfg, 12, seed)
    res = tr.identity_residuals()
    tol = identity_tolerance("float64", tr.group_size)
    assert res["exact"].max() <= tol  # with the measured <u, W>
    # the update is not the gradient: <u, W> != 0 from the second step on, so the zero-radial form fails
    assert res["zero_radial"][1:].max() > 1e3 * tol


def test_norm_identity_on_qknorm_model_float32():
    prob = QKNormProblem(spec=QKNormSpec(batch=2, block=32),
                         config=DenseConfig(qk_norm=True, qk_norm_eps=0.0, n_layers=2, d_model=64, n_heads=2, d_ff=128,
                                            block_size=32), seed=1, dtype="float32")
    tr = run(prob, OptimConfig(lr=0.5, wd=0.02), 4)
    assert tr.x.shape == (4, 2)  # two heads: two gauges
    assert tr.identity_residuals()["zero_radial"].max() <= identity_tolerance("float32", tr.group_size)
    assert tr.radial_relative().max() <= tolerance("float32", size=tr.group_size).rtol


# ----------------------------------------------------------------------------- 2. trajectory
@given(lr=lrs, wd=st.floats(1e-3, 0.2, allow_nan=False, allow_infinity=False), seed=seeds)
def test_trajectory_tracking(lr, wd, seed):
    tr = _toy_run(OptimConfig(lr=lr, wd=wd), 40, seed)
    r = tracking(tr)
    assert r["exact_max_rel"] <= r["tol"]
    assert r["bias_law_error"] <= r["tol"]  # the (1-2d) form's gap is the deterministic d^2 recursion
    assert r["source_iterated_max_rel"] > r["tol"]  # ... and it is a real gap, not round-off


def test_trajectory_bias_saturates_at_half_d():
    d, t = 0.01, np.array([1, 10, 100, 10_000])
    rel = laws.first_order_bias_constant_norm(t, d)
    assert rel[0] == pytest.approx(d * d)
    assert rel[1] == pytest.approx(d * d * 10, rel=0.1)  # ~ d^2 t early
    assert rel[-1] == pytest.approx(d / 2, rel=1e-12)
    x = np.full((201, 1), 3.0)
    assert np.allclose(laws.first_order_bias(x, d)[:, 0] / 3.0, laws.first_order_bias_constant_norm(np.arange(201), d))


# ----------------------------------------------------------------------------- 3. fixed point
@given(data=st.data())
def test_equilibrium_norm(data):
    """Phase toy (G = 1): from x*(1+e0), the deviation contracts by |2q^2-1| +- (1-q^2) e0/(1-e0) per step."""
    decay = data.draw(st.sampled_from(["source", "torch"]))
    d = data.draw(st.floats(0.01, 0.25, allow_nan=False, allow_infinity=False))
    if decay == "source":
        lr, wd = data.draw(st.floats(0.01, 1.0, allow_nan=False, allow_infinity=False)), d
    else:
        lr = data.draw(st.floats(2 * d, 1.0, allow_nan=False, allow_infinity=False))
        wd = d / lr
    cfg = OptimConfig(decay=decay, lr=lr, wd=wd)
    q, e0, target = cfg.q, 1e-2, 1e-9
    x_star = float(laws.fixed_point_sgd(lr, cfg.d, 1.0))
    rho = abs(laws.relaxation_factor(cfg.d))
    slack = (1 - q * q) * e0 / (1 - e0)
    steps = math.ceil(math.log(e0 / target) / -math.log(rho + slack))
    tr = run(PhaseToy(norm_sq=x_star * (1 + e0)), cfg, steps)
    e_T = abs(tr.x_next[-1, 0] / x_star - 1)
    tol_fp = tolerance("float64", depth=16).rtol / (1 - rho)
    assert e_T <= target + tol_fp  # reached within the relaxation-time bound
    assert e_T >= e0 * (rho - slack) ** steps - tol_fp  # ... and not faster than the law allows


@pytest.mark.parametrize(("decay", "lr", "wd"), [("source", 0.1, 0.02), ("torch", 0.5, 0.2), ("source", 1.0, 0.25)])
def test_relaxation_factor_measured(decay, lr, wd):
    r = phase_fixed_point(decay, lr, wd)
    assert r["holds"], r
    assert abs(r["rho_measured"] - r["rho_pred(2q^2-1)"]) <= r["tol_rho"]
    assert r["source_fixed_point_rel_err"] > 0  # the (1-2d) fixed point is too small by sqrt(1 - d/2)


# ----------------------------------------------------------------------------- 4. angle
@settings(max_examples=8)  # each example trains ~500 steps
@given(data=st.data())
def test_equilibrium_angle(data):
    optimizer = data.draw(st.sampled_from(["sgd", "sgdm", "adamw"]))
    decay = data.draw(st.sampled_from(["source", "torch", "l2"] if optimizer == "sgdm" else ["source", "torch"]))
    d = data.draw(st.floats(0.02, 0.2, allow_nan=False, allow_infinity=False))
    lr = 0.1 if decay == "source" else 0.5  # torch/l2: wd = d/lr = 2d stays in [0.04, 0.4]
    wd = d if decay == "source" else d / lr  # l2: lr*wd = d
    cfg = OptimConfig(optimizer=optimizer, decay=decay, lr=lr, wd=wd, betas=(0.9, 0.999))
    n = 64
    toy = NoiseToy(n=n, replicas=8, seed=data.draw(seeds), norm_sq=predicted_noise_equilibrium(cfg, n))
    burn = equilibration_steps(cfg, 1.0)
    tr = run(toy, cfg, burn + 300)
    r = noise_angle_row(tr, {"burn": burn, "n": n})
    assert abs(r["rel_err"]) <= r["tol"], r


def test_published_formula_drifts_at_large_decay():
    """At d = 0.2 with momentum 0.9 the first-order sqrt(2d(1-mu)/(1+mu)) is ~5% low; our law is not."""
    ours = laws.equilibrium_angle("sgdm", "source", 0.1, 0.2, 0.9)
    pub, _ = laws.published_angle("sgdm", "source", 0.1, 0.2, 0.9)
    assert ours / pub - 1 > 0.04
    assert laws.equilibrium_angle("sgd", "source", 0.1, 0.2) == pytest.approx(math.acos(0.8))
    assert laws.published_angle("sgd", "l2", 0.1, 0.1)[0] == pytest.approx(math.sqrt(0.02))  # Wan, mu=0


def test_sgd_per_step_angle_is_exact():
    tr = _toy_run(OptimConfig(lr=0.3, wd=0.05), 30, 3)
    pred = np.arccos(np.clip(tr.cfg.q * np.sqrt(tr.x / tr.x_next), -1, 1))
    assert np.abs(tr.angle - pred).max() <= math.sqrt(2 * identity_tolerance("float64", tr.group_size))
    tan = laws.step_angle_sgd(tr.cfg.lr, np.sqrt(tr.g2), np.sqrt(tr.x), tr.cfg.d)
    assert np.abs(tr.angle - tan).max() <= 1e3 * tolerance("float64").rtol


# ----------------------------------------------------------------------------- 5. rate
@given(seed=seeds, optimizer=st.sampled_from(["sgd", "adamw"]))
def test_angular_rate_scaling(seed, optimizer):
    toy = RegressionToy(SMALL_TOY, seed=seed)
    idx = torch.arange(SMALL_TOY.batch)

    def loss():
        return (rms_norm(toy.x[idx] @ toy.weight) - toy.y[idx]).pow(2).sum(-1).mean()

    def cfg_at(lr):
        return OptimConfig(optimizer=optimizer, decay="torch", lr=lr, wd=0.1)

    r = rate_row(toy.weight, loss, cfg_at, None, "float64")
    assert r["holds"], r
    assert r["angles"][0] == pytest.approx(SOURCE_ANGLES[0], abs=r["tol"])  # the lr solve hits 0.0025 exactly
    want = -2.0 if optimizer == "sgd" else -1.0
    assert abs(r["fitted_exponent"] - want) < 2e-3  # arctan compression only (angles <= 0.04)


def test_source_numbers_follow_inverse_square_not_inverse_norm():
    sq = laws.scaled_angle(SOURCE_ANGLES[0], np.array(SOURCE_SCALES), 2.0)
    lin = laws.scaled_angle(SOURCE_ANGLES[0], np.array(SOURCE_SCALES), 1.0)
    assert np.allclose(sq, SOURCE_ANGLES, rtol=1e-3)  # 0.0025, 0.010, 0.040 to the source's digits
    assert not np.allclose(lin, SOURCE_ANGLES, rtol=0.1)  # "grows like 1/||W||" would give 0.005, 0.010
    assert laws.fitted_exponent(SOURCE_SCALES, SOURCE_ANGLES) == pytest.approx(-2.0)


# ----------------------------------------------------------------------------- 6. radial
@given(seed=seeds, dtype=st.sampled_from(["float64", "float32"]), optimizer=st.sampled_from(["sgd", "adamw"]))
def test_radial_gradient_during_training(seed, dtype, optimizer):
    tr = _toy_run(OptimConfig(optimizer=optimizer, lr=0.05), 15, seed, dtype)
    assert tr.radial_relative().max() <= tolerance(dtype, size=tr.group_size).rtol


# ----------------------------------------------------------------------------- CLI
@pytest.mark.parametrize(("argv", "flag"), [  # DynamicsPlan names the value it refuses, the parser the flag
    (["--lr", "0"], "lr must be"), (["--lr", "-1"], "lr must be"), (["--wd", "1"], "wd must be"),
    (["--wd", "-0.1"], "wd must be"), (["--steps", "0"], "steps must be"), (["--optimizer", "lion"], "--optimizer"),
    (["--momentum", "1"], "momentum must be"), (["--betas", "0.9,1.0"], "betas[1] must be"),
    (["--optimizer", "adamw", "--decay", "l2"], "decay 'l2'"), (["--decay", "torch", "--lr", "10", "--wd", "0.5"],
                                                                 "lr*wd < 1"), (["--dtype", "float16"], "--dtype"),
])
def test_cli_rejects_bad_flags(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


def test_cli_json_keys(tmp_path, capsys):
    path = tmp_path / "dyn.json"
    code = main(["--steps", "2", "--json", str(path)])
    assert code in (0, 1)  # two steps cannot reach equilibrium; the records say so
    out = capsys.readouterr().out
    assert "float64" in out and "float32" in out and "source" in out
    rec = json.loads(path.read_text())
    assert_table_shows_numbers([Claim(**{k: v for k, v in c.items() if k != "figure"}) for c in rec["claims"]])
    assert rec["package"] == "dynamics" and rec["mode"] == "single"
    ids = [c["id"] for c in rec["claims"]]
    assert ids == ["dynamics.norm_identity", "dynamics.trajectory_tracking", "dynamics.equilibrium_norm",
                   "dynamics.equilibrium_angle", "dynamics.angular_rate_scaling",
                   "dynamics.radial_gradient_during_training"]
    for c in rec["claims"]:
        for key in ("statement", "stated", "measured", "tolerance", "holds", "dtype", "exact_law", "source_status"):
            assert key in c
        assert "mode" in c["details"]
