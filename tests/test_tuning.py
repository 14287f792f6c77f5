"""Structure-aware learning rates: the lr groups, the multipliers reaching AdamW's groups at every step, the
coordinate search's rule (a pure function of the scores), and the driver running a tiny tuning search."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lm.optim import lr_group, make_optimizer
from lm.trainconfig import DECAYED_LR_GROUPS, LR_GROUPS, MODEL_LR_GROUPS, TrainConfig
from studies.experiments import resolve
from studies.grid import TUNING_BASE, TUNING_RUNS, grid
from studies.tuning import GRID, best_point, point_key, propose, search_scores, search_trace

ROOT = Path(__file__).resolve().parents[1]


def _tiny(kind):
    from lm.models import build_model, config_from_dict

    cfg = ({"vocab_size": 256, "block_size": 16, "d_model": 16, "n_heads": 2, "n_blocks": 1, "d_ff": 32}
           if kind == "grt" else
           {"vocab_size": 256, "block_size": 16, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 64})
    return build_model(kind, config_from_dict(kind, cfg))


@pytest.mark.parametrize("kind", ["grt", "dense"])
def test_every_parameter_is_in_exactly_its_models_lr_groups(kind):
    model = _tiny(kind)
    found = {lr_group(n, p) for n, p in model.named_parameters()}
    assert found == set(MODEL_LR_GROUPS[kind])
    opt = make_optimizer(model, TrainConfig(lr_mult={g: 2.0 for g in MODEL_LR_GROUPS[kind]}))
    names = [n for g in opt.param_groups for n in g["names"]]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())  # each once
    assert {g["lr_mult"] for g in opt.param_groups} == {2.0}


def test_lr_group_names_the_grt_structures():
    model = _tiny("grt")
    got = {n: lr_group(n, p) for n, p in model.named_parameters()}
    assert got["embed.phases"] == "embedding_phases" and got["embed.magnitudes"] == "embedding_magnitudes"
    assert got["blocks.0.attn.qkv.angles"] == "angles" and got["blocks.0.attn.qkv.raw_scales"] == "scales"
    assert got["blocks.0.attn.qkv.coupling"] == "coupling" and got["blocks.0.gate_logits"] == "gates"
    assert got["blocks.0.norm_attn.gain"] == "norm_gains"


@pytest.mark.parametrize(("mult", "needle"), [
    ({"nope": 2.0}, "unknown lr group 'nope'"),
    ({"angles": 0.0}, "train.lr_mult.angles"),
    ({"angles": float("nan")}, "train.lr_mult.angles"),
    ({"coupling": 400.0}, "lr * train.lr_mult * train.wd"),
])
def test_bad_multipliers_are_refused_naming_the_group(mult, needle):
    with pytest.raises(ValueError, match=r"train\.lr") as e:
        TrainConfig(lr=3e-2, lr_mult=mult)
    assert needle in str(e.value)


def test_only_decayed_groups_bound_the_multiplier_by_the_decay():
    # an undecayed group (angles, phases) may take any multiplier: its decay factor is 1
    TrainConfig(lr=3e-2, lr_mult={"angles": 400.0, "embedding_phases": 400.0})
    for kind in ("grt", "dense"):
        opt = make_optimizer(_tiny(kind), TrainConfig(lr=1e-3))
        assert {g["lr_group"] for g in opt.param_groups if g["weight_decay"] > 0} <= set(DECAYED_LR_GROUPS)


def test_multipliers_reach_the_optimizer_groups_at_every_step(tmp_path):
    from lm.checkpoint import load_checkpoint
    from lm.loop import train
    from lm.models import config_from_dict

    cfg = TrainConfig(lr=1e-2, batch_size=2, max_steps=4, warmup_steps=2, eval_interval=0, eval_batches=1,
                      log_interval=1, gauge_interval=0, ckpt_interval=0, device="cpu", out_dir=str(tmp_path),
                      probe_gauges=False, lr_mult={"angles": 10.0, "coupling": 0.1})
    model_cfg = config_from_dict("grt", {"vocab_size": 256, "block_size": 8, "d_model": 8, "n_heads": 2,
                                         "n_blocks": 1, "d_ff": 16})
    train("grt", model_cfg, cfg, progress=False)
    groups = load_checkpoint(tmp_path / "ckpt.pt")["optimizer"]["param_groups"]
    last_lr = cfg.lr_at(3, 4)
    by = {(g["lr_group"], g["weight_decay"] > 0): g for g in groups}
    assert by[("angles", False)]["lr"] == pytest.approx(10.0 * last_lr, rel=1e-15)
    assert by[("coupling", True)]["lr"] == pytest.approx(0.1 * last_lr, rel=1e-15)
    assert by[("gates", False)]["lr"] == pytest.approx(last_lr, rel=1e-15)


def test_all_ones_trains_the_same_weights_as_no_multipliers():
    # the search's base point is the ablation's global-lr run: the same arithmetic to the bit
    torch.manual_seed(0)
    a, b = _tiny("grt"), _tiny("grt")
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 256, (2, 16))
    opts = [make_optimizer(m, TrainConfig(lr_mult=mult)) for m, mult in ((a, {}), (b, dict.fromkeys(LR_GROUPS, 1.0)))]
    for m, opt in zip((a, b), opts):
        for _ in range(3):
            m(x, x)[1].backward()
            opt.step()
            opt.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def _scores(table):
    return {point_key(p): s for p, s in table}


def test_search_starts_at_the_global_lr_then_tries_both_neighbours():
    assert propose(["angles", "scales"], {}) == ([{}], {})
    todo, cur = propose(["angles", "scales"], _scores([({}, 3.0)]))
    assert todo == [{"angles": 0.3}, {"angles": 3.0}] and cur == {}


def test_search_follows_an_improving_direction_then_moves_on():
    groups = ["angles", "scales"]
    s = _scores([({}, 3.0), ({"angles": 0.3}, 3.2), ({"angles": 3.0}, 2.9)])
    assert propose(groups, s) == ([{"angles": 10.0}], {"angles": 3.0})
    s[point_key({"angles": 10.0})] = 2.8
    assert propose(groups, s) == ([{"angles": 30.0}], {"angles": 10.0})
    s[point_key({"angles": 30.0})] = 2.85  # worse: stop, next group from the best
    assert propose(groups, s) == ([{"angles": 10.0, "scales": 0.3}, {"angles": 10.0, "scales": 3.0}],
                                  {"angles": 10.0})


def test_a_pass_without_a_move_widens_the_neighbourhood():
    s = _scores([({}, 3.0), ({"a": 0.3}, 3.1), ({"a": 3.0}, 3.1), ({"b": 0.3}, 3.2), ({"b": 3.0}, 3.3)])
    assert propose(["a", "b"], s) == ([{"a": 0.1}, {"a": 10.0}], {})


def test_a_wide_move_goes_back_to_the_nearest_neighbours():
    s = _scores([({}, 3.0), ({"a": 0.3}, 3.1), ({"a": 3.0}, 3.1), ({"b": 0.3}, 3.2), ({"b": 3.0}, 3.3),
                 ({"a": 0.1}, 3.5), ({"a": 10.0}, 2.0), ({"a": 30.0}, 2.5)])
    assert propose(["a", "b"], s) == ([{"a": 10.0, "b": 0.3}, {"a": 10.0, "b": 3.0}], {"a": 10.0})


def test_the_search_uses_its_whole_budget_on_any_scores():
    # whatever the scores, the rule keeps proposing new points until the grid is exhausted (equal run counts)
    import random

    rng = random.Random(0)
    for groups in (["matrices", "embedding", "norm_gains"], list(MODEL_LR_GROUPS["grt"])):
        s: dict = {}
        for _ in range(TUNING_RUNS + 2):
            todo, _ = propose(groups, s)
            assert todo and all(point_key(p) not in s for p in todo)
            s[point_key(todo[0])] = rng.random()
        assert all(v in GRID for k in s for _, v in k)


def test_best_point_and_trace():
    pts = [{}, {"a": 0.3}, {"a": 3.0}]
    assert best_point(zip(pts, [3.0, 3.1, 2.9])) == ({"a": 3.0}, 2.9)
    trace = search_trace(["a"], pts, [3.0, 3.1, 2.9])
    assert [t["accepted"] for t in trace] == [True, False, True]
    # the first of a pair is the better one: it becomes current once its partner is scored
    assert [t["accepted"] for t in search_trace(["a"], pts, [3.0, 2.8, 2.9])] == [True, True, False]
    assert [t["varied"] for t in trace] == [[], ["a"], ["a"]]


def test_grid_gives_each_model_the_same_number_of_search_runs():
    specs = [s for s in grid("full") if s.group == "tuning"]
    for tag in TUNING_BASE:
        slots = [s for s in specs if s.search == tag and s.phase == "search"]
        assert len(slots) == TUNING_RUNS and [s.slot for s in slots] == list(range(1, TUNING_RUNS + 1))
        base = next(s for s in grid("full") if s.name == TUNING_BASE[tag])  # the same recipe at x1
        assert (base.model_config, base.tokens, base.lr, base.seed) == (slots[0].model_config, slots[0].tokens,
                                                                         slots[0].lr, slots[0].seed)


def test_slots_wait_for_earlier_slots_and_pair_up():
    specs = grid("tiny")
    s1, s2, s3 = (next(s for s in specs if s.name == f"tune-dense-0{k}") for k in (1, 2, 3))
    assert resolve(s2, {}, specs) is None  # slot 1 neither recorded nor running
    first = resolve(s1, {}, specs)
    assert first.lr_mult == {}
    recs = {"tune-dense-01": {"lr_mult": {}, "val_bpb_full": 3.0}}
    a = resolve(s2, recs, specs)
    b = resolve(s3, recs, specs, running=[a])
    assert (a.lr_mult, b.lr_mult) == ({"matrices": 0.3}, {"matrices": 3.0})
    assert resolve(s2, recs, specs, prior={"matrices": 3.0}).lr_mult == {"matrices": 3.0}  # a restart keeps it
    seed = next(s for s in specs if s.name == "tune-dense-best-seed1")
    assert resolve(seed, recs, specs) is None
    recs |= {"tune-dense-02": {"lr_mult": {"matrices": 0.3}, "val_bpb_full": 2.5},
             "tune-dense-03": {"lr_mult": {"matrices": 3.0}, "val_bpb_full": 2.7}}
    assert resolve(seed, recs, specs).lr_mult == {"matrices": 0.3}
    # the GRT search's base is the tiny grid's shipped-seed0: waited for, never trained twice
    assert search_scores("tune-grt", {}, specs) is None


def test_the_driver_runs_a_tiny_tuning_search(tmp_path):
    names = ["tune-dense-01", "tune-dense-02", "tune-dense-03", "tune-dense-best-seed1"]
    cmd = [sys.executable, "-m", "studies.experiments", "run", "--grid", "tiny", "--runs-dir", str(tmp_path / "r"),
           "--results", str(tmp_path / "res"), *[a for n in [*names, "dense-tuned-lr0.001"] for a in ("--only", n)]]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    recs = {r["name"]: r for r in json.loads((tmp_path / "res" / "runs.json").read_text())}
    assert [recs[n]["lr_mult"] for n in names[:3]] == [{}, {"matrices": 0.3}, {"matrices": 3.0}]
    assert [recs[n]["slot"] for n in names] == [1, 2, 3, 0]
    best = min(names[:3], key=lambda n: recs[n]["val_bpb_full"])
    assert recs["tune-dense-best-seed1"]["lr_mult"] == recs[best]["lr_mult"]
    # the tuned stability run takes the search's multipliers and is judged by the stability rule
    tuned = recs["dense-tuned-lr0.001"]
    assert tuned["lr_mult"] == recs[best]["lr_mult"] and isinstance(tuned["stable"], bool)
    assert tuned["grad_ratio_init"] > 0 and tuned["stable_rule"].startswith("finite")
    ckpt = torch.load(tmp_path / "r" / "tune-dense-03" / "ckpt.pt", weights_only=False)
    mults = {g["lr_group"]: g["lr_mult"] for g in ckpt["optimizer"]["param_groups"]}
    assert mults == {"matrices": 3.0, "embedding": 1.0, "norm_gains": 1.0}


def test_the_report_replays_the_search_and_compares_tuned_with_global_lr():
    from studies.experiments_report import format_tuning, tuning_rows

    def rec(name, group, variant, bpb, **kw):
        return {"name": name, "group": group, "variant": variant, "model": "dense", "seed": 0,
                "val_bpb_full": bpb, **kw}

    recs = [rec("dense-seed0", "ablation", "dense", 3.0), rec("dense-seed1", "ablation", "dense", 3.1),
            rec("tune-dense-01", "tuning", "tune-dense", 3.2, search="tune-dense", phase="search", slot=1,
                lr_mult={"matrices": 0.3}),
            rec("tune-dense-02", "tuning", "tune-dense", 2.8, search="tune-dense", phase="search", slot=2,
                lr_mult={"matrices": 3.0}),
            rec("tune-dense-best-seed1", "tuning", "tune-dense-best", 2.9, search="tune-dense", phase="tuned",
                lr_mult={"matrices": 3.0}),
            rec("tune-dense-best-seed2", "tuning", "tune-dense-best", 2.7, search="tune-dense", phase="tuned",
                lr_mult={"matrices": 3.0})]
    (row,) = tuning_rows(recs)
    assert row["best"] == {"matrices": 3.0} and row["runs"] == 2
    assert [t["accepted"] for t in row["trace"]] == [True, False, True]
    assert row["tuned"]["mean"] == pytest.approx(2.8) and row["tuned"]["range"] == pytest.approx(0.2)
    assert row["global"]["mean"] == pytest.approx(3.05) and row["global"]["range"] == pytest.approx(0.1)
    text = "\n".join(format_tuning(recs))
    assert "matrices x3" in text and "global lr, 2 seeds: mean 3.0500" in text
