"""dynamics.monitor: the equilibrium monitor on any optimizer, and the laws it reads (dynamics.laws)."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from dynamics import adamw_window as aw
from dynamics import laws, optlaws
from dynamics import scalefree as sf
from dynamics.context import SE_SIGMAS
from dynamics.monitor import EquilibriumLagWarning, EquilibriumMonitor
from dynamics.train_hook import TrainHook
from rmsgauge import tolerance


class HeadNormToy(nn.Module):
    """z = x W^T split into heads, each RMS-normalized (eps 0): every head's row block of W is an exact gauge."""

    def __init__(self, d: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, d, dtype=torch.float64))
        self.out = nn.Parameter(torch.randn(d, dtype=torch.float64))
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x @ self.w.T).unflatten(-1, (self.heads, -1))  # (B, H, d/H)
        y = z / z.pow(2).mean(-1, keepdim=True).sqrt()
        return (y.flatten(-2) * self.out).sum(-1).sin().mean()


def _blocks(d: int = 8, heads: int = 2):
    return {"w": [(0, h * d // heads, (h + 1) * d // heads) for h in range(heads)]}


def test_monitor_sgd_step_angle_is_the_exact_law(tmp_path):
    # SGD with coupled L2 on a gauge: W' = (1 - lr wd) W - lr g with g _|_ W (Euler), so per block
    # tan(phi) = lr ||g_I|| / ((1 - lr wd) ||W_I||) exactly (dynamics.laws.step_angle_sgd)
    torch.manual_seed(0)
    m = HeadNormToy()
    lr, wd = 0.05, 0.1
    opt = torch.optim.SGD(m.parameters(), lr=lr, weight_decay=wd)
    log = tmp_path / "eq.jsonl"
    mon = EquilibriumMonitor(m, opt, _blocks(), log_path=log)
    for _ in range(5):
        x = torch.randn(16, 8, dtype=torch.float64)
        m(x).backward()
        expected = [laws.step_angle_sgd(lr, float(m.w.grad[s:e].norm()), float(m.w[s:e].detach().norm()), lr * wd)
                    for _, s, e in _blocks()["w"]]
        opt.step()
        opt.zero_grad()
        got = [r["angle"] for r in mon.history[-1]["groups"].values()]
        tol = tolerance("float64", size=m.w.numel(), depth=4, scale=max(expected))
        assert all(abs(a - b) <= tol.bound(b) for a, b in zip(got, expected))
    rec = mon.history[-1]["groups"]["w[rows 0:4]"]
    assert rec["law"] == "sgd/l2" and rec["angle_eq"] == math.acos(1.0 - lr * wd)  # cos phi* = 1 - lr wd (mu = 0)
    assert len(log.read_text().splitlines()) == 5 and json.loads(log.read_text().splitlines()[0])["step"] == 1
    assert "w[rows 4:8]" in mon.table()


def test_monitor_adamw_predictions_interval_and_no_prediction(tmp_path):
    torch.manual_seed(0)
    m = HeadNormToy()
    lr, wd, b1 = 1e-2, 0.5, 0.9
    opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=wd, betas=(b1, 0.99))
    mon = EquilibriumMonitor(m, opt, ["w"], interval=2)
    hook = TrainHook(monitor=mon)
    assert hook.on_start()["equilibrium_groups"] == ["w"]
    seen = 0
    for step in range(6):
        m(torch.randn(16, 8, dtype=torch.float64)).backward()
        opt.step()
        opt.zero_grad()
        seen += hook.after_step(step) is not None
    assert [h["step"] for h in mon.history] == [1, 2, 4, 6] and seen == 4
    r = mon.history[-1]["groups"]["w"]
    q = 1.0 - lr * wd
    assert r["angle_eq"] == pytest.approx(math.acos(aw.adamw_equilibrium_cos(1 - q, b1, 0.99)),
                                          rel=tolerance("float64").rtol)
    # equilibrium norm^2 -> lr C / (2 wd) (Kosson et al.) as d -> 0; the exact one is the fixed point of dynamics.laws
    assert r["norm_eq"] ** 2 == pytest.approx(float(aw.fixed_point_adamw(lr, lr * wd, b1, m.w.numel(), 0.99)),
                                              rel=tolerance("float64").rtol)
    summary = {}
    assert hook.on_end(summary)["groups"]["w"]["law"] == "adamw/torch" and not mon._handles
    assert summary["equilibrium"]["steps"] == 6
    # the lazy form (the trainer's protocol): gauges decided from the model at on_start


    lazy = TrainHook.lazy(lambda model, info: ["w"])
    assert lazy.on_start(m, opt, None)["equilibrium_groups"] == ["w"]
    m(torch.randn(4, 8, dtype=torch.float64)).backward()
    opt.step()
    assert lazy.after_step(7, lr)["groups"]["w"]["law"] == "adamw/torch"
    lazy.on_end({})
    # an optimizer without a law: recorded, with "no prediction"
    opt2 = torch.optim.RMSprop(m.parameters(), lr=1e-3)
    mon2 = EquilibriumMonitor(m, opt2, ["w"])
    m(torch.randn(4, 8, dtype=torch.float64)).backward()
    opt2.step()
    assert mon2.history[0]["groups"]["w"]["law"] == "none" and mon2.history[0]["groups"]["w"]["angle_eq"] is None
    nest = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1)
    # Nesterov has its law (dynamics.heavyball)
    assert optlaws.resolve(nest, nest.param_groups[0], m.w).label == "nesterov/l2"
    mon.plot(tmp_path / "eq.png")
    assert (tmp_path / "eq.png").stat().st_size > 0


def test_first_order_forms_are_the_small_d_limits_of_the_laws():
    # the first-order AdamW forms (Kosson et al.) are the small-d limits of the exact laws: sqrt(2 d (1-b1)/(1+b1)) and
    # sqrt(lr C/(2 wd)); relaxation -1/(2 ln(1 - lr wd)); the momentum angle is (q+mu)/(1+mu q), not sqrt(2d/(1+mu))
    lr, wd, b1, C = 1e-4, 0.1, 0.9, 256
    d = lr * wd
    first = math.sqrt(2 * d * (1 - b1) / (1 + b1))
    assert abs(laws.equilibrium_angle("adamw", "torch", lr, wd, betas=(b1, 0.999)) / first - 1) <= 2 * d
    assert abs(laws.adamw_equilibrium_norm(lr, wd, C, b1) ** 2 / (lr * C / (2 * wd)) - 1) <= 2 * d / (1 - b1)
    assert laws.relaxation_steps("adamw", "torch", lr, wd) == pytest.approx(-1 / (2 * math.log1p(-d)),
                                                                             rel=tolerance("float64").rtol)
    norm = laws.adamw_equilibrium_norm(lr, wd, C, b1)
    assert abs(laws.random_walk_angle(lr, norm, C, b1, d) / first - 1) <= 2 * d / (1 - b1)  # via the norm's O(d)


def _adamw_steps(m: nn.Module, opt: torch.optim.Optimizer, n: int, gen: torch.Generator) -> None:
    for _ in range(n):
        m(torch.randn(8, 8, dtype=torch.float64, generator=gen)).backward()
        opt.step()
        opt.zero_grad()


def test_train_hook_state_resumes_bit_for_bit():
    # the trainer stores state_dict() in its checkpoint and hands it back before on_start: a resumed monitor must
    # record what the uninterrupted one records (same steps, same G^2 running mean, same first norm, same summary)


    def run(split: int | None) -> tuple[list, dict]:
        torch.manual_seed(0)
        m = HeadNormToy()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.5)
        gen = torch.Generator().manual_seed(1)
        logged: list = []
        info = type("Info", (), {"log": staticmethod(logged.append), "is_main": True})()
        hook = TrainHook.lazy(lambda model, i: _blocks(), interval=2)
        hook.on_start(m, opt, info)
        if split is None:
            _adamw_steps(m, opt, 7, gen)
            for step in range(7):
                hook.after_step(step + 1)
            return logged, hook.on_end({})
        _adamw_steps(m, opt, split, gen)
        hook.after_step(split)
        state = json.loads(json.dumps(hook.state_dict()))  # plain data: survives any serialization
        hook.on_end({})
        resumed = TrainHook.lazy(lambda model, i: _blocks(), interval=2)
        resumed.load_state_dict(state)  # before on_start, as the loop does
        resumed.on_start(m, opt, info)
        _adamw_steps(m, opt, 7 - split, gen)
        resumed.after_step(7)
        return logged, resumed.on_end({})

    full_log, full = run(None)
    part_log, part = run(3)
    assert [r["step"] for r in full_log] == [1, 2, 4, 6] and full_log == part_log
    assert full == part


