"""The benchmark's trainer case (``python -m lm.bench --trainer``, :mod:`lm.bench.trainer`) and its checks before
work.  No timing is asserted: the shapes are the recipes', the figures come from the trainer's own log, the
ratios, floors and claims are computed as documented, bad flags and a bad ``--json`` are refused in one line
before anything runs, and (slow) a tiny shape trains end to end through ``python -m lm.train``."""

from __future__ import annotations

import json
import math
import time

import pytest

from lm import bench
from lm.bench import SHAPES, Setting, TrainerConfig, TrainerRow
from lm.bench import trainer as bench_trainer
from lm.bench.__main__ import main
from lm.models import param_count


def test_shipped_shape_is_the_shipped_recipes():
    from lm.models import config_to_dict
    from lm.recipes import get_recipe

    g, d = bench_trainer.model_configs(SHAPES["shipped"])
    assert config_to_dict(g) == get_recipe("reference-grt").model_config
    assert config_to_dict(d) == get_recipe("reference-dense").model_config  # width 136
    g, d = bench_trainer.model_configs(SHAPES["text"])
    assert (g.d_model, g.n_heads, g.n_blocks, g.d_ff, g.block_size) == (256, 4, 12, 1024, 64)
    assert d.n_layers == 12 and abs(param_count("dense", d) / param_count("grt", g) - 1) < 0.05


def test_flops_per_token_counts_the_layers():
    g, d = bench_trainer.model_configs(SHAPES["shipped"])
    # dense: 2 layers of (4 d^2 + 2 d d_ff) multiply-adds, causal attention 2 T d, the tied head 2 d V
    assert bench_trainer.flops_per_token("dense", d) == 2 * (8 * 136**2 + 4 * 136 * 544 + 2 * 64 * 136) + 2 * 136 * 256
    qkvo = 4 * 4 * 11 * 16 * (8 + 10 + 8 * 16)  # 4 projections x 4 heads x 11 stages x 16 pairs
    mixer = 64 * (8 + 10 + 8 * 64)
    ffn = 2 * 21 * 256 * 8
    assert bench_trainer.flops_per_token("grt", g) == 2 * (qkvo + mixer + ffn + 2 * 64 * 128) + 2 * 128 * 256


def test_steady_steps_come_from_the_trainers_log(tmp_path):
    log = tmp_path / "log.jsonl"
    recs = [{"event": "start"}, {"event": "eval", "step": 0}]
    recs += [{"event": "train", "step": i + 1, "tok_per_s": 1024 / (0.5 if i < 2 else 0.25)} for i in range(5)]
    log.write_text("\n".join(json.dumps(r) for r in recs))
    assert bench_trainer._steady_steps(log, 1024, 2) == [0.25, 0.25, 0.25]


def _row(shape, setting, model, tok_s, flops, rss=500.0, error=""):
    return TrainerRow(shape, setting, model, 1000, 128, tok_s, [1.0], flops, rss, 1.0, 1.5, 10.0, error)


def test_ratios_floors_claims_and_tables():
    rows = [_row("shipped", "1 thread", "grt", 3000, 1.2e6, 600), _row("shipped", "1 thread", "dense", 10000, 1e6),
            _row("shipped", "2 threads", "grt", 5000, 1.2e6), _row("shipped", "2 threads", "dense", 8000, 1e6),
            _row("text", "2 threads", "grt", 700, 2e7), _row("text", "2 threads", "dense", 1000, 1.9e7)]
    q = bench_trainer.ratios(rows)
    assert [(x["shape"], x["setting"]) for x in q] == [("shipped", "1 thread"), ("shipped", "2 threads"),
                                                       ("text", "2 threads")]
    assert q[0]["ratio"] == 0.3 and math.isclose(q[0]["floor"], 1 / 1.2) and q[0]["rss_ratio"] == 1.2
    found, floors = bench.claims_and_floors([], "float32", rows)
    claims = {c.id: c for c in found}
    shipped, text = claims["bench.trainer_shipped_vs_dense"], claims["bench.trainer_text_vs_dense"]
    assert shipped.measured == 0.3 and not shipped.holds  # the worst thread count decides
    assert set(shipped.details) >= {"1 thread", "2 threads"} and text.measured == 0.7 and text.holds
    assert math.isclose(floors[shipped.id], 1 / 1.2)
    table = bench.targets_table(found, floors)
    assert "trainer_shipped_vs_dense" in table and "0.83x" in table and "not met" in table
    out = bench_trainer.format_trainer(rows, 0.6)
    assert "0.30x" in out and "600/500" in out


