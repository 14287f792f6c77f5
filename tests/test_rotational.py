"""dynamics.rotational: the rotational variants hold every gauge unit at its equilibrium angle from step 1, with
parameter groups, a no-decay list, per-neuron units and one-line errors; the other parameters follow the base
optimizer bit for bit."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import dynamics.adamw_window as aw
import dynamics.scalefree as sf
from dynamics.heavyball import HeavyBall
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
    """The base optimizer's equilibrium angle, by hand (AdamW's: its law with the scatter of v-hat at beta2 0.95,
    checked against simulation in tests/test_dynamics_laws_adamw.py)."""
    if variant == "adamw":
        return math.acos(aw.adamw_equilibrium_cos(lr * wd, 0.9, 0.95))
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


def _batches(n: int, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (2, 16), generator=gen) for _ in range(n)]


def _train(m, opt, batches) -> None:
    for x in batches:
        m(x, x)[1].backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize(("variant", "kw", "message"), [
    ("adamw", {"eps": math.nan}, r"^eps must be in \[0, inf\), got nan$"),
    ("adamw", {"eps": -1e-8}, r"^eps must be in \[0, inf\), got -1e-08$"),
    ("adamw", {"groups": [{"params": ["tok_emb.weight"], "eps": math.nan}]},
     r"^groups\[0\].eps must be in \[0, inf\), got nan$"),
    ("adamw", {"groups": [{"params": ["blocks.0.attn.q_proj.weight"], "betas": (0.9, 1.0)}]},
     r"^groups\[0\].betas\[1\] must be in \[0, 1\), got 1.0$"),
    ("sgdm", {"groups": [{"params": ["blocks.0.mlp.*"], "momentum": math.nan}]},
     r"^groups\[0\].momentum must be in \[0, 1\), got nan$"),
    ("lion", {"groups": [{"params": ["tok_emb.weight"], "betas": (math.nan, 0.99)}]},
     r"^groups\[0\].betas\[0\] must be in \[0, 1\), got nan$"),
])
def test_every_hyperparameter_is_checked_at_construction(variant, kw, message):
    m, gauges = _model()
    lr, wd = SETTINGS[variant]
    with pytest.raises(ValueError, match=message) as e:
        _make(variant, m, gauges, lr, wd, **kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("variant", "group", "key", "value", "message"), [
    ("sgdm", 0, "momentum", math.nan, r"^momentum must be in \[0, 1\), got nan$"),
    ("sgdm", 0, "momentum", 1.5, r"^momentum must be in \[0, 1\), got 1.5$"),
    ("sgdm", 0, "dampening", math.nan, r"^dampening must be in \[0, 1\), got nan$"),
    ("sgdm", 1, "weight_decay", math.nan, r"^weight_decay must be in \[0, inf\), got nan$"),
    ("sgdm", 0, "rot_wd", math.inf, r"^weight_decay must be in \(0, inf\), got inf$"),
    ("sgdm", 0, "nesterov", "yes", r"^nesterov must be True or False, got 'yes'$"),
    ("adamw", 0, "eps", math.nan, r"^eps must be in \[0, inf\), got nan$"),
    ("adamw", 1, "betas", (0.9, math.nan), r"^betas\[1\] must be in \[0, 1\), got nan$"),
    ("adamw", 0, "amsgrad", True, r"^amsgrad must be False"),
    ("adamw", 0, "lr", -1e-3, r"^lr must be in \(0, inf\), got -0.001$"),
    ("lion", 1, "betas", (1.0, 0.99), r"^betas\[0\] must be in \[0, 1\), got 1.0$"),
])
def test_a_hyperparameter_moved_mid_run_is_refused_before_the_weights_move(variant, group, key, value, message):
    # param_groups[0] holds the gauges (rotational), [1] the rest (decayed by the base optimizer itself)
    m, gauges = _model()
    lr, wd = SETTINGS[variant]
    opt = _make(variant, m, gauges, lr, wd)
    assert opt.param_groups[0]["rotational"] and not opt.param_groups[1]["rotational"]
    _train(m, opt, _batches(1))
    opt.param_groups[group][key] = value
    before = [p.detach().clone() for p in m.parameters()]
    x = _batches(1, seed=2)[0]
    m(x, x)[1].backward()
    with pytest.raises(ValueError, match=message) as e:
        opt.step()
    assert "\n" not in str(e.value)
    assert all(torch.equal(p, b) for p, b in zip(m.parameters(), before))  # nothing moved, nothing NaN


def test_sgd_with_dampening_or_nesterov_turns_by_the_general_heavy_ball_angle():
    # torch's SGD steps them; the angle follows its law (dynamics.heavyball), not the plain heavy-ball closed form
    m, gauges = _model()
    lr, wd = SETTINGS["sgdm"]
    opt = rotational_sgd(m, gauges, lr=lr, momentum=0.9, weight_decay=wd)
    pg = opt.param_groups[0]
    plain = opt.rotational_angle(pg)
    assert plain == pytest.approx(_phi("sgdm", lr, wd), rel=tolerance("float64").rtol)
    for key, value in (("dampening", 0.5), ("nesterov", True)):
        pg[key] = value
        rule = HeavyBall(lr=lr, l2=wd, momentum=0.9, nesterov=pg["nesterov"], dampening=pg["dampening"])
        rtol = tolerance("float64", size=9).rtol  # the 3x3 solve behind the general map
        assert opt.rotational_angle(pg) == pytest.approx(math.acos(rule.equilibrium_cos()), rel=rtol)
        assert abs(opt.rotational_angle(pg) / plain - 1) > rtol


@pytest.mark.parametrize(("variant", "per_neuron"), [("adamw", False), ("sgdm", True), ("lion", False)])
def test_resume_from_the_state_dict_is_bit_exact(variant, per_neuron):
    # float32, as training runs: the norms of the loaded weights equal the held norms only to round-off, and a
    # resumed run that held those instead drifts from the straight one in the last bits
    lr, wd = SETTINGS[variant]
    batches = _batches(6)

    def fresh(weights=None):
        m, gauges = _model()
        m = m.float()
        if weights is not None:  # a resumed run: the weights first, then its optimizer on them
            m.load_state_dict(weights)
        return m, _make(variant, m, gauges, lr, wd, per_neuron=per_neuron)

    straight, opt = fresh()
    _train(straight, opt, batches)
    first, opt = fresh()
    _train(first, opt, batches[:3])
    saved_model, saved_opt = copy.deepcopy(first.state_dict()), copy.deepcopy(opt.state_dict())
    resumed, opt = fresh(saved_model)
    opt.load_state_dict(saved_opt)
    _train(resumed, opt, batches[3:])
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), name


def test_a_state_dict_without_held_norms_of_other_units_or_bad_values_is_refused():
    m, gauges = _model()
    opt = rotational_adamw(m, gauges, lr=3e-3, weight_decay=0.1)
    base_only = {k: v for k, v in opt.state_dict().items() if k != "rotational_held"}
    with pytest.raises(ValueError, match=r"^state_dict has no 'rotational_held'"):
        opt.load_state_dict(base_only)
    bad = copy.deepcopy(opt.state_dict())
    bad["param_groups"][0]["eps"] = math.nan
    with pytest.raises(ValueError, match=r"^eps must be in \[0, inf\), got nan$"):
        opt.load_state_dict(bad)
    assert opt.param_groups[0]["eps"] == 1e-8  # refused before anything was loaded
    other = rotational_adamw(m, gauges, lr=3e-3, weight_decay=0.1, per_neuron=True)
    with pytest.raises(ValueError, match=r"the unit counts of .* differ"):
        opt.load_state_dict(other.state_dict())
    fewer = rotational_adamw(m, {"blocks.0.attn.q_proj.weight": gauges["blocks.0.attn.q_proj.weight"]}, lr=3e-3,
                             weight_decay=0.1)
    with pytest.raises(ValueError, match=r"holds gauge groups"):
        opt.load_state_dict(fewer.state_dict())