def test_train_hook_attaches_nothing_without_gauges_or_off_rank_0():


    m = HeadNormToy()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    empty = TrainHook.lazy(lambda model, info: [])
    assert empty.on_start(m, opt, None) == {"equilibrium_groups": [], "gauge_census": {"source": "given",
                                                                                        "gauges": []}}
    m(torch.randn(4, 8, dtype=torch.float64)).backward()
    opt.step()
    assert empty.after_step(1) is None and empty.state_dict() == {}
    summary: dict = {}
    assert empty.on_end(summary) == {"steps": 0, "groups": {}} and summary["equilibrium"]["groups"] == {}
    asked = []
    other_rank = TrainHook.lazy(lambda model, info: asked.append(1) or ["w"])
    assert other_rank.on_start(m, opt, type("Info", (), {"is_main": False})()) == {} and not asked
    assert other_rank.after_step(1) is None


def test_partial_gauge_blocks_are_not_merged_into_the_whole_tensor():
    # per_block=False merges a tensor's blocks only when they tile it: the rows outside a partial gauge's blocks
    # are no gauge, so a whole-tensor group would be monitored against a law that does not apply to it
    from dynamics.monitor import gauge_groups

    m = HeadNormToy()
    whole = gauge_groups(m, {"w": [(0, 0, 4), (0, 4, 8)]}, per_block=False)
    assert [(g.name, g.axis) for g in whole] == [("w", None)]
    part = gauge_groups(m, {"w": [(0, 0, 4)]}, per_block=False)
    assert [(g.name, g.axis, g.start, g.stop) for g in part] == [("w[rows 0:4]", 0, 0, 4)]