def test_a_failed_run_is_reported_not_hidden():
    rows = [_row("text", "1 thread", "grt", math.nan, 2e7, error="exit 1: boom"),
            _row("text", "1 thread", "dense", 1000, 1.9e7)]
    assert "exit 1: boom" in bench_trainer.format_trainer(rows, 0.6)
    assert not [c for c in bench.claims_and_floors([], "float32", rows)[0] if c.id == "bench.trainer_text_vs_dense"]


@pytest.mark.parametrize(("argv", "msg"), [
    (["--json", "{tmp}", "--trainer"], "is a directory"),
    (["--json", "{tmp}/afile/x.json", "--only", "qkvo"], "is a file, not a folder"),
    (["--trainer-parallel"], "--trainer-parallel needs --trainer"),
    (["--trainer", "--trainer-shapes", "huge"], "--trainer-shapes must be a comma-separated subset"),
    (["--trainer", "--trainer-steps", "-1"], "--trainer-steps must be in [0, 1000]"),
    (["--widths", "wide"], "--widths must be one of reference, shipped"),
    (["--only", "none"], "--only none leaves nothing to run"),
    (["--profile-steps", "2"], "--profile-steps needs --profile"),
    (["--profile", "--profile-steps", "101"], "--profile-steps must be in [0, 100]"),
    (["--profile", "--trainer-shapes", "huge"], "--trainer-shapes must be a comma-separated subset"),
])
def test_bad_flags_and_outputs_are_refused_before_work(tmp_path, capsys, argv, msg):
    (tmp_path / "afile").write_text("x")
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as ex:
        main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert ex.value.code == 2 and time.perf_counter() - t0 < 10  # refused at once, nothing run
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("python -m lm.bench: error:")]
    assert len(err) == 1 and msg in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.slow
def test_a_tiny_shape_trains_through_the_trainer(tmp_path):
    logged = []
    rows = bench_trainer.run_trainer(TrainerConfig(("tiny",), (Setting(1),), {}, str(tmp_path)), log=logged.append)
    assert [(r.model, r.error) for r in rows] == [("grt", ""), ("dense", "")]
    for r in rows:
        assert r.tok_s > 0 and len(r.step_s) == SHAPES["tiny"].steps and r.peak_rss_mb > 0
    runs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert runs == ["tiny-dense-1t1s-0", "tiny-grt-1t1s-0"]
    cfg = json.loads((tmp_path / "tiny-grt-1t1s-0.json").read_text())
    assert cfg["train"]["log_interval"] == 1 and cfg["train"]["probe_gauges"] is False
    assert "fused kernels ready" in logged[0]


def test_the_step_profile_adds_up_and_names_the_glue(tmp_path, capsys):
    """The tiny shape (eager cascades: below the fused kernels' token threshold): every category's time sums to
    the profiled step, the GRT runs many more operators than its dense twin, and the CLI writes it as JSON."""
    from lm.bench import CATEGORIES, categorize, profile_shape

    assert categorize("_CascadeFnBackward") == "cascade backward" and categorize("aten::mm") == "matmul (dense GEMMs)"
    assert categorize("aten::mul") == "elementwise + glue" and categorize("MulBackward0") == "autograd engine"
    grt, dense = profile_shape("tiny", steps=2)
    for p in (grt, dense):
        assert math.isclose(sum(p.ms_per_step.values()), p.profiled_ms_per_step)
        assert set(p.ms_per_step) <= {c for c, _ in CATEGORIES} | {"other"} and p.wall_ms_per_step > 0
    assert sum(grt.ops_per_step.values()) > 2 * sum(dense.ops_per_step.values())
    out = tmp_path / "p.json"
    assert main(["--only", "none", "--profile", "--trainer-shapes", "tiny", "--profile-steps", "1",
                       "--threads", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "step profile: tiny" in text and text.strip().splitlines()[-1].startswith("no targets measured")
    assert [p["model"] for p in json.loads(out.read_text())["step_profiles"]] == ["grt", "dense"]
