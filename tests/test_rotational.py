"""dynamics.rotational: the rotational variants hold every gauge unit at its equilibrium angle from step 1, with
parameter groups, a no-decay list, per-neuron units and one-line errors; the other parameters follow the base
optimizer bit for bit."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import dynamics.scalefree as sf
from dynamics.lion import Lion
from dynamics.monitor import EquilibriumMonitor
from dynamics.rotational import rotational_adamw, rotational_lion, rotational_sgd
from rmsgauge import tolerance


def _model():
    from lm.dense import DenseConfig, DenseTransformer

    torch.manual_seed(0)
    cfg = DenseConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64, block_size=16)
    gauges = {f"blocks.0.attn.{w}_proj.weight": [(0, h * 8, h * 8 + 8) for h in range(4)] for w in "qk"}
    return DenseTransformer(cfg).double(), gauges


def _phi(variant: str, lr: float, wd: float) -> float:
    """The base optimizer's exact equilibrium angle, by hand."""
    if variant == "adamw":
        q = 1 - lr * wd
        return math.acos((q + 0.9) / (1 + 0.9 * q))
    if variant == "sgdm":
        return math.acos(1 - lr * wd / 1.9)  # SGD+momentum with coupled L2: cos phi* = 1 - lr wd/(1 + mu)
    d = lr * wd
    return math.acos(float(sf.equilibrium_cos(d, sf.lion_correlation_sum(d, 0.9, 0.99))))


def _make(variant: str, m, gauges, lr: float, wd: float, **kw):
    if variant == "adamw":
        return rotational_adamw(m, gauges, lr=lr, betas=(0.9, 0.95), weight_decay=wd, **kw)
    if variant == "sgdm":
        return rotational_sgd(m, gauges, lr=lr, momentum=0.9, weight_decay=wd, **kw)
    return rotational_lion(m, gauges, lr=lr, betas=(0.9, 0.99), weight_decay=wd, **kw)


SETTINGS = {"adamw": (3e-3, 0.1), "sgdm": (0.05, 0.01), "lion": (1e-4, 1.0)}


@pytest.mark.parametrize("per_neuron", [False, True])
@pytest.mark.parametrize("variant", list(SETTINGS))
def test_rotational_angle_from_step_one_and_norm_held(variant, per_neuron):
    m, gauges = _model()
    lr, wd = SETTINGS[variant]
    opt = _make(variant, m, gauges, lr, wd, per_neuron=per_neuron)
    phi = _phi(variant, lr, wd)
    # per neuron: every row of every head block is its own unit (REQ's per_neuron option)
    unit_gauges = {n: [(0, r, r + 1) for r in range(32)] for n in gauges} if per_neuron else gauges
    mon = EquilibriumMonitor(m, opt, unit_gauges)
    held = {g.name: float(g.view(dict(m.named_parameters())[g.param]).detach().norm()) for g in mon.groups}
    for _ in range(4):
        x = torch.randint(0, 256, (2, 16))
        m(x, x)[1].backward()
        opt.step()
        opt.zero_grad()
    n = 32 if per_neuron else 8 * 32
    ang_tol = tolerance("float64", size=n, depth=len(mon.history))  # atan2 angle: absolute error of round-off
    for h in mon.history:  # from step 1
        for name, r in h["groups"].items():
            assert abs(r["angle"] - phi) <= ang_tol.bound(phi), (h["step"], name, r["angle"], phi)
            assert abs(r["norm"] - held[name]) <= tolerance("float64", size=n, depth=h["step"]).bound(held[name])
            assert r["angle_eq"] == pytest.approx(phi, rel=ang_tol.rtol)


REF = {"adamw": lambda groups: torch.optim.AdamW(groups, betas=(0.9, 0.95)),
       "sgdm": lambda groups: torch.optim.SGD(groups, momentum=0.9),
       "lion": lambda groups: Lion(groups, betas=(0.9, 0.99))}


