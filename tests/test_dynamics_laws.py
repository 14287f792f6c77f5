"""The SGD family's laws (dynamics.heavyball, dynamics.laws) against float64 simulation of the random-walk gauge.

Model (dynamics.noise_sim): R replicas of an n-entry gauge whose gradient is fresh Gaussian noise, tangent, of size
G/||W|| with E G^2 = n - 1, stepped by torch.optim.SGD itself.  Statistical tolerances: SE_SIGMAS standard errors of
the replica means plus the mean-field's Jensen gap Var(x)/x^2 (the law uses G^2/E[x] for E[G^2/x]), measured from
the run.  Steps to equilibrium: the prediction must land within one relaxation time (one e-fold of the transient)
of the settling step measured on the replica-mean norm; the old plain-SGD relaxation law misses by many e-folds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamics import laws, optlaws
from dynamics.context import SE_SIGMAS
from dynamics.heavyball import HeavyBall, heavy_ball_factor_closed
from dynamics.noise_sim import noise_run, settle_step, tail_stats
from rmsgauge import tolerance

N, R = 256, 32
BAND = 0.05
mus = st.floats(0.0, 0.95, allow_nan=False, allow_infinity=False)
decays = st.floats(1e-3, 0.3, allow_nan=False, allow_infinity=False)


def _tol(rule: HeavyBall):
    """Round-off of the 3x3 solve behind the general map: float64 tolerance grown by the condition number."""
    M, _ = rule.matrices()
    return tolerance("float64", size=9, depth=math.ceil(np.linalg.cond(np.eye(3) - M)))


@settings(max_examples=40, deadline=None)
@given(mu=mus, d=decays, coupled=st.booleans())
def test_heavy_ball_map_reproduces_the_closed_forms(mu, d, coupled):
    # the general second-moment map (any momentum, Nesterov, dampening) against the closed forms it must contain
    lr = 0.5
    rule = HeavyBall(lr=lr, l2=d / lr, momentum=mu) if coupled else HeavyBall(lr=lr, d=d, momentum=mu)
    tol = _tol(rule)
    G2 = 3.7
    x = laws.fixed_point_l2(lr, d / lr, G2, mu) if coupled else laws.fixed_point_sgd(lr, d, G2, mu)
    cos = laws.equilibrium_cos_l2(lr, d / lr, mu) if coupled else laws.equilibrium_cos(d, mu)
    assert abs(float(rule.fixed_point(G2)) - x) <= tol.bound(x)
    assert abs(rule.equilibrium_cos() - cos) <= tol.bound(1.0)
    closed = heavy_ball_factor_closed(lr, mu, l2=d / lr) if coupled else heavy_ball_factor_closed(lr, mu, d=d)
    assert abs(rule.relaxation_factor() - closed) <= tol.bound(1.0) ** 0.5  # eigenvalues of a defective J: sqrt
    if mu == 0.0:  # plain SGD: the map's slope 2q^2 - 1 (q = 1 - d for either decay)
        assert abs(rule.relaxation_factor() - abs(laws.relaxation_factor(d))) <= tol.bound(1.0) ** 0.5


def test_relaxation_steps_follow_the_momentum_law():
    # coupled L2, momentum 0.9.  The slow root is z = 1 - a e + c e^2 (e = lr wd), a = 4/(1-mu),
    # c = (2/(1+mu) + 4a - a^2)/(1-mu) (sympy: dynamics.relaxation_momentum), so the e-fold time is
    # (1-mu)/(4e) (1 + k e + O(e^2)), k = (c - a^2/2)/a; the plain-SGD law 1/(4e) is ~1/(1-mu) too long
    lr, wd, mu = 0.1, 1e-4, 0.9
    e, a = lr * wd, 4 / (1 - mu)
    k = ((2 / (1 + mu) + 4 * a - a * a) / (1 - mu) - a * a / 2) / a
    new = laws.relaxation_steps("sgdm", "l2", lr, wd, momentum=mu)
    assert new == HeavyBall(lr=lr, l2=wd, momentum=mu).relaxation_steps()
    assert abs(new * a * e - (1 + k * e)) <= (k * e) ** 2 * 2 + tolerance("float64", size=9).rtol / e
    old = -1.0 / math.log1p(-4.0 * e + 2.0 * e * e)
    assert old / new > 0.9 / (1 - mu)
    # complex roots: modulus sqrt(mu), -2/ln(mu) steps per e-fold (19 at 0.9) however large lr wd gets
    assert laws.relaxation_steps("sgdm", "l2", 0.1, 0.05, momentum=mu) == pytest.approx(-2 / math.log(mu), rel=1e-9)


CASES = {  # name: (rule, torch optimizer factory, decoupled decay applied before the step)
    "momentum 0.9, L2": (HeavyBall(lr=0.1, l2=0.02, momentum=0.9),
                         lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.02), 0.0),
    "momentum 0.9, L2, slow": (HeavyBall(lr=0.1, l2=0.005, momentum=0.9),
                               lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.005), 0.0),
    "Nesterov 0.9, L2": (HeavyBall(lr=0.1, l2=0.02, momentum=0.9, nesterov=True),
                         lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.02), 0.0),
    "momentum 0.8, dampening 0.5, L2": (HeavyBall(lr=0.2, l2=0.02, momentum=0.8, dampening=0.5),
                                        lambda ps: torch.optim.SGD(ps, lr=0.2, momentum=0.8, dampening=0.5,
                                                                   weight_decay=0.02), 0.0),
    "momentum 0.9, decoupled (SGD-W)": (HeavyBall(lr=0.1, d=0.01, momentum=0.9),
                                        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), 0.01),
    "plain SGD, L2": (HeavyBall(lr=0.2, l2=0.05), lambda ps: torch.optim.SGD(ps, lr=0.2, weight_decay=0.05), 0.0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sgd_family_law_against_simulation(name):
    rule, make, decay = CASES[name]
    G2 = N - 1.0
    xs = float(rule.fixed_point(G2))
    x0 = 4.0 * xs  # start far above: the map is not linear there (the restoring force G^2/x fades)
    enter, settle = rule.steps_to_equilibrium(x0, G2, BAND)
    tau = rule.relaxation_steps()
    T = math.ceil(settle + 12 * tau + 100)
    run = noise_run(make, n=N, replicas=R, steps=T, x0=x0, seed=1, decay=decay, q=1 - decay, lr_eff=rule.lr)
    xm = run.mean_x()
    measured = settle_step(xm, xs, BAND)
    assert abs(measured - settle) <= tau, (name, measured, settle, tau)
    inside = np.abs(xm / xs - 1) <= BAND
    assert abs(int(np.argmax(inside)) - enter) <= tau
    # the stationary norm and angle (after the transient: 8 e-folds past the settling step)
    start = math.ceil(settle + 8 * tau)
    x_bar, x_se = tail_stats(run.x, start)
    jensen = float((run.x[start:].var(0) / run.x[start:].mean(0) ** 2).max())
    assert abs(x_bar / xs - 1) <= SE_SIGMAS * x_se / x_bar + jensen, (name, x_bar / xs - 1)
    ratio = run.ww[start:].sum(0) / run.x[start:-1].sum(0)  # E<W_t, W_t+1>/E||W_t||^2 per replica
    one_minus = 1 - rule.equilibrium_cos()
    se = float((1 - ratio).std(ddof=1) / math.sqrt(R))
    assert abs((1 - ratio.mean()) / one_minus - 1) <= SE_SIGMAS * se / one_minus + jensen, name
    # the plain-SGD law (slope 2q^2 - 1 with q = 1 - lr wd, linearized) misses the momentum cases by e-folds
    if rule.momentum > 0 and rule.l2 > 0:
        plain_sgd = laws.steps_to_equilibrium(x0, xs, laws.relaxation_factor(rule.lr * rule.l2), BAND)
        assert plain_sgd - measured > 3 * tau, (name, plain_sgd, measured)


RANGE_CASES = [  # inputs torch accepts (or a scheduler sets) that no law describes: one line naming the parameter
    (lambda: laws.equilibrium_angle("adamw", "torch", 2.0, 0.6), r"^lr \* weight_decay must be in \[0, 1\), got 1.2"),
    (lambda: laws.equilibrium_angle("adamw", "torch", -0.1, 0.1), r"^lr must be in \[0, inf\), got -0.1$"),
    (lambda: laws.equilibrium_angle("sgdm", "l2", 3.0, 1.0), r"^lr \* weight_decay must be in \[0, 1\), got 3.0$"),
    (lambda: laws.equilibrium_angle("sgd", "source", 0.1, 1.5), r"^weight_decay must be in \[0, 1\), got 1.5$"),
    (lambda: laws.equilibrium_angle("sgdm", "torch", 0.1, 0.1, momentum=math.nan),
     r"^momentum must be in \[0, 1\), got nan$"),
    (lambda: laws.equilibrium_angle("adamw", "torch", 0.1, 0.1, betas=(0.9, 1.0)),
     r"^betas\[1\] must be in \[0, 1\), got 1.0$"),
    (lambda: laws.equilibrium_angle("adam", "torch", 0.1, 0.1), r"^optimizer must be one of sgd, sgdm, adamw"),
    (lambda: laws.adamw_equilibrium_norm(2.0, 0.6, 100), r"^lr \* weight_decay must be in \[0, 1\), got 1.2"),
    (lambda: laws.equilibrium_norm("sgd", "l2", 3.0, 1.0, numel=8, G2=1.0), r"^lr \* weight_decay must be in"),
    (lambda: laws.relaxation_steps("adamw", "torch", -0.1, 0.1), r"^lr must be in \[0, inf\), got -0.1$"),
    (lambda: laws.relaxation_steps("sgdm", "l2", 2.0, 0.6), r"^lr \* weight_decay must be in \[0, 1\), got 1.2"),
    (lambda: laws.random_walk_angle(-1e-3, 1.0, 10), r"^lr must be in \[0, inf\), got -0.001$"),
    (lambda: laws.equilibrium_cos_l2(0.5, 4.0), r"^lr \* weight_decay must be in \[0, 1\), got 2.0$"),
]


@pytest.mark.parametrize(("call", "message"), RANGE_CASES)
def test_a_law_outside_its_range_is_one_line_naming_the_parameter(call, message):
    with pytest.raises(ValueError, match=message) as e:
        call()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("make", "message"), [
    (lambda ps: torch.optim.SGD(ps, lr=3.0, weight_decay=1.0), r"^lr \* weight_decay must be in \[0, 1\), got 3.0$"),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=20.0),
     r"^lr \* weight_decay must be in \[0, 1\), got 2.0$"),
    (lambda ps: torch.optim.AdamW(ps, lr=2.0, weight_decay=0.6), r"^lr \* weight_decay must be in \[0, 1\), got 1.2"),
])
def test_the_monitors_laws_refuse_a_decay_no_law_describes(make, message):
    # the monitor's entry point (dynamics.optlaws): a one-line ValueError, never a math domain error
    w = torch.nn.Parameter(torch.ones(4, 4, dtype=torch.float64))
    opt = make([w])
    law = optlaws.resolve(opt, opt.param_groups[0], w)
    stats = optlaws.GroupStats(numel=16, rows=4, shape=(4, 4), x0=16.0, norm0=4.0, G2=1.0)
    with pytest.raises(ValueError, match=message):
        optlaws.predict(law, stats)
    opt.param_groups[0]["lr"] = -0.1  # torch refuses a negative lr at construction, not in a hand-edited group
    with pytest.raises(ValueError, match=r"^lr must be in "):
        optlaws.predict(optlaws.resolve(opt, opt.param_groups[0], w), stats)
