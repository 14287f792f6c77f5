"""Training pipeline: exact resume, config validation, checkpoints, sampling, determinism, the gauge census and
equilibrium monitor the CLI attaches, and the dense model's sizing."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from dynamics import laws
from dynamics.monitor import EquilibriumMonitor
from gauge.census import census
from lm.checkpoint import load_checkpoint, model_from_checkpoint, rng_state, save_checkpoint, set_rng_state
from lm.dense import DenseConfig, DenseTransformer
from lm.loop import train
from lm.models import config_from_dict, config_to_dict
from lm.runlog import read_log
from lm.sample import sample_bytes
from lm.summary import expected_gauges, summary_claims
from lm.train import main
from lm.trainconfig import TrainConfig
from rmsgauge import assert_close, tolerance
from rmsgauge.corpus import decode
from studies.train import monitor_hooks

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "block_size": 16}
TIMING_KEYS = {"tok_per_s", "elapsed_s", "train_time_s"}  # wall-clock fields: the only ones that differ between runs


@pytest.fixture
def eager_cascade(monkeypatch):
    """Tiny GRTs run the eager cascade: the fused kernels' one-off JIT compile costs more than these tests."""
    from grt_model.kernels import policy

    monkeypatch.setattr(policy, "MIN_TOKENS", 1 << 62)


def _cfg(out: Path, data: Path, **kw) -> TrainConfig:
    base = {"lr": 1e-2, "warmup_steps": 2, "batch_size": 4, "max_steps": 6, "eval_interval": 2, "eval_batches": 2,
            "log_interval": 1, "gauge_interval": 1, "ckpt_interval": 0, "device": "cpu", "threads": 1,
            "data": str(data), "out_dir": str(out)}
    return TrainConfig(**{**base, **kw})


def _strip(records: list[dict]) -> list[dict]:
    """Log records without wall-clock fields and without the start/resume/stop/end bookkeeping."""
    keep = []
    for r in records:
        if r["event"] in ("train", "eval", "equilibrium"):
            keep.append({k: v for k, v in r.items() if k not in TIMING_KEYS})
    return keep


def test_resume_is_bit_exact(tmp_path, small_corpus):
    """6 steps straight == 3 steps, interruption, --resume for 3 more: every logged loss, eval and equilibrium
    monitor record (its state rides in the checkpoint), and every final weight, bit for bit (float32, one CPU
    process), with the hooks the CLI attaches."""
    cfg_a = _cfg(tmp_path / "a", small_corpus)
    cfg_b = _cfg(tmp_path / "b", small_corpus)
    mcfg = DenseConfig(**TINY)
    sa = train("dense", mcfg, cfg_a, progress=False, hooks=monitor_hooks(cfg_a))
    sb1 = train("dense", mcfg, cfg_b, stop_after=3, progress=False, hooks=monitor_hooks(cfg_b))
    assert sb1["steps"] == 3 and not sb1["complete"]
    sb = train("dense", mcfg, cfg_b, resume=True, progress=False, hooks=monitor_hooks(cfg_b))
    assert sb["steps"] == 6 and sb["complete"]
    la, lb = _strip(read_log(tmp_path / "a" / "log.jsonl")), _strip(read_log(tmp_path / "b" / "log.jsonl"))
    assert len(la) == len(lb) > 6
    assert [r["step"] for r in la if r["event"] == "equilibrium"] == [1, 2, 3, 4, 5, 6]
    assert la == lb  # exact float equality of every loss, val loss, norm and angle
    assert sa["equilibrium"] == sb["equilibrium"]  # the summary covers the whole run, not the part after resume
    ca, cb = load_checkpoint(tmp_path / "a" / "ckpt.pt"), load_checkpoint(tmp_path / "b" / "ckpt.pt")
    for k, v in ca["model"].items():
        assert torch.equal(v, cb["model"][k]), k
    assert ca["step"] == cb["step"] == 6 and ca["tokens_seen"] == cb["tokens_seen"]
    assert sa["final_val_loss"] == sb["final_val_loss"]