@pytest.mark.parametrize("variant", list(SETTINGS))
def test_other_parameters_follow_the_base_optimizer_bit_for_bit_in_every_group(variant):
    # three groups (defaults, an embedding group with its own lr and decay, the head), a no-decay list, and the gauges
    m, gauges = _model()
    ref = copy.deepcopy(m)
    lr, wd = SETTINGS[variant]
    groups = [{"params": ["tok_emb.*", "norm_f.weight"], "lr": lr / 3, "weight_decay": wd / 2},
              {"params": ["blocks.0.attn.q_proj.weight", "blocks.0.mlp.*"], "lr": lr * 2}]
    no_decay = ["*norm*"]  # the norm gains (this model has no biases)
    names = [n for n, _ in m.named_parameters()]
    assert any(n.startswith("tok_emb") for n in names) and any("norm" in n for n in names)
    opt = _make(variant, m, gauges, lr, wd, groups=groups, no_decay=no_decay)
    rp = dict(ref.named_parameters())
    import fnmatch

    def owner(n):
        return next((i for i, g in enumerate(groups) if any(fnmatch.fnmatchcase(n, p) for p in g["params"])), -1)

    ref_groups = []
    for i in (-1, 0, 1):
        spec = {"lr": lr, "weight_decay": wd} if i < 0 else {"lr": lr, "weight_decay": wd, **groups[i]}
        spec.pop("params", None)
        mine = [n for n in names if owner(n) == i]
        decay = [rp[n] for n in mine if not any(fnmatch.fnmatchcase(n, p) for p in no_decay)]
        plain = [rp[n] for n in mine if any(fnmatch.fnmatchcase(n, p) for p in no_decay)]
        ref_groups += [{**spec, "params": decay}, {**spec, "params": plain, "weight_decay": 0.0}]
    base = REF[variant]([g for g in ref_groups if g["params"]])
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):  # the same gradients reach both (the gauges differ after step 1, so would the gradients)
        x = torch.randint(0, 256, (2, 16), generator=gen)
        m(x, x)[1].backward()
        for n, p in m.named_parameters():
            rp[n].grad = p.grad.clone()
        for o in (opt, base):
            o.step()
            o.zero_grad()
    lrs = {pg["lr"] for pg in opt.param_groups}
    assert lrs == {lr, lr / 3, lr * 2}  # each group keeps its own lr (schedulers scale them separately)
    for name, p in m.named_parameters():
        if name not in gauges:
            assert torch.equal(p, rp[name]), name
    # the q_proj gauge sits in groups[1]: it turns by that group's angle (lr * 2), the k_proj gauge by the default one
    assert opt.rotational_angle(opt._pg[id(dict(m.named_parameters())["blocks.0.attn.q_proj.weight"])]) == \
        pytest.approx(_phi(variant, 2 * lr, wd), rel=tolerance("float64").rtol)


@pytest.mark.parametrize(("kw", "message"), [
    ({"lr": math.nan}, r"^lr must be in \(0, inf\), got nan$"),
    ({"lr": math.inf}, r"^lr must be in \(0, inf\), got inf$"),
    ({"lr": 0.0}, r"^lr must be in \(0, inf\), got 0.0$"),
    ({"lr": -1e-3}, r"^lr must be in \(0, inf\), got -0.001$"),
    ({"weight_decay": math.nan}, r"^weight_decay must be in \(0, inf\), got nan$"),
    ({"weight_decay": 0.0}, r"^weight_decay must be in \(0, inf\), got 0.0$"),
    ({"lr": 2.0, "weight_decay": 0.5}, r"^lr \* weight_decay must be in \[0, 1\), got 1.0$"),
    ({"groups": [{"params": ["nope.*"]}]}, r"^groups\[0\].params: no parameter named or matching 'nope\.\*'"),
    ({"groups": [{"params": ["tok_emb.weight"], "lr": math.nan}]}, r"^groups\[0\].lr must be in \(0, inf\), got nan$"),
    ({"groups": [{"params": ["blocks.0.attn.q_proj.weight"], "weight_decay": 0.0}]},
     r"^groups\[0\].weight_decay must be in \(0, inf\), got 0.0$"),
    ({"groups": [{"params": ["tok_emb.weight"], "lr": 4.0, "weight_decay": 0.5}]},
     r"^groups\[0\].lr \* weight_decay must be in \[0, 1\), got 2.0$"),
    ({"groups": [{"params": ["tok_emb.weight"]}, {"params": ["tok_*"]}]}, r"already in groups\[0\]"),
    ({"groups": [{"params": ["tok_emb.weight"], "momentun": 0.5}]}, r"unknown: \['momentun'\]"),
    ({"no_decay": ["missing.bias"]}, r"^no_decay: no parameter named or matching 'missing.bias'"),
    ({"no_decay": ["blocks.0.attn.k_proj.weight"]}, r"^no_decay names gauge tensor"),
])
def test_one_line_errors(kw, message):
    m, gauges = _model()
    args = {"lr": 3e-3, "weight_decay": 0.1, **kw}
    with pytest.raises(ValueError, match=message) as e:
        rotational_adamw(m, gauges, **args)
    assert "\n" not in str(e.value)


def test_a_schedule_that_breaks_the_range_is_refused_at_the_step():
    m, gauges = _model()
    opt = rotational_sgd(m, gauges, lr=0.5, momentum=0.9, weight_decay=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt.base, lambda step: 10.0**step)
    x = torch.randint(0, 256, (2, 16))
    m(x, x)[1].backward()
    opt.step()
    sched.step()  # lr 5: lr * weight_decay = 2.5
    m(x, x)[1].backward()
    with pytest.raises(ValueError, match=r"^lr \* weight_decay must be in \[0, 1\), got 2.5$"):
        opt.step()
