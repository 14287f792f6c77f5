"""Scale-free updates (Lion, Muon) and the two optimizers without a law (Adafactor, Adam + L2), in float64 (AdamW's
law, with its second moment's scatter and lag: tests/test_dynamics_laws_adamw.py).

Same model and tolerances as tests/test_dynamics_laws.py: the random-walk gauge of dynamics.noise_sim stepped by the
optimizers themselves; SE_SIGMAS standard errors of the replica means plus the run's own Jensen gap for stationary
values; steps to equilibrium within one relaxation time of the settling step of the replica-mean norm.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dynamics import laws
from dynamics import scalefree as sf
from dynamics.context import SE_SIGMAS
from dynamics.lion import Lion
from dynamics.monitor import EquilibriumMonitor
from dynamics.noise_sim import noise_run, settle_step, tail_stats
from rmsgauge import tolerance

BAND = 0.05


def _stationary(run, start: int, x_star: float, cos_star: float, d: float, model: float = 0.0) -> None:
    """Tail norm and angle against the law.  ``model``: the relative size of the terms the law neglects (Lion and
    Muon: O(1/n), the one direction of n each tangent gradient lacks).  1 - cos* = d - lr^2 nu A/x* is a small
    difference of two terms, so a relative error e in x* moves it by e (d/(1 - cos*) - 1): the angle's allowance
    carries that factor."""
    x_bar, x_se = tail_stats(run.x, start)
    jensen = float((run.x[start:].var(0) / run.x[start:].mean(0) ** 2).max())
    x_err = SE_SIGMAS * x_se / x_bar + jensen + model
    assert abs(x_bar / x_star - 1) <= x_err, (x_bar / x_star - 1, x_se / x_bar, jensen)
    ratio = run.ww[start:].sum(0) / run.x[start:-1].sum(0)
    one_minus = 1 - cos_star
    se = float((1 - ratio).std(ddof=1) / math.sqrt(len(ratio)))
    allow = SE_SIGMAS * se / one_minus + (jensen + model) * max(1.0, d / one_minus - 1)
    assert abs((1 - ratio.mean()) / one_minus - 1) <= allow, ((1 - ratio.mean()) / one_minus - 1, allow)


@pytest.mark.parametrize("betas", [(0.9, 0.99), (0.95, 0.98), (0.0, 0.0)])
def test_lion_law_and_transient_against_simulation(betas):
    n, R, lr, wd = 1024, 8, 0.01, 0.5
    d = lr * wd
    A = sf.lion_correlation_sum(d, *betas)
    xs = float(sf.fixed_point(lr, d, n, A))
    x0 = 4 * xs
    enter, settle = sf.lion_steps_to_equilibrium(x0, lr, wd, n, betas, BAND)
    tau = sf.relaxation_steps(d)
    T = math.ceil(settle + 6 * max(tau, 1 / (1 - betas[1])))
    run = noise_run(lambda ps: Lion(ps, lr=lr, weight_decay=wd, betas=betas), n=n, replicas=R, steps=T, x0=x0,
                    seed=3, q=1 - d, lr_eff=lr)
    assert np.abs(run.uu / n - 1).max() <= tolerance("float64", size=n, depth=4).rtol / (lr * lr)  # nu = C exactly
    measured = settle_step(run.mean_x(), xs, BAND)
    assert abs(measured - settle) <= tau, (measured, settle, tau)
    start = math.ceil(settle + 2 * tau)
    _stationary(run, start, xs, float(sf.equilibrium_cos(d, A)), d, 1 / n)
    A_meas = -run.uw[start:].mean() / (lr * n)  # <u, W> = -lr nu A
    se = run.uw[start:].mean(0).std(ddof=1) / math.sqrt(R) / (lr * n)
    assert abs(A_meas - A) <= SE_SIGMAS * se + (1 + A) * float((run.x[start:].var(0) / run.x[start:].mean(0) ** 2)
                                                                .max())


def test_lion_req_form_is_the_linearized_sign_law():
    # REQ's angle sqrt(pi/2) sqrt(2 lr wd) sigma is our law with sign(c) ~ sqrt(2/pi) c/sigma, the residual's
    # (1 - 2/pi) dropped and q^(k-1) -> 1: then 1 + 2 A_lin - (1 - 2/pi) = (2/pi)/sigma^2 exactly
    b1, b2 = 0.9, 0.99
    sigma2 = (1 - b1) ** 2 + b1 * b1 * (1 - b2) / (1 + b2)
    k = np.arange(1, 20000, dtype=np.float64)
    rho = np.sin(np.pi / 2 * sf.lion_sign_correlations(b1, b2, k))  # back to the Gaussian correlations
    A_lin = float(np.sum(2 / np.pi * rho))
    tol = tolerance("float64", size=len(k))
    assert abs(1 + 2 * A_lin - (1 - 2 / np.pi) - 2 / np.pi / sigma2) <= tol.bound(2 / np.pi / sigma2)
    # so in the small-d limit REQ's angle and ours differ by the residual and the arcsine's curvature only
    lr, wd = 1e-4, 0.1
    ours = math.acos(float(sf.equilibrium_cos(lr * wd, sf.lion_correlation_sum(lr * wd, b1, b2))))
    req = sf.lion_req_angle(lr, wd, b1, b2)
    lin = math.sqrt(2 * lr * wd / (1 + 2 * A_lin))  # our small-d law with the linearized correlations
    assert req / lin - 1 == pytest.approx(math.sqrt(1 + (1 - 2 / np.pi) * sigma2 * np.pi / 2) - 1, rel=1e-6)
    assert 0 < abs(ours / req - 1) < 0.05  # the arcsine's curvature (rho_1 = 0.35): a few percent


@pytest.mark.parametrize("momentum", [0.0, 0.95])
def test_muon_law_against_simulation(momentum):
    if not hasattr(torch.optim, "Muon"):
        pytest.skip("this torch has no torch.optim.Muon")
    shape, R, lr, wd = (16, 24), 6, 0.04, 0.5
    d, ratio = lr * wd, sf.muon_lr_ratio(shape, None)
    n = shape[0] * shape[1]
    tau = sf.relaxation_steps(d)
    T = math.ceil(12 * tau)
    x0 = 1.0
    run = noise_run(lambda ps: torch.optim.Muon(ps, lr=lr, weight_decay=wd, momentum=momentum), n=n, replicas=R,
                    steps=T, x0=x0, seed=4, matrix=shape, q=1 - d, lr_eff=lr * ratio)
    start = math.ceil(8 * tau)
    nu = float(run.uu[start:].mean())
    nominal = sf.muon_nominal_nu(shape)
    assert 0.25 <= nu / nominal <= 2.25  # Newton-Schulz's singular values lie in about (0.5, 1.5) (torch docstring)
    A = 0.0 if momentum == 0.0 else sf.measured_correlation_sum(lr * ratio, nu, float(run.uw[start:].mean()))
    xs = float(sf.fixed_point(lr * ratio, d, nu, A))
    _stationary(run, start, xs, float(sf.equilibrium_cos(d, A)), d, 1 / n)
    if momentum == 0.0:  # the closed form: cos phi* = q, and the transient is q^(2t) from step 1
        measured = settle_step(run.mean_x(), xs, BAND)
        assert abs(measured - sf.steps_to_equilibrium(x0, xs, d, BAND)) <= tau
    else:
        assert A > 1.0  # momentum correlates consecutive orthogonalized updates: the A = 0 form is far off


class _Gauge(torch.nn.Module):
    def __init__(self, n: int = 64, scale: float = 1.0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.w = torch.nn.Parameter(torch.randn(8, n // 8, dtype=torch.float64, generator=gen) * scale)


def _noise_steps(m: _Gauge, opt, steps: int, seed: int = 6) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        w = m.w.detach()
        xi = torch.randn(w.shape, dtype=torch.float64, generator=gen)
        m.w.grad = (xi - w * (xi * w).sum() / (w * w).sum()) / w.norm()
        opt.step()


def test_adafactor_relative_steps_have_no_equilibrium():
    tf = pytest.importorskip("transformers")
    angles = []
    for scale in (1.0, 37.0):  # the update scales with the weight: the same angles at any norm
        m = _Gauge(scale=scale)
        opt = tf.optimization.Adafactor(m.parameters(), lr=None, relative_step=True, scale_parameter=True,
                                        warmup_init=False)
        mon = EquilibriumMonitor(m, opt, ["w"])
        _noise_steps(m, opt, 40)
        angles.append(np.array(mon.series("w", "angle")[1]))
        rec = mon.history[-1]["groups"]["w"]
        assert rec["law"] == "adafactor/relative" and rec["norm_eq"] is None
        assert rec["note"].startswith("no equilibrium: the update scales with the weight")
        bounds = np.array([math.asin(laws.adafactor_relative_step(t)) for t in range(1, 41)])
        assert np.all(angles[-1] <= bounds * (1 + tolerance("float64", size=m.w.numel(), depth=4).rtol))
    tol = tolerance("float64", size=64, depth=40 * 8)
    assert np.abs(angles[0] - angles[1]).max() <= tol.bound(angles[0].max())


def test_adam_with_l2_logs_measurements_and_says_why_there_is_no_law():
    m = _Gauge()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2, weight_decay=0.1)
    mon = EquilibriumMonitor(m, opt, ["w"])
    _noise_steps(m, opt, 5)
    rec = mon.history[-1]["groups"]["w"]
    assert rec["law"] == "adam/l2" and rec["note"] == laws.ADAM_L2_WHY and rec["angle_eq"] is None
    assert rec["norm"] > 0 and rec["angle"] > 0 and rec["nu"] > 0
    assert "no closed law" in mon.table()