def test_resume_after_a_crash_drops_the_unfinished_tail(tmp_path, small_corpus):
    """Records logged after the last checkpoint (a crash after step 4, checkpoint at 3) are replaced."""
    cfg = _cfg(tmp_path / "c", small_corpus)
    mcfg = DenseConfig(**TINY)
    train("dense", mcfg, cfg, stop_after=3, progress=False)
    log = tmp_path / "c" / "log.jsonl"
    with log.open("a") as fh:  # what a run killed during step 4 would have left behind
        fh.write(json.dumps({"event": "train", "step": 4, "loss": -1.0}) + "\n")
        fh.write('{"event": "train", "st')  # and a line cut off mid-write
    train("dense", mcfg, cfg, resume=True, progress=False)
    steps = [r["step"] for r in read_log(log) if r["event"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert all(r["loss"] > 0 for r in read_log(log) if r["event"] == "train")


def test_determinism_for_a_fixed_seed(tmp_path, small_corpus):
    mcfg = DenseConfig(**TINY)
    runs = [train("dense", mcfg, _cfg(tmp_path / f"s{i}", small_corpus, max_steps=3, seed=s), progress=False)
            for i, s in enumerate((7, 7, 8))]
    logs = [_strip(read_log(tmp_path / f"s{i}" / "log.jsonl")) for i in range(3)]
    assert logs[0] == logs[1]
    assert runs[0]["final_train_loss"] == runs[1]["final_train_loss"]
    assert runs[0]["final_train_loss"] != runs[2]["final_train_loss"]  # the seed matters (init and data)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "lr=-1"], "train.lr must be in (0, 10]"),
        (["--set", "bogus=1"], "unknown key 'bogus'"),
        (["--set", "train.beta2=1.5"], "train.beta2 must be in [0, 1)"),
        (["--set", "batch_size=0"], "train.batch_size must be in [1, inf)"),
        (["--set", "model.n_heads=3"], "d_model (128) must be divisible by n_heads (3)"),
        (["--set", "model.nope=3"], "unknown model key 'nope'"),
        (["--set", "max_steps=abc"], "train.max_steps: cannot read 'abc' as int"),
        (["--set", "schedule=linear"], "train.schedule must be one of cosine, constant"),
        (["--device", "tpu"], "train.device must be one of auto, cpu, cuda"),
        (["--lr", "nan"], "train.lr must be in (0, 10]"),
        (["--stop-after", "0"], "--stop-after must be in [1, inf)"),
    ],
)
def test_config_validation_names_the_key(tmp_path, capsys, argv, message):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as exc:
        main(["--model", "dense", "--out-dir", str(out), "--quiet", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # failed before any work


@pytest.mark.parametrize(("argv", "d_ff"), [
    (["--model", "grt", "--d-model", "64"], 4 * 64),
    (["--model", "dense", "--d-model", "48"], 4 * 48),
    (["--model", "grt", "--d-model", "64", "--d-ff", "128"], 128),
    (["--model", "dense", "--d-model", "48", "--set", "d_ff=100"], 100),
    (["--model", "grt", "--d-model", "64", "--set", "model.d_ff=512"], 512),
    (["--model", "grt", "--n-layers", "2"], None),  # no --d-model: the preset's own d_ff
])
def test_d_ff_follows_d_model_unless_given(tmp_path, argv, d_ff):
    from lm.models import default_model_config
    from lm.train import build_parser, resolve

    kind, mcfg, _, _ = resolve(build_parser().parse_args([*argv, "--out-dir", str(tmp_path / "o")]))
    assert mcfg.d_ff == (default_model_config(kind).d_ff if d_ff is None else d_ff)


def test_tiny_grt_recipe_is_a_small_grt(tmp_path):
    from lm.models import param_count
    from lm.recipes import RECIPE_NAMES, get_recipe
    from lm.train import build_parser, resolve

    assert "tiny-grt" in RECIPE_NAMES
    kind, mcfg, tcfg, _ = resolve(build_parser().parse_args(["--recipe", "tiny-grt", "--out-dir", str(tmp_path)]))
    shipped = config_from_dict("grt", get_recipe("reference-grt").model_config)
    assert kind == "grt" and mcfg.d_ff == 4 * mcfg.d_model and mcfg.d_model < shipped.d_model
    assert (mcfg.qkvo_stages, mcfg.mixer_stages, mcfg.ffn_stages) == (
        shipped.qkvo_stages, shipped.mixer_stages, shipped.ffn_stages)  # the text's cascades, narrower
    assert param_count("grt", mcfg) < param_count("grt", shipped) / 3
    assert tcfg.total_steps(mcfg.block_size) == tcfg.max_steps == 300 and tcfg.eval_interval == 100


def test_config_file_layers_and_unknown_keys(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": "dense", "train": {"lr": 1e-3, "lrr": 2}}))
    with pytest.raises(SystemExit):
        main(["--config", str(bad), "--out-dir", str(tmp_path / "x"), "--quiet"])
    assert "unknown --config train key(s) ['lrr']" in capsys.readouterr().err
    bad.write_text(json.dumps({"model": "dense", "optimizer": {}}))
    with pytest.raises(SystemExit):
        main(["--config", str(bad), "--out-dir", str(tmp_path / "x"), "--quiet"])
    assert "unknown --config top-level key(s) ['optimizer']" in capsys.readouterr().err
    bad.write_text(json.dumps({"model": "dense", "model_config": {"d_model": 20, "n_heads": 4}}))
    with pytest.raises(SystemExit):
        main(["--config", str(bad), "--out-dir", str(tmp_path / "x"), "--quiet"])
    assert "head dim d_model/n_heads must be even" in capsys.readouterr().err


def test_cli_trains_resumes_and_rejects_changed_trajectory(tmp_path, small_corpus, capsys):
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"model": "dense", "model_config": TINY,
                               "train": {"batch_size": 4, "max_steps": 4, "eval_interval": 2, "eval_batches": 1,
                                         "warmup_steps": 1, "threads": 1, "data": str(small_corpus)}}))
    out = tmp_path / "cli"
    js = tmp_path / "summary.json"
    from studies.train import main as monitored  # python -m studies.train: lm.train + the equilibrium monitor

    assert monitored(["--config", str(cfg), "--set", "lr=2e-3", "--out-dir", str(out), "--stop-after", "2",
                 "--quiet"]) == 0
    with pytest.raises(SystemExit):
        monitored(["--out-dir", str(out), "--resume", "--lr", "1e-3", "--quiet"])
    assert "train.lr is 0.001 but the checkpoint was trained with 0.002" in capsys.readouterr().err
    assert monitored(["--out-dir", str(out), "--resume", "--quiet", "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    assert doc["summary"]["steps"] == 4 and doc["summary"]["train_config"]["lr"] == 2e-3
    ids = [c["id"] for c in doc["claims"]]
    assert "lm.gauge_census" in ids and "lm.rotational_equilibrium_angle" in ids


def test_checkpoint_round_trip_rebuilds_config_and_rng(tmp_path):
    """Config rebuilt with Config(**d), weights, optimizer and all RNG states survive save/load."""
    torch.manual_seed(3)
    cfg = DenseConfig(**TINY)
    model = DenseTransformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (2, 16))
    model(x, x)[1].backward()
    opt.step()
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    path = save_checkpoint(tmp_path / "ck.pt", model_kind="dense", model=model, optimizer=opt,
                           train_config={"lr": 1e-3}, step=5, tokens_seen=160, extra={"note": 1})
    draws = (random.random(), float(np.random.rand()), float(torch.rand(())))
    ck = load_checkpoint(path)
    assert config_from_dict("dense", ck["model_config"]) == cfg
    rebuilt = model_from_checkpoint(ck)
    assert rebuilt.config == cfg
    assert torch.equal(rebuilt(x)[0], model(x)[0])
    opt2 = torch.optim.AdamW(rebuilt.parameters(), lr=1e-3)
    opt2.load_state_dict(ck["optimizer"])
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    set_rng_state(ck["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == draws
    assert ck["step"] == 5 and ck["tokens_seen"] == 160 and ck["extra"] == {"note": 1}
    assert not list(tmp_path.glob(".ck.pt.*"))  # the atomic writer left no temp file
    with pytest.raises(ValueError, match="unknown model config"):
        config_from_dict("dense", {**cfg.to_dict(), "width": 3})
    state = rng_state()
    set_rng_state(json.loads(json.dumps({"python": state["python"]})) | {k: state[k] for k in ("numpy", "torch")})


def test_grt_checkpoint_round_trip(tmp_path, eager_cascade):
    from grt_model.config import GRTConfig
    from grt_model.model import GRT

    cfg = GRTConfig.small(d_model=16, n_heads=2, n_blocks=1, d_ff=32, block_size=16, qkvo_stages=2, ffn_stages=2)
    model = GRT(cfg)
    path = save_checkpoint(tmp_path / "g.pt", model_kind="grt", model=model, optimizer=None, train_config={},
                           step=0, tokens_seen=0)
    ck = load_checkpoint(path)
    rebuilt = model_from_checkpoint(ck)
    assert rebuilt.config == cfg == GRTConfig(**ck["model_config"])
    x = torch.randint(0, 256, (2, 16))
    assert torch.equal(rebuilt(x)[0], model(x)[0])


def test_sample_produces_text(tmp_path, small_corpus):
    train("dense", DenseConfig(**TINY), _cfg(tmp_path / "m", small_corpus, max_steps=2), progress=False)
    ck = tmp_path / "m" / "ckpt.pt"

    def sample_text(**kw) -> str:
        return decode(list(sample_bytes(str(ck), prompt="ROMEO:", **kw)))

    a = sample_text(n_tokens=40, temperature=1.0, top_k=0, seed=1)
    b = sample_text(n_tokens=40, temperature=1.0, top_k=0, seed=1)
    c = sample_text(n_tokens=40, temperature=1.0, top_k=0, seed=2)
    g = sample_text(n_tokens=10, temperature=0.0, seed=3)
    assert a == b and a != c
    assert a.startswith("ROMEO:") and len(a.encode("utf-8", errors="surrogateescape")) >= 6
    assert isinstance(g, str) and g.startswith("ROMEO:")
    assert main(["sample", "--checkpoint", str(ck), "--tokens", "5", "--json", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["tokens"] == 5


def test_gauge_census():
    """Claim lm.gauge_census: on the dense baseline with QK-norm the census the trainer runs finds exactly W_q and
    W_k of every layer (each head's row block a gauge of its own: the per-head RMSNorm reads it), as
    lm.summary.expected_gauges states from the architecture; without QK-norm it finds none."""
    x = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
    cfg = DenseConfig(**{**TINY, "n_layers": 2})
    model = DenseTransformer(cfg)
    res = census(model, batch=(x[:, :-1], x[:, 1:]), own_eps=False)
    exp = expected_gauges("dense", config_to_dict(cfg))
    assert sorted(res.gauges) == sorted(exp) and len(exp) == 4
    assert not [t.name for t in res.tensors if t.status in ("partial gauge", "unused")]
    head = cfg.d_model // cfg.n_heads
    for n in exp:
        assert res.blocks_of(n) == [(0, h * head, (h + 1) * head) for h in range(cfg.n_heads)]
        t = next(t for t in res.tensors if t.name == n)
        assert t.loss_change <= res.tolerance  # the finite law at every scale, below float64 round-off
    plain_cfg = DenseConfig(**{**TINY, "qk_norm": False})
    plain = census(DenseTransformer(plain_cfg), batch=(x[:, :-1], x[:, 1:]), own_eps=False)
    assert not any(t.blocks for t in plain.tensors)
    assert expected_gauges("dense", config_to_dict(plain_cfg)) == []


def test_gauge_census_finds_none_in_the_grt_and_the_trainer_attaches_nothing(tmp_path, small_corpus, eager_cascade):
    """The GRT has no scale gauge (every norm reads a sum or a rotation of several weights' outputs); the gate
    logits start at 0 and are tested at a random point, since 0 * c = 0 proves nothing.  The trainer's hook then
    monitors nothing and records that the census found none: no error, no equilibrium records."""
    from grt_model.config import GRTConfig
    from grt_model.model import GRT

    kw = {"d_model": 16, "n_heads": 2, "n_blocks": 1, "d_ff": 32, "block_size": 16, "qkvo_stages": 2,
          "ffn_stages": 2}
    cfg = GRTConfig.small(**kw)
    x = torch.randint(0, 256, (1, 17), generator=torch.Generator().manual_seed(0))
    res = census(GRT(cfg), batch=(x[:, :-1], x[:, 1:]), own_eps=False)
    assert not any(t.blocks for t in res.tensors)
    assert any(n.endswith("gate_logits") for n in res.randomized)
    tcfg = _cfg(tmp_path / "g", small_corpus, max_steps=2)
    s = train("grt", cfg, tcfg, progress=False, hooks=monitor_hooks(tcfg))
    assert s["gauge_census"]["source"] == "census" and s["gauge_census"]["gauges"] == []
    assert s["equilibrium"] == {"steps": 0, "groups": {}}
    log = read_log(tmp_path / "g" / "log.jsonl")
    assert not [r for r in log if r["event"] == "equilibrium"]
    assert log[0]["equilibrium_groups"] == [] and log[0]["gauge_census"]["gauges"] == []
    claims = {c.id: c for c in summary_claims(s)}
    assert claims["lm.gauge_census"].holds and claims["lm.gauge_census"].stated is None
    assert "lm.rotational_equilibrium_angle" not in claims


def test_no_monitor_without_gauge_interval_or_probe():
    assert monitor_hooks(TrainConfig(gauge_interval=0)) == []
    assert monitor_hooks(TrainConfig(probe_gauges=False)) == []
    assert len(monitor_hooks(TrainConfig())) == 1


def test_tensor_angle_is_accurate_for_tiny_and_large_angles():
    """dynamics.laws.tensor_angle, the monitor's angle: 2 atan2 is exact where acos of a number near 1 is not."""
    for phi in (1e-9, 1e-4, 0.5, 3.0):
        a = np.array([1.0, 0.0, 0.0])
        b = np.array([math.cos(phi), math.sin(phi), 0.0]) * 7.0
        assert_close(torch.tensor(laws.tensor_angle(a, b)), torch.tensor(phi), depth=4, what=f"angle {phi}")


def test_sgd_equilibrium_angle_exact():
    r"""SGD with decoupled decay on the random-walk gauge model (gradient tangent, ||g|| = G/||W||): the per-step
    angle converges to arccos(1 - lr wd) exactly and the norm to the closed-form fixed point (dynamics.laws)."""
    lr, wd, G, C = 0.05, 0.2, 0.7, 64
    d = lr * wd
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(C, dtype=torch.float64, generator=gen)
    steps = int(60 * laws.relaxation_steps("sgd", "torch", lr, wd))  # 60 e-folds: the transient is below round-off
    n_pred = float(w @ w)
    for _ in range(steps):
        g = torch.randn(C, dtype=torch.float64, generator=gen)
        g = g - w * (g @ w) / (w @ w)  # tangent: <g, W> = 0 as for any gauge
        g = g / g.norm() * (G / w.norm())
        n_pred = laws.norm_step(n_pred, float(g @ g), lr, d)
        prev, w = w, (1 - d) * w - lr * g
    tol = tolerance("float64", size=C, depth=steps)
    angle = laws.equilibrium_angle("sgd", "torch", lr, wd)
    norm = laws.equilibrium_norm("sgd", "torch", lr, wd, numel=C, G2=G * G)
    assert angle == math.acos(1 - d)
    assert tol.holds(float(w @ w) - n_pred, n_pred)
    assert tol.holds(laws.tensor_angle(prev.numpy(), w.numpy()) - angle, angle)
    assert tol.holds(float(w.norm()) - norm, norm)


def test_rotational_equilibrium_angle():
    r"""Claim lm.rotational_equilibrium_angle, on the model it is derived for, measured by the trainer's monitor:
    AdamW on a gauge whose gradients are random, tangent and of size 1/||W|| turns by the equilibrium angle
    cos phi = (q+b1)/(1+b1 q) (dynamics.laws; Kosson et al.'s sqrt(2 lr wd (1-b1)/(1+b1)) to first order).
    Statistical tolerance: the per-step angle of a C-vector fluctuates by ~1/sqrt(C) relative, and the random-walk
    model drops O(lr wd) terms; we allow 3x their sum."""
    C, lr, wd = 1024, 2e-2, 0.5
    gen = torch.Generator().manual_seed(0)
    holder = torch.nn.Module()
    for beta1 in (0.0, 0.9):
        holder.w = torch.nn.Parameter(torch.randn(C, dtype=torch.float64, generator=gen) * 0.01)
        w = holder.w
        opt = torch.optim.AdamW([w], lr=lr, betas=(beta1, 0.999), weight_decay=wd)
        mon = EquilibriumMonitor(holder, opt, ["w"])
        burn = int(15 * laws.relaxation_steps("adamw", "torch", lr, wd))
        for _ in range(burn + 500):
            with torch.no_grad():
                d = torch.randn(C, dtype=torch.float64, generator=gen)
                d -= w * (d @ w) / (w @ w)
                w.grad = d / w.norm()
            opt.step()
        steps, angles = mon.series("w", "angle")
        tail = [a for t, a in zip(steps, angles) if t > burn]
        measured = sum(tail) / len(tail)
        stated = laws.equilibrium_angle("adamw", "torch", lr, wd, betas=(beta1, 0.999))
        assert mon.history[-1]["groups"]["w"]["angle_eq"] == stated
        rel_tol = 3.0 * (lr * wd + 1.0 / math.sqrt(C))
        assert abs(measured / stated - 1.0) <= rel_tol, (beta1, measured, stated)


def test_summary_claims_from_a_run(tmp_path, small_corpus):
    cfg = _cfg(tmp_path / "q", small_corpus, max_steps=4)
    s = train("dense", DenseConfig(**TINY), cfg, progress=False, hooks=monitor_hooks(cfg))
    claims = {c.id: c for c in summary_claims(s)}
    assert claims["lm.gauge_census"].holds
    assert claims["lm.gauge_census"].measured == sorted(expected_gauges("dense", TINY | {"qk_norm": True}))
    eq = claims["lm.rotational_equilibrium_angle"]
    assert eq.measured["median_ratio_to_random_walk"] > 0 and eq.source_status == "approximate"
    assert set(s["equilibrium"]["groups"]) == set(s["gauge_census"]["gauges"])  # one group per gauge tensor
    assert json.loads((tmp_path / "q" / "summary.json").read_text())["steps"] == 4


@pytest.mark.parametrize("module", ["lm.train", "lm.sample"])
def test_help_works(module, capsys):
    import importlib

    mod = importlib.import_module(module)
    with pytest.raises(SystemExit) as exc:
        mod.main(["--help"])
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_dense_params_closed_form_matches_the_model():
    from lm.models import param_count
    from lm.sizing import dense_family, dense_params, grt_config, param_matched_width

    g = grt_config(quick=True)
    for d in (8, 44, 96):
        cfg = dense_family(g, d)
        assert dense_params(d, cfg.n_heads, cfg.n_layers, cfg.d_ff, cfg.vocab_size) == param_count("dense", cfg)
    target = 34_227
    d = param_matched_width(g, target)
    err = abs(dense_params(d, g.n_heads, g.n_blocks, 4 * d) - target)
    step = 2 * g.n_heads
    assert all(abs(dense_params(w, g.n_heads, g.n_blocks, 4 * w) - target) >= err for w in (d - step, d + step))