# ------------------------------------------------------------------------------------------------ SGD family
def test_sgd_predicted_norm_uses_the_mean_square_gradient_statistic():
    """The SGD equilibrium norm needs G^2 = E[(||g_I|| ||W_I||)^2], a mean of *squares*: sqrt(mean G^2) differs from
    mean G by the spread of G (here G varies by tens of percent across batches), so a monitor that averaged the
    unsquared statistic would predict a different norm.  Checked by hand, per block, to float64 round-off."""
    torch.manual_seed(0)
    m = HeadNormToy()
    lr, wd, mu = 0.05, 0.1, 0.9
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=mu, weight_decay=wd)
    mon = EquilibriumMonitor(m, opt, _blocks())
    G: dict[str, list[float]] = {"w[rows 0:4]": [], "w[rows 4:8]": []}
    for _ in range(12):
        m(torch.randn(16, 8, dtype=torch.float64)).backward()
        for (_, s0, s1), name in zip(_blocks()["w"], G):
            G[name].append(float(m.w.grad[s0:s1].norm() * m.w[s0:s1].detach().norm()))
        opt.step()
        opt.zero_grad()
    for name, gs in G.items():
        G2 = sum(g * g for g in gs) / len(gs)
        by_hand = (lr * (1 + mu) * G2 / (2 * wd * (1 - mu) * ((1 + mu) - lr * wd / 2))) ** 0.25  # Wan et al., exact
        got = mon.history[-1]["groups"][name]["norm_eq"]
        assert abs(got - by_hand) <= tolerance("float64", size=len(gs), depth=8).bound(by_hand), (name, got, by_hand)
        unsquared = (sum(gs) / len(gs)) ** 2
        assert abs(G2 / unsquared - 1) > 1e3 * tolerance("float64", size=len(gs)).rtol  # the two statistics differ


