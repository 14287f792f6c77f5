"""dynamics.rotational: the rotational variants hold every gauge group at its equilibrium angle from step 1."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from dynamics.monitor import EquilibriumMonitor
from dynamics.rotational import rotational_adamw, rotational_sgd
from rmsgauge import tolerance


def _model():
    from lm.dense import DenseConfig, DenseTransformer

    torch.manual_seed(0)
    cfg = DenseConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64, block_size=16)
    gauges = {f"blocks.0.attn.{w}_proj.weight": [(0, h * 8, h * 8 + 8) for h in range(4)] for w in "qk"}
    return DenseTransformer(cfg).double(), gauges


@pytest.mark.parametrize("variant", ["adamw", "sgdm"])
def test_rotational_angle_from_step_one_and_norm_held(variant):
    m, gauges = _model()
    lr, wd = (3e-3, 0.1) if variant == "adamw" else (0.05, 0.01)
    if variant == "adamw":
        opt = rotational_adamw(m, gauges, lr=lr, betas=(0.9, 0.95), weight_decay=wd)
        q = 1 - lr * wd
        phi = math.acos((q + 0.9) / (1 + 0.9 * q))  # AdamW's exact equilibrium angle, by hand
    else:
        opt = rotational_sgd(m, gauges, lr=lr, momentum=0.9, weight_decay=wd)
        phi = math.acos(1 - lr * wd / 1.9)  # SGD+momentum with coupled L2: cos phi* = 1 - lr wd/(1 + mu)
    mon = EquilibriumMonitor(m, opt, gauges)
    held = {g.name: float(g.view(dict(m.named_parameters())[g.param]).detach().norm()) for g in mon.groups}
    for _ in range(6):
        x = torch.randint(0, 256, (2, 16))
        m(x, x)[1].backward()
        opt.step()
        opt.zero_grad()
    n = 8 * 32
    ang_tol = tolerance("float64", size=n, depth=len(mon.history))  # atan2 angle: absolute error of round-off
    for h in mon.history:  # from step 1
        for name, r in h["groups"].items():
            assert abs(r["angle"] - phi) <= ang_tol.bound(phi), (h["step"], name, r["angle"], phi)
            assert abs(r["norm"] - held[name]) <= tolerance("float64", size=n, depth=h["step"]).bound(held[name])
            assert r["angle_eq"] == pytest.approx(phi, rel=ang_tol.rtol)


def test_rotational_leaves_other_parameters_to_the_base_optimizer():
    # step 1 from the same gradients: every non-gauge parameter moves exactly as under plain AdamW
    m, gauges = _model()
    ref = copy.deepcopy(m)
    opt = rotational_adamw(m, gauges, lr=3e-3, weight_decay=0.1)
    base = torch.optim.AdamW(ref.parameters(), lr=3e-3, weight_decay=0.1)
    x = torch.randint(0, 256, (2, 16))
    for model, o in ((m, opt), (ref, base)):
        model(x, x)[1].backward()
        o.step()
    rp = dict(ref.named_parameters())
    for name, p in m.named_parameters():
        if name not in gauges:
            assert torch.equal(p, rp[name]), name
    with pytest.raises(ValueError, match="weight_decay"):
        rotational_adamw(m, gauges, lr=1e-3, weight_decay=0.0)