def test_monitor_sgd_momentum_steps_to_equilibrium_match_simulation():
    """SGD, momentum 0.9, coupled L2, on the random-walk gauge (one gauge per row).  The monitor's
    predicted steps to equilibrium (the second-moment map iterated from the first recorded state) match the steps
    its groups take, within one relaxation time; the old plain-SGD relaxation (1/(4 lr wd)) was ~1/(1-mu) too long."""
    R, n, lr, wd, mu = 16, 256, 0.1, 0.02, 0.9
    holder = nn.Module()
    gen = torch.Generator().manual_seed(0)
    holder.w = nn.Parameter(torch.randn(R, n, dtype=torch.float64, generator=gen) * 3.0)
    opt = torch.optim.SGD([holder.w], lr=lr, momentum=mu, weight_decay=wd)
    mon = EquilibriumMonitor(holder, opt, {"w": [(0, r, r + 1) for r in range(R)]})
    for _ in range(260):
        w = holder.w.detach()
        xi = torch.randn(R, n, dtype=torch.float64, generator=gen)
        holder.w.grad = (xi - w * (xi * w).sum(1, keepdim=True) / (w * w).sum(1, keepdim=True)) / w.norm(dim=1,
                                                                                                    keepdim=True)
        opt.step()
    s = mon.summary()["groups"]
    tau = laws.relaxation_steps("sgdm", "l2", lr, wd, momentum=mu)
    assert all(r["relax_steps"] == pytest.approx(tau, rel=tolerance("float64", size=9).rtol) for r in s.values())
    pred = [r["steps_to_eq_predicted"] for r in s.values()]
    meas = [r["steps_to_eq_measured"] for r in s.values()]
    assert abs(float(np.median(meas)) - float(np.median(pred))) <= tau, (pred, meas, tau)
    momentum_free = laws.steps_to_equilibrium(mon.stats(mon.groups[0]).x0, s["w[rows 0:1]"]["norm_eq"] ** 2,
                                    laws.relaxation_factor(lr * wd), mon.band)
    assert momentum_free > 3 * float(np.median(meas))  # relaxing by q = 1 - lr wd alone is far too slow
    tail = [r["norm_last"] / r["norm_eq"] for r in s.values()]
    assert abs(float(np.mean(tail)) - 1) <= SE_SIGMAS * float(np.std(tail, ddof=1)) / math.sqrt(R) + 4 / n


def test_schedule_lag_is_recorded_and_reported():
    torch.manual_seed(0)
    m = HeadNormToy()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.8**step)  # far faster than 1/(2 lr wd) = 200 steps
    said: list[str] = []
    mon = EquilibriumMonitor(m, opt, ["w"], on_lag=said.append)
    for _ in range(4):
        m(torch.randn(16, 8, dtype=torch.float64)).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    lags = mon.series("w", "lag")[1]
    assert len(said) == 1 and "faster than the norm can follow" in said[0]
    assert lags and min(lags) > mon.band  # relaxation ~200 steps x |ln 0.8| per step of x* ~ 45: far behind
    assert "warning: the learning-rate schedule" in mon.table()
    with pytest.warns(EquilibriumLagWarning, match="faster than the norm can follow"):
        m2 = HeadNormToy()
        opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-2, weight_decay=0.5)
        sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda step: 0.8**step)
        EquilibriumMonitor(m2, opt2, ["w"], on_lag=lambda msg: warnings.warn(msg, EquilibriumLagWarning, stacklevel=2))
        for _ in range(3):
            m2(torch.randn(16, 8, dtype=torch.float64)).backward()
            opt2.step()
            sched2.step()
    # a constant schedule never lags
    m3 = HeadNormToy()
    opt3 = torch.optim.AdamW(m3.parameters(), lr=1e-2, weight_decay=0.5)
    mon3 = EquilibriumMonitor(m3, opt3, ["w"], on_lag=said.append)
    for _ in range(3):
        m3(torch.randn(16, 8, dtype=torch.float64)).backward()
        opt3.step()
    assert mon3.series("w", "lag")[1] == [] and len(said) == 1 and "warning" not in mon3.summary()


@pytest.mark.parametrize("heads", [2, 32])
def test_plot_is_readable_with_many_groups(tmp_path, heads):
    torch.manual_seed(0)
    m = HeadNormToy(d=64, heads=heads)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.5)
    mon = EquilibriumMonitor(m, opt, _blocks(64, heads))
    for _ in range(3):
        m(torch.randn(4, 64, dtype=torch.float64)).backward()
        opt.step()
    from dynamics.monitor import plot as monitor_plot

    out = tmp_path / f"eq{heads}.png"
    mon.plot(out)
    assert out.stat().st_size > 0 and (len(mon.groups) <= monitor_plot.FEW) == (heads == 2)


def test_monitor_lion_and_muon_records():
    from dynamics.lion import Lion

    torch.manual_seed(0)
    m = HeadNormToy()
    opt = Lion(m.parameters(), lr=1e-3, weight_decay=1.0)
    mon = EquilibriumMonitor(m, opt, _blocks())
    m(torch.randn(16, 8, dtype=torch.float64)).backward()
    opt.step()
    r = mon.history[-1]["groups"]["w[rows 0:4]"]
    assert r["law"] == "lion" and r["norm_eq"] ** 2 == pytest.approx(
        float(sf.fixed_point(1e-3, 1e-3, 32, sf.lion_correlation_sum(1e-3, 0.9, 0.99))), rel=tolerance("float64").rtol)
    assert r["nu"] == pytest.approx(32, rel=tolerance("float64", size=32, depth=4).rtol / 1e-6)  # every entry +-1
    if hasattr(torch.optim, "Muon"):
        m = HeadNormToy()
        opt = torch.optim.Muon([m.w], lr=1e-2, weight_decay=0.1, momentum=0.0)
        mon = EquilibriumMonitor(m, opt, ["w"])
        m(torch.randn(16, 8, dtype=torch.float64)).backward()
        opt.step()
        r = mon.history[-1]["groups"]["w"]
        assert r["law"] == "muon" and r["nu_nominal"] == 8 and r["angle_eq"] == pytest.approx(
            math.acos(1 - 1e-3), rel=tolerance("float64").rtol)


# ------------------------------------------------------------------------------------------------ the monitor as a tool
def _random_walk_run(opt_of, R: int, n: int, steps: int, scale: float, schedule=None,
                     radial: float = 0.0) -> EquilibriumMonitor:
    """One gauge per row of W (R, n): each step's gradient is a random direction orthogonal to its row, of norm
    1/||row|| (the random-walk model the laws are exact for), stepped by the real torch optimizer.  ``radial``
    adds ``radial * W`` to it: a pull towards 0 the loss of a gauge cannot have (the laws do not describe it)."""
    holder = nn.Module()
    gen = torch.Generator().manual_seed(0)
    holder.w = nn.Parameter(torch.randn(R, n, dtype=torch.float64, generator=gen) * scale)
    opt = opt_of([holder.w])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule) if schedule is not None else None
    mon = EquilibriumMonitor(holder, opt, {"w": [(0, r, r + 1) for r in range(R)]})
    for _ in range(steps):
        w = holder.w.detach()
        xi = torch.randn(R, n, dtype=torch.float64, generator=gen)
        holder.w.grad = (xi - w * (xi * w).sum(1, keepdim=True) / (w * w).sum(1, keepdim=True)) / w.norm(
            dim=1, keepdim=True) + radial * w
        opt.step()
        if sched is not None:
            sched.step()
    return mon


def test_predictions_follow_the_schedule_the_run_had():
    """Linear decay to lr/T (the HF Trainer's default): the equilibrium at the last lr is far below the norm, which
    cannot follow it.  The monitor says so (status, a readable gap), predicts the norm along the schedule the run
    had (the law's own map stepped with each record's lr), and its steps to equilibrium match the measured ones."""
    import re

    from dynamics.monitor.table import LAGGING

    R, n, lr, wd, mu, T = 16, 256, 0.1, 0.02, 0.9, 200
    mon = _random_walk_run(lambda ps: torch.optim.SGD(ps, lr=lr, momentum=mu, weight_decay=wd), R, n, T, 0.3,
                           schedule=lambda t: 1 - t / T)
    s = mon.summary()
    groups = s["groups"].values()
    assert all(r["scheduled"] and r["lr_last"] == pytest.approx(lr / T, rel=tolerance("float64").rtol) for r in groups)
    # the norm the laws predict along the run's schedule is the measured one (random-walk noise and O(1/n))
    ratio = [r["norm_last"] / r["norm_track"] for r in groups]
    assert abs(float(np.mean(ratio)) - 1) <= SE_SIGMAS * float(np.std(ratio, ddof=1)) / math.sqrt(R) + 4 / n
    # while the equilibrium of the last lr is far from it: the norm lags the schedule
    assert all(abs(r["norm_gap"] ** 2 - 1) > mon.band and r["status"] == LAGGING for r in groups)
    tau = laws.relaxation_steps("sgdm", "l2", lr, wd, momentum=mu)
    pred = [r["steps_to_eq_predicted"] for r in groups]
    meas = [r["steps_to_eq_measured"] for r in groups]
    assert abs(float(np.median(pred)) - float(np.median(meas))) <= tau, (pred, meas, tau)
    table = mon.table()
    assert re.search(r"\|W\| x\d+\.\d above \|W\|\*\(lr\)", table) and "lagging the schedule" in table
    assert "warning: the learning-rate schedule" in table and not re.search(r"\d{4,}%", table)  # no 11551987%


@pytest.mark.parametrize(("steps", "scale", "schedule", "radial", "status"), [
    (20, 3.0, None, 0.0, "approaching"),  # 20 steps of a relaxation time of ~50 from 3x the norm
    (200, 0.15, None, 0.0, "at equilibrium"),
    (300, 0.15, lambda t: 1 - 0.1 * t / 300, 0.0, "tracking the schedule"),  # slow enough to follow
    (200, 0.15, None, 0.01, "off equilibrium (the law puts it inside the band)"),  # no gauge: an extra pull
])
def test_status_says_where_each_group_stands(steps, scale, schedule, radial, status):
    mon = _random_walk_run(lambda ps: torch.optim.SGD(ps, lr=0.5, weight_decay=0.01), 8, 256, steps, scale,
                           schedule=schedule, radial=radial)
    s = mon.summary()
    assert all(r["status"] == status for r in s["groups"].values()), [r["status"] for r in s["groups"].values()]
    assert s["model"]["status_counts"] == {status: 8} and f"model, 8 groups: {status} 8" in mon.table()


def test_x0_is_the_squared_norm_before_the_first_step():
    torch.manual_seed(0)
    m = HeadNormToy()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.5)
    mon = EquilibriumMonitor(m, opt, _blocks())
    w0 = m.w.detach().clone()
    m(torch.randn(16, 8, dtype=torch.float64)).backward()
    opt.step()
    for g in mon.groups:
        norm0 = float(g.view(w0).double().norm())
        assert mon.stats(g).x0 == norm0**2 and mon.state_dict()["x0"][g.name] == norm0**2  # exactly, float64
        assert mon.summary()["groups"][g.name]["norm_first"] == math.sqrt(norm0**2)
        assert float(g.view(m.w.detach()).double().norm()) ** 2 != norm0**2  # the step moved it


def _nested(rows: int = 68, heads: int = 2) -> nn.Module:
    """``model.layers.0.self_attn.q_proj.weight`` (rows, 8), as a Hugging Face model names it."""
    top = nn.Module()
    top.model = nn.Module()
    top.model.layers = nn.ModuleList([nn.Module()])
    top.model.layers[0].self_attn = nn.Module()
    top.model.layers[0].self_attn.q_proj = nn.Linear(8, rows, bias=False, dtype=torch.float64)
    return top


def test_table_names_what_users_look_for_and_never_cuts_a_group_apart():
    from dynamics.monitor.table import COLUMNS

    torch.manual_seed(0)
    m = _nested()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    name = "model.layers.0.self_attn.q_proj.weight"
    mon = EquilibriumMonitor(m, opt, {name: [(0, 0, 34), (0, 34, 68)]})
    for _ in range(3):
        m.model.layers[0].self_attn.q_proj(torch.randn(4, 8, dtype=torch.float64)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    lines = mon.table().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("group "))
    rows = lines[header + 2: header + 4]
    assert [r.split()[0] for r in rows] == ["weight[rows", "weight[rows"] and "weight[rows 0:34]" in rows[0] \
        and "weight[rows 34:68]" in rows[1]  # the shared prefix dropped, the part that tells them apart whole
    assert any(line.startswith("model, 2 groups:") for line in lines[:header])  # the roll-up comes first
    assert any("median group: eff lr" in line for line in lines[:header])
    assert any("worst group:" in line for line in lines[:header])
    legend = lines[lines.index("columns:") + 1:]
    assert [line.split("  ")[1].strip() for line in legend] == [h for h, _ in COLUMNS]
    assert all(head in lines[header] for head, _ in COLUMNS)  # every column printed is explained


def test_param_groups_are_read_from_the_optimizer_at_each_record():
    torch.manual_seed(0)
    m = HeadNormToy()
    opt = torch.optim.AdamW([{"params": [m.out]}, {"params": [m.w]}], lr=0.01, weight_decay=0.1)
    mon = EquilibriumMonitor(m, opt, ["w"])
    _adamw_steps(m, opt, 1, torch.Generator().manual_seed(1))
    opt.param_groups.pop()
    opt.add_param_group({"params": [m.w], "lr": 5e-3, "weight_decay": 0.5})
    _adamw_steps(m, opt, 1, torch.Generator().manual_seed(2))
    moved = mon.history[-1]["groups"]["w"]
    assert (moved["lr"], moved["wd"]) == (5e-3, 0.5)
    assert moved["angle_eq"] == laws.equilibrium_angle("adamw", "torch", 5e-3, 0.5, betas=(0.9, 0.999))
    opt.param_groups.pop()
    _adamw_steps(m, opt, 1, torch.Generator().manual_seed(3))
    gone = mon.history[-1]["groups"]["w"]
    assert gone["norm_eq"] is None and gone["angle_eq"] is None and gone["angle"] == 0.0
    assert mon.summary()["groups"]["w"]["status"] == "not stepped (not in the optimizer)"


@pytest.mark.parametrize(("make", "later_lr", "status"), [
    (lambda ps: torch.optim.AdamW(ps, lr=2.0, weight_decay=1.0), None, "no equilibrium (lr*wd >= 1)"),
    (lambda ps: torch.optim.SGD(ps, lr=3.0, weight_decay=1.0), None, "no equilibrium (lr*wd >= 1)"),
    (lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1), -1e-3, "no law (negative lr)"),
    (lambda ps: torch.optim.SGD(ps, lr=1e-3, weight_decay=0.1), -1e-3, "no law (negative lr)"),
    (lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, weight_decay=0.1), 0.0, "no motion (lr 0)"),
])
def test_a_law_outside_its_domain_never_stops_the_training(make, later_lr, status):
    torch.manual_seed(0)
    m = HeadNormToy()
    opt = make(m.parameters())
    mon = EquilibriumMonitor(m, opt, _blocks())
    gen = torch.Generator().manual_seed(1)
    _adamw_steps(m, opt, 2, gen)
    if later_lr is not None:
        for pg in opt.param_groups:
            pg["lr"] = later_lr
    _adamw_steps(m, opt, 2, gen)
    assert [h["step"] for h in mon.history] == [1, 2, 3, 4]
    s = mon.summary()
    assert all(r["status"] == status for r in s["groups"].values()), s["groups"]
    assert all(r["norm_eq"] is None for r in mon.history[-1]["groups"].values())
    assert status in mon.table()


@pytest.mark.parametrize("key", ["G2_sum", "history", "last_law"])
def test_loading_a_state_without_a_key_names_it(key):
    torch.manual_seed(0)
    m = HeadNormToy()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    mon = EquilibriumMonitor(m, opt, ["w"])
    _adamw_steps(m, opt, 1, torch.Generator().manual_seed(1))
    state = mon.state_dict()
    del state[key]
    with pytest.raises(ValueError, match=rf"^monitor state: missing key '{key}'") as e:
        EquilibriumMonitor(m, opt, ["w"]).load_state_dict(state)
    assert "\n" not in str(e.value)


def test_a_log_that_exists_is_appended_to_or_refused_never_truncated(tmp_path):
    from dynamics.monitor import EquilibriumLogWarning, read_records

    def monitor(log):
        torch.manual_seed(0)
        m = HeadNormToy()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.5)
        return m, opt, EquilibriumMonitor(m, opt, _blocks(), log_path=log)

    mine = tmp_path / "mine.jsonl"
    mine.write_text("a user's own lines\n")
    with pytest.raises(ValueError, match=r"^log_path: .*mine.jsonl exists and holds no equilibrium record") as e:
        monitor(mine)
    assert mine.read_text() == "a user's own lines\n" and "\n" not in str(e.value)
    # uninterrupted, and resumed the documented way: a new monitor on the same log, then load_state_dict
    m, opt, full = monitor(tmp_path / "full.jsonl")
    _adamw_steps(m, opt, 6, torch.Generator().manual_seed(1))
    log = tmp_path / "eq.jsonl"
    m, opt, first = monitor(log)
    gen = torch.Generator().manual_seed(1)
    _adamw_steps(m, opt, 3, gen)
    first.detach()
    before = log.read_text()
    resumed = EquilibriumMonitor(m, opt, _blocks(), log_path=log)
    assert log.read_text() == before  # building it wipes nothing
    resumed.load_state_dict(first.state_dict())
    _adamw_steps(m, opt, 3, gen)
    assert log.read_text().startswith(before)
    assert [r["step"] for r in read_records(log)] == [1, 2, 3, 4, 5, 6]
    assert read_records(log) == read_records(tmp_path / "full.jsonl")
    assert json.loads(log.read_text().splitlines()[3]) == {"event": "resume", "step": 3}
    # a fresh monitor onto that run's log: the file is left as it is, the training goes on
    whole = log.read_text()
    m, opt, fresh = monitor(log)
    with pytest.warns(EquilibriumLogWarning, match="did not resume it"):
        _adamw_steps(m, opt, 2, torch.Generator().manual_seed(1))
    assert log.read_text() == whole and len(fresh.history) == 2
    # a state that is not the run the log holds
    other = EquilibriumMonitor(m, opt, _blocks(), log_path=tmp_path / "full.jsonl")
    state = fresh.state_dict()
    state["history"] = [{**state["history"][-1], "step": 99}]
    with pytest.raises(ValueError, match=r"holds no record of step 99"):
        other.load_state_dict(state)


def test_monitor_writes_tensorboard_scalars_with_plain_names():
    import re

    class Writer:
        def __init__(self) -> None:
            self.scalars: list[tuple[str, float, int]] = []

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            self.scalars.append((tag, value, step))

    torch.manual_seed(0)
    m = HeadNormToy()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.5)
    writer = Writer()
    mon = EquilibriumMonitor(m, opt, _blocks(), tensorboard=writer)
    _adamw_steps(m, opt, 2, torch.Generator().manual_seed(1))
    tags = {t for t, _, _ in writer.scalars}
    assert "equilibrium/w/rows_0-4/eff_lr_over_eq" in tags and "equilibrium/all/norm_over_eq_median" in tags
    assert all(re.fullmatch(r"[A-Za-z0-9_./-]+", t) for t in tags) and {s for _, _, s in writer.scalars} == {1, 2}
    r = mon.history[-1]["groups"]["w[rows 0:4]"]
    assert ("equilibrium/w/rows_0-4/eff_lr", r["angle"], 2) in writer.scalars
