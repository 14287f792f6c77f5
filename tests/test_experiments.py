"""studies.experiments: the experiment driver on the tiny grid (seconds): records, the sweep -> final dependency,
the wall-clock match, a bit-exact resume after an interruption, a rerun that trains nothing, bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from studies.experiments import IDENTITY_KEYS, best_lr, needs_probe, resolve
from studies.experiments_report import ablation_rows, content_adaptive, stable_range
from studies.grid import GROUPS, SWEEP_WIDENING, grid, needed_specs, widening_needed
from studies.speed import probe

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = ("name", "model", "model_config", "lr", "seed", "tokens", "wall_s", "tok_per_s", "val_bpb_full",
            "val_bpb_sample", "gates", "neg_det_fraction", "group")


def _driver(tmp: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "studies.experiments", *args]
    if args and args[0] == "run":
        cmd += ["--grid", "tiny", "--runs-dir", str(tmp / "runs"), "--results", str(tmp / "res")]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _records(tmp: Path) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads((tmp / "res" / "runs.json").read_text())}


def test_every_grid_has_every_group_and_unique_names():
    for name in ("full", "tiny"):
        specs = grid(name)
        assert {s.group for s in specs} == set(GROUPS)
        assert len({s.name for s in specs}) == len(specs)
    full = grid("full")
    abl = [s for s in full if s.group == "ablation"]
    assert all(s.name == f"{s.variant}-seed{s.seed}" for s in abl)
    assert {s.seed for s in abl} == {0, 1}
    stab = [s for s in full if s.group == "stability"]
    per_model = {v: [s.lr for s in stab if s.variant == v] for v in {s.variant for s in stab}}
    assert len(per_model) == 4 and all(len(lrs) >= 7 for lrs in per_model.values())
    assert all(min(lrs) == 1e-4 and 1e-1 in lrs for lrs in per_model.values())  # the stability sweep's range, at least
    assert len({tuple(sorted(lrs)) for lrs in per_model.values()}) == 1  # every model on the same lrs
    finals = {(s.model, s.model_config.get("n_blocks") or s.model_config.get("n_layers"))
              for s in full if s.group == "depth" and s.phase == "final"}
    assert finals == {(m, n) for m in ("grt", "dense") for n in (2, 4, 8)}


def test_final_waits_for_its_sweep_and_takes_its_best_lr():
    specs = grid("tiny")
    final = next(s for s in specs if s.name == "text-grt-final")
    recs = {"text-grt-sweep-lr0.001": {"val_bpb_sample": 7.0}}
    assert resolve(final, recs, specs) is None  # one sweep run missing
    recs["text-grt-sweep-lr0.01"] = {"val_bpb_sample": 6.5}
    assert best_lr("text-grt", recs, specs) == 0.01
    assert resolve(final, recs, specs).lr == 0.01
    recs["text-grt-sweep-lr0.01"] = {"val_bpb_sample": None}  # diverged: counts as worst
    assert resolve(final, recs, specs).lr == 0.001


def test_a_sweep_widens_once_past_the_edge_its_best_lands_on():
    specs = grid("tiny")
    names = {s.name: s for s in specs}
    down, up = names["depth1-dense-sweep-lr0.0001"], names["depth1-dense-sweep-lr0.1"]
    final = names["depth1-dense-final"]
    assert (down.widens, up.widens) == ("down", "up")
    recs = {"depth1-dense-sweep-lr0.001": {"val_bpb_sample": 7.0}}
    assert widening_needed(up, recs, specs) is None and resolve(up, recs, specs) is None  # undecided
    assert len(needed_specs(specs, recs)) == len(specs)  # an undecided point still counts
    recs["depth1-dense-sweep-lr0.01"] = {"val_bpb_sample": 6.5}  # best on the top edge
    assert widening_needed(up, recs, specs) and widening_needed(down, recs, specs) is False
    assert resolve(up, recs, specs).lr == 0.1 and resolve(down, recs, specs) is None
    assert down not in needed_specs(specs, recs) and up in needed_specs(specs, recs)
    assert resolve(final, recs, specs) is None  # waits for the widening point
    recs["depth1-dense-sweep-lr0.1"] = {"val_bpb_sample": 6.0}
    assert resolve(final, recs, specs).lr == 0.1  # and may take it
    recs["depth1-dense-sweep-lr0.1"] = {"val_bpb_sample": None}  # the widening point diverged
    assert resolve(final, recs, specs).lr == 0.01
    recs["depth1-dense-sweep-lr0.01"] = {"val_bpb_sample": None}  # now the bottom edge is best: the other side
    assert widening_needed(down, recs, specs) and not widening_needed(up, recs, specs)
    assert resolve(final, recs, specs) is None
    # the full grid: every sweep has one point past each edge, and nothing else is conditional
    full = grid("full")
    for tag in ("depth4-grt", "depth4-dense", "depth8-grt", "depth8-dense", "text-grt", "text-dense"):
        w = sorted((s.lr, s.widens) for s in full if s.sweep == tag and s.widens)
        base = [s.lr for s in full if s.sweep == tag and s.phase == "sweep" and not s.widens]
        assert [x[1] for x in w] == ["down", "up"] and w[0][0] < min(base) < max(base) < w[1][0]
        if tag.startswith("depth"):
            assert [x[0] for x in w] == list(SWEEP_WIDENING)
    assert all(s.phase == "sweep" for s in full if s.widens)
    with pytest.raises(ValueError, match="widens"):
        replace(final, widens="up")


def test_the_driver_trains_only_the_widening_point_the_sweep_needs(tmp_path):
    done = _driver(tmp_path, "run", "--groups", "depth")
    assert done.returncode == 0, done.stderr
    recs = _records(tmp_path)
    base = {n: recs[n] for n in ("depth1-dense-sweep-lr0.001", "depth1-dense-sweep-lr0.01")}
    best_base = min(base.values(), key=lambda r: r["val_bpb_sample"])
    need, skip = ("depth1-dense-sweep-lr0.0001", "depth1-dense-sweep-lr0.1")[:: 1 if best_base["lr"] == 1e-3 else -1]
    assert need in recs and skip not in recs and not (tmp_path / "runs" / skip).exists()
    points = [*base.values(), recs[need]]
    assert recs["depth1-dense-final"]["lr"] == min(points, key=lambda r: r["val_bpb_sample"])["lr"]
    status = subprocess.run([sys.executable, "-m", "studies.experiments", "status", "--grid", "tiny", "--results",
                             str(tmp_path / "res"), "--runs-dir", str(tmp_path / "runs")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert "1 widening point(s) not needed" in status.stdout, status.stdout


def test_wallclock_match_scales_tokens_by_the_probed_speed_ratio():
    specs = grid("tiny")
    wall = next(s for s in specs if s.name == "coupling-off-wallclock-seed0")
    recs = {"shipped-seed0": {"tokens": 1000, "tok_per_s": 100.0}}
    assert resolve(wall, recs, specs) is None
    recs["coupling-off-seed0"] = {"tokens": 1000, "tok_per_s": 900.0}
    assert needs_probe(wall, recs, {})
    assert resolve(wall, recs, specs, {}) is None  # the records' own tokens/s are never used: they measure load
    fixed = resolve(wall, recs, specs, {wall.name: {"speed_ratio": 2.5, "step_s": {"reference": [1.0]}}})
    assert fixed.tokens == 2500 and fixed.extra["wallclock_match"] == {"speed_ratio": 2.5}
    assert not needs_probe(wall, recs, {wall.name: {"speed_ratio": 2.5}})


def test_speed_probe_measures_the_slower_model_as_slower():
    small = {"vocab_size": 256, "block_size": 16, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}
    big = {**small, "d_model": 256, "n_layers": 3, "d_ff": 1024}
    out = probe(("dense", big), ("dense", small), batch_size=8, steps=5, warmup=1)
    assert out["speed_ratio"] > 2.0, out  # ~200x the FLOPs: far more than any load difference between turns
    assert math.isclose(out["speed_ratio"], out["fast_tok_s"] / out["reference_tok_s"])
    assert len(out["step_s"]["reference"]) == len(out["step_s"]["fast"]) == 5
    with pytest.raises(ValueError, match="same context"):
        probe(("dense", big), ("dense", {**small, "block_size": 8}), batch_size=2, steps=1)


def test_the_driver_sizes_a_wallclock_run_by_its_probe(tmp_path):
    names = ["shipped-seed0", "coupling-off-seed0", "coupling-off-wallclock-seed0"]
    done = _driver(tmp_path, "run", *[a for n in names for a in ("--only", n)])
    assert done.returncode == 0, done.stderr
    recs = _records(tmp_path)
    probes = json.loads((tmp_path / "res" / "speed_probes.json").read_text())
    p = probes["coupling-off-wallclock-seed0"]
    assert p["reference_run"] == "shipped-seed0" and p["fast_run"] == "coupling-off-seed0" and p["speed_ratio"] > 0
    rec = recs["coupling-off-wallclock-seed0"]
    assert rec["wallclock_match"]["speed_ratio"] == p["speed_ratio"]
    per_step = 4 * 16  # the tiny grid's batch of 4 windows of 16
    assert rec["tokens"] == math.ceil(round(recs["shipped-seed0"]["tokens"] * p["speed_ratio"]) / per_step) * per_step
    assert "speed probe for coupling-off-wallclock-seed0" in done.stderr


def test_driver_records_resumes_bit_exactly_and_reruns_nothing(tmp_path):
    sweep_and_final = ["--only", "text-grt-sweep-lr0.001", "--only", "text-grt-sweep-lr0.01",
                       "--only", "text-grt-final"]
    done = _driver(tmp_path, "run", *sweep_and_final)
    assert done.returncode == 0, done.stderr
    recs = _records(tmp_path)
    assert set(recs) == {"text-grt-sweep-lr0.001", "text-grt-sweep-lr0.01", "text-grt-final"}
    for r in recs.values():
        assert set(REQUIRED) <= set(r)
        assert r["status"] == "complete" and math.isfinite(r["val_bpb_full"]) and math.isfinite(r["val_bpb_sample"])
        assert r["val_full_bytes"] > 100_000  # the whole validation split, every byte after the first
        assert len(r["gates"]) == r["model_config"]["n_blocks"] and all(0 < g < 1 for g in r["gates"][0])
        if r["phase"] != "sweep":
            assert 0.0 <= r["neg_det_fraction"] <= 1.0
    best = min(("text-grt-sweep-lr0.001", "text-grt-sweep-lr0.01"), key=lambda n: recs[n]["val_bpb_sample"])
    assert recs["text-grt-final"]["lr"] == recs[best]["lr"]
    assert (tmp_path / "res" / "logs" / "text-grt-final.log.jsonl").exists()
    assert (tmp_path / "res" / "trained_claims_text_shape.json").exists()  # the text-shape GRT's claims
    gate_evals = [json.loads(x) for x in (tmp_path / "res" / "logs" / "text-grt-final.log.jsonl").read_text()
                  .splitlines() if '"eval"' in x]
    assert all("gates" in e for e in gate_evals)

    # an interrupted run resumes to the same numbers as a straight one
    straight = recs["text-grt-sweep-lr0.001"]
    other = tmp_path / "again"
    stopped = _driver(other, "run", "--only", "text-grt-sweep-lr0.001", env={"STUDIES_STOP_AFTER": "1"})
    assert stopped.returncode == 130, stopped.stderr
    assert not (other / "res" / "runs.json").exists()
    assert (other / "runs" / "text-grt-sweep-lr0.001" / "ckpt.pt").exists()
    resumed = _driver(other, "run", "--only", "text-grt-sweep-lr0.001")
    assert resumed.returncode == 0, resumed.stderr
    again = _records(other)["text-grt-sweep-lr0.001"]
    for key in ("val_bpb_full", "val_bpb_sample", "gates", "neg_det_fraction", "tokens"):
        assert again[key] == straight[key], key

    # a second run trains nothing and changes no record
    before = (tmp_path / "res" / "runs.json").read_bytes()
    rerun = _driver(tmp_path, "run", *sweep_and_final)
    assert rerun.returncode == 0 and "start " not in rerun.stderr
    assert (tmp_path / "res" / "runs.json").read_bytes() == before


@pytest.mark.parametrize("args, needle", [
    (["run", "--jobs", "0"], "--jobs must be an integer in [1, 64]"),
    (["run", "--groups", "ablation,nope"], "--groups must be a comma list"),
    (["run", "--only", "no-such-run"], "--only: no run called"),
])
def test_bad_input_is_one_line_before_work(tmp_path, args, needle):
    out = _driver(tmp_path, *args)
    assert out.returncode == 2
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_runs_dir_inside_results_is_refused(tmp_path):
    out = subprocess.run([sys.executable, "-m", "studies.experiments", "run", "--grid", "tiny", "--results",
                          str(tmp_path), "--runs-dir", str(tmp_path / "runs")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "must be separate folders" in out.stderr


def test_verdicts_wait_for_their_runs_and_use_the_seed_spread():
    def rec(variant, seed, bpb):
        return {"name": f"{variant}-seed{seed}", "group": "ablation", "variant": variant, "seed": seed,
                "model": "grt", "params": {"total": 10}, "val_bpb_full": bpb, "tokens": 100, "tok_per_s": 1.0,
                "neg_det_fraction": 0.0}

    recs = [rec("shipped", 0, 2.50), rec("shipped", 1, 2.52), rec("coupling-off", 0, 2.60)]
    assert isinstance(content_adaptive(recs), str)  # pending, never a verdict on half the runs
    assert "so far" not in content_adaptive(recs)  # one coupling-off seed: no spread, no partial reading
    recs.append(rec("coupling-off", 1, 2.61))
    partial = content_adaptive(recs)
    assert partial.startswith("pending: 4 of 6") and "equal tokens: coupling off +0.095 bits/byte (seed spread " \
        "0.020)" in partial and "wall-clock:" not in partial
    recs += [rec("coupling-off-wallclock", 0, 2.55), rec("coupling-off-wallclock", 1, 2.56)]
    c = content_adaptive(recs)
    assert c.holds and abs(c.measured["coupling_off_minus_shipped_bpb_equal_tokens"] - 0.095) < 1e-12
    recs[-1]["val_bpb_full"] = 2.45  # seed range 0.10 > the 0.035 gap at equal wall-clock
    assert not content_adaptive(recs).holds
    rows = {r["variant"]: r for r in ablation_rows(recs)}
    assert rows["shipped"]["delta"] == 0.0
    assert stable_range([{"lr": 1e-3, "stable": True}, {"lr": 1e-2, "stable": False}])["largest"] == 1e-3


def test_identity_keys_are_spec_fields():
    spec = grid("tiny")[0].to_dict()
    assert set(IDENTITY_KEYS) - {"resolved_lr"} <= set(spec)


def test_progress_reads_the_log_and_estimates_from_this_process_only(tmp_path, monkeypatch):
    import studies.experiments as ex

    spec = next(s for s in grid("tiny") if s.name == "shipped-seed0")  # 2 steps; pretend 100
    spec = ex.replace(spec, tokens=100 * spec.batch_size * int(spec.model_config["block_size"]))
    (tmp_path / "log.jsonl").write_text('{"event": "train", "step": 40}\n{"event": "eval", "step": 60}\n{"cut')
    assert ex.last_step(tmp_path) == 60 and ex.last_step(tmp_path / "none") == 0
    with (tmp_path / "log.jsonl").open("a") as fh:  # a stop checkpoints past the last logged interval
        fh.write('\n{"event": "stopped", "step": 63}\n{"event": "end"}\n')
    assert ex.last_step(tmp_path) == 63
    (tmp_path / "log.jsonl").write_text('{"event": "train", "step": 40}\n{"event": "eval", "step": 60}\n')
    job = ex.Job(spec, tmp_path, start_step=40)
    monkeypatch.setattr(ex.time, "perf_counter", lambda: job.started + 600.0)  # 20 steps in 10 minutes
    assert ex._progress(job) == "shipped-seed0 60/100 (600s, eta 20m)"


def test_a_diverged_run_has_no_final_loss(tmp_path):
    """A run that hit a non-finite step keeps its step-0 evaluation as its last: reporting that as the final loss
    drew the diverged no-norm models at their initial loss (5.544) in the stability table and figure."""
    from studies.job import _loss_path

    evals = '{"event": "eval", "step": 0, "val_loss": 5.54}\n'
    steps = "".join(f'{{"event": "train", "step": {s}, "loss_avg": {5.5 + s}}}\n' for s in (1, 2))
    (tmp_path / "log.jsonl").write_text(evals + steps + '{"event": "nonfinite", "step": 3, "loss": 1e7}\n')
    path = _loss_path(tmp_path)
    assert path["final_val_loss"] is None and path["nonfinite_step"] == 3
    assert path["initial_val_loss"] == 5.54 and path["max_train_loss"] == 7.5
    (tmp_path / "log.jsonl").write_text(evals + steps + '{"event": "eval", "step": 2, "val_loss": 4.0}\n')
    assert _loss_path(tmp_path)["final_val_loss"] == 4.0  # finished: its last evaluation is its final loss


def test_a_run_whose_folder_holds_another_run_is_refused_and_the_rest_go_on(tmp_path):
    """A grid change (here: a different lr) leaves a folder describing another run: the driver refuses that run
    with the reason, records the others, and exits 1, instead of dying with its other jobs still running."""
    theirs = tmp_path / "runs" / "grt-lr0.001"
    theirs.mkdir(parents=True)
    spec = next(s for s in grid("tiny") if s.name == "grt-lr0.001")
    (theirs / "spec.json").write_text(json.dumps({**spec.to_dict(), "resolved_lr": 0.5}))
    before = (theirs / "spec.json").read_bytes()
    out = _driver(tmp_path, "run", "--groups", "stability", "--jobs", "2")
    assert out.returncode == 1, out.stderr
    assert "NOT STARTED grt-lr0.001" in out.stderr and "move " in out.stderr
    assert set(_records(tmp_path)) == {"grt-lr0.1", "dense-lr0.001", "dense-lr0.1"}
    assert (theirs / "spec.json").read_bytes() == before  # nothing a user made is overwritten


def test_the_sweep_line_marks_the_lr_its_final_used_and_names_a_better_one():
    from studies.experiments_report import format_tables

    recs = [{"name": f"t-sweep-lr{lr:g}", "phase": "sweep", "variant": "t", "lr": lr, "val_bpb_full": v,
             "group": "text_shape"} for lr, v in ((1e-3, 3.0), (1e-2, 2.9), (3e-2, 2.8))]
    recs.append({"name": "t-final", "phase": "final", "variant": "t", "lr": 1e-2, "group": "elsewhere"})
    line = next(x for x in format_tables(recs) if x.strip().startswith("t "))
    assert ">0.01 2.900" in line and ">0.03" not in line and "(whole-split best: 0.03)" in line
    recs[-1]["lr"] = 3e-2
    line = next(x for x in format_tables(recs) if x.strip().startswith("t "))
    assert ">0.03 2.800" in line and "whole-split best" not in line


def test_the_report_gathers_the_trained_claims_of_both_shapes_as_distinct_rows():
    from figures.gather import gather

    g = gather(("studies",), log=lambda _: None)  # the committed records: no compute
    ids = [c.id for c in g.claims]
    assert len(set(zip(ids, (c.dtype for c in g.claims)))) == len(ids)
    res = ROOT / "results" / "grt-experiments"
    for name, suffix in (("trained_claims_shipped.json", ""), ("trained_claims_text_shape.json", "_text_shape")):
        if (res / name).is_file():
            want = {c["id"] + suffix for c in json.loads((res / name).read_text())["claims"]}
            assert want <= set(ids), want - set(ids)


def test_space_efficient_waits_for_three_depths_and_reads_the_trend():
    from studies.experiments_report import space_efficient

    def pair(n, grt_bpb, dense_bpb):
        return [{"name": f"depth{n}-{m}-final", "phase": "final", "group": "depth", "variant": f"depth{n}-{m}",
                 "model": m, "model_config": {"n_blocks" if m == "grt" else "n_layers": n},
                 "val_bpb_full": v, "params": {"total": 100 * n}, "wall_s": 1.0}
                for m, v in (("grt", grt_bpb), ("dense", dense_bpb))]

    recs = pair(2, 2.70, 2.60) + pair(4, 2.60, 2.45)
    partial = space_efficient(recs)
    assert partial == "pending: 2 of 3 depth pairs (2, 4, 8 blocks) recorded; GRT - dense bits/byte so far " \
                      "2: +0.100, 4: +0.150"
    assert space_efficient([]) == "pending: 0 of 3 depth pairs (2, 4, 8 blocks) recorded"
    c = space_efficient(recs + pair(8, 2.50, 2.30))
    assert not c.holds and c.measured["trend_with_depth"] == "grows"
    c = space_efficient(pair(2, 2.5, 2.6) + pair(4, 2.4, 2.45) + pair(8, 2.3, 2.31))
    assert c.holds and c.measured["trend_with_depth"] == "grows"  # gap -0.10, -0.05, -0.01: toward dense


def test_content_adaptive_spread_is_the_larger_seed_range():
    # a gap between the two seed ranges: it beats the smaller range but not the larger, so it is no verdict
    def rec(variant, seed, bpb):
        return {"name": f"{variant}-seed{seed}", "group": "ablation", "variant": variant, "seed": seed,
                "model": "grt", "params": {"total": 10}, "val_bpb_full": bpb, "tokens": 100, "tok_per_s": 1.0,
                "neg_det_fraction": 0.0}

    recs = [rec("shipped", 0, 2.50), rec("shipped", 1, 2.51),  # range 0.01
            rec("coupling-off", 0, 2.55), rec("coupling-off", 1, 3.05),  # range 0.50, gap +0.295
            rec("coupling-off-wallclock", 0, 2.90), rec("coupling-off-wallclock", 1, 2.91)]
    c = content_adaptive(recs)
    assert c.measured["seed_spread_equal_tokens"] == pytest.approx(0.50)
    assert not c.holds


@pytest.mark.parametrize(("status", "initial", "final", "max_train", "stable"), [
    ("complete", 5.5, 2.0, 5.0, True),
    ("complete", 5.5, 2.0, 5.5 * 1.1, True),  # at the bound
    ("complete", 5.5, 2.0, 6.2, False),  # a spike above 1.1 x the start, though the end is low
    ("complete", 5.5, 5.6, 5.6, False),  # ended above its start
    ("complete", 5.5, 2.0, None, False),  # no logged training loss
    ("complete", 5.5, None, 5.0, False),  # no final evaluation
    ("complete", 5.5, float("nan"), 5.0, False),
    ("diverged", 5.5, 2.0, 5.0, False),
    ("interrupted", 5.5, 2.0, 5.0, False),
    ("complete", 5.5, 1.0, 2.0, True),  # far below the start: against the final loss the bound would be 1.1
])
def test_stability_rule(status, initial, final, max_train, stable):
    from studies.job import is_stable

    assert is_stable(status, initial, final, max_train) is stable


def _exit_status(main, argv):
    try:
        return main(argv)
    except SystemExit as e:  # a usage error leaves through argparse
        return e.code


def test_summary_json_onto_its_own_inputs_is_refused_untouched(tmp_path, capsys):
    res = tmp_path / "res"
    (res / "logs").mkdir(parents=True)
    (res / "runs.json").write_text("[]")
    (res / "logs" / "x.log.jsonl").write_text("{}\n")
    from studies.experiments import main

    for target in (res / "runs.json", res / "logs" / "x.log.jsonl", res / "new.json"):
        before = {p: p.read_bytes() for p in res.rglob("*") if p.is_file()}
        assert _exit_status(main, ["summary", "--results", str(res), "--json", str(target)]) == 2
        err = capsys.readouterr().err
        assert "--json" in err and len(err.strip().splitlines()) == 1, err
        assert {p: p.read_bytes() for p in res.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(("content", "needle"), [
    ('[{"x": 1}]', "record 0 is not a run record"),
    ("[1, 2]", "record 0 is not a run record"),
    ('[{"name": "a", "group": "ablation"', "is not valid JSON"),
    ('{"name": "a"}', "must hold a JSON list"),
])
def test_malformed_records_are_one_line_naming_the_file(tmp_path, capsys, content, needle):
    (tmp_path / "runs.json").write_text(content)
    from studies.experiments import main

    for cmd in ("summary", "status"):
        code = _exit_status(main, [cmd, "--results", str(tmp_path)])
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code in (1, 2) and len(lines) == 1 and needle in lines[0], err
        assert str(tmp_path / "runs.json") in lines[0] and "Traceback" not in err


def test_tiny_summary_counts_against_the_tiny_grid():
    from studies.experiments_report import stable_by_construction

    tiny = grid("tiny")
    assert stable_by_construction([], tiny) == "pending: 0 of 4 stability runs recorded"
    assert stable_by_construction([]) == "pending: 0 of 36 stability runs recorded"


def test_a_folder_started_before_a_spec_field_existed_is_the_same_run(tmp_path, monkeypatch):
    # a run folder written by an older driver lacks the newer identity keys: their defaults are what it trained with
    import argparse

    from studies import experiments

    spec = next(s for s in grid("tiny") if s.name == "grt-lr0.001")
    folder = tmp_path / "runs" / spec.name
    folder.mkdir(parents=True)
    old = {k: v for k, v in {**spec.to_dict(), "resolved_lr": spec.lr}.items()
           if k not in ("lr_mult", "data", "tokenizer")}
    (folder / "spec.json").write_text(json.dumps(old))
    started = []
    monkeypatch.setattr(experiments.subprocess, "Popen", lambda *a, **k: started.append(a) or object())
    args = argparse.Namespace(grid="tiny", runs_dir=str(tmp_path / "runs"), results=str(tmp_path / "res"),
                              threads=1)
    experiments.Driver(args, grid("tiny")).launch(spec, spec.lr)
    assert started
    other = replace(spec, tokenizer="bpe")
    with pytest.raises(ValueError, match="describes a different run"):
        experiments.Driver(args, grid("tiny")).launch(other, spec.lr)


def test_the_fair_verdicts_wait_for_their_runs_then_read_the_gaps_beside_the_spread():
    from studies.experiments_report import (
        content_adaptive_matched,
        format_tables,
        space_efficient_bpe,
        space_efficient_tuned,
        stable_by_construction_tuned,
    )

    def final(group, tag, model, seed, bpb, n=2):
        return {"name": f"{tag}-{model}-final-s{seed}", "group": group, "variant": f"{tag}-{model}", "phase": "final",
                "model": model, "seed": seed, "val_bpb_full": bpb, "params": {"total": 100},
                "model_config": {"n_blocks" if model == "grt" else "n_layers": n}}

    recs = [final("fair_depth", f"fair-depth{n}", m, s, 2.7 + (0.01 if m == "grt" else 0.0) + 0.002 * s, n)
            for n in (2, 4) for m in ("grt", "dense") for s in (0, 1)]
    assert space_efficient_tuned(recs).startswith("pending: 2 of 3")
    recs += [final("fair_depth", "fair-depth8", m, s, 2.6 - (0.03 if m == "grt" else 0.0), 8)
             for m in ("grt", "dense") for s in (0, 1)]
    c = space_efficient_tuned(recs)
    assert not c.holds and c.measured["grt_minus_dense_bpb"]["fair-depth8"] == pytest.approx(-0.03)
    assert c.measured["beyond_seed_spread"] == {"fair-depth2": True, "fair-depth4": True, "fair-depth8": True}
    bpe = [final("vocab", f"bpe-{size}", m, 0, 3.0 - (0.01 if m == "grt" else 0.0)) for size in ("small", "large")
           for m in ("grt", "dense")]
    assert space_efficient_bpe(bpe[:2]).startswith("pending: 1 of 2")
    seeded = bpe[:2] + [final("vocab", "bpe-small", m, 1, 3.004 - (0.01 if m == "grt" else 0.0))
                        for m in ("grt", "dense")]
    assert space_efficient_bpe(seeded).endswith("bpe-small: GRT - dense -0.010 (spread 0.004)")  # the pair so far
    b = space_efficient_bpe(bpe)
    assert b.holds and b.measured["beyond_seed_spread"] == {"bpe-large": False, "bpe-small": False}  # one seed
    long = [final("long", "long", m, 0, 1.7 + (0.05 if m == "grt" else 0.0)) for m in ("grt", "dense")]
    rows = [ln.split() for ln in format_tables(seeded + long) if ln.startswith(("   bpe-small ", "   long "))]
    assert rows == [["bpe-small", "100", "100", "2/2", "2.9920", "3.0020", "-0.0100", "0.0040"],
                    ["long", "100", "100", "1/1", "1.7500", "1.7000", "+0.0500", "-"]]  # the summary's section 6
    stab = [{"name": f"{v}-lr{lr}", "group": "stability_tuned", "variant": v, "lr": lr, "stable": ok}
            for v, oks in (("grt-tuned", [True] * 9), ("dense-tuned", [True] * 7 + [False] * 2))
            for lr, ok in zip(range(9), oks)]
    assert stable_by_construction_tuned(stab[:5]).startswith("pending")
    assert stable_by_construction_tuned(stab).holds
    abl = [{"name": f"{v}-seed{s}", "group": "ablation", "variant": v, "seed": s, "model": "grt",
            "params": {"total": 10}, "val_bpb_full": bpb, "tokens": 1, "tok_per_s": 1.0, "neg_det_fraction": 0.0}
           for v, vals in (("shipped", (2.70, 2.72)), ("coupling-off-matched", (2.74, 2.75))) for s, bpb in
           enumerate(vals)]
    m = content_adaptive_matched(abl)
    assert m.holds and m.measured["coupling_off_matched_minus_shipped_bpb"] == pytest.approx(0.035)
    abl[-1]["val_bpb_full"] = 2.81  # its seed range 0.07 now covers the 0.065 gap
    assert not content_adaptive_matched(abl).holds


# ---- the reference comparison: the grid's last group ------------------------------------------------------------


def test_the_reference_comparison_comes_last_and_a_plain_run_leaves_it_out():
    from studies.experiments import _check, build_parser

    for name in ("full", "tiny"):
        groups = [s.group for s in grid(name)]
        first = groups.index("reference")
        assert set(groups[first:]) == {"reference"} and "reference" not in groups[:first]
        plain = _check(build_parser().parse_args(["run", "--grid", name]))
        assert plain and all(s.group != "reference" for s in plain)
        named = _check(build_parser().parse_args(["run", "--grid", name, "--groups", "reference"]))
        assert {s.variant for s in named} == {"reference-grt", "reference-dense-params", "reference-dense-wallclock"}


def test_a_width_match_waits_for_its_probe_then_trains_the_probed_width():
    specs = grid("tiny")
    wall = next(s for s in specs if s.name == "reference-dense-wallclock-sweep-lr0.01")
    grt = next(s for s in specs if s.name == "reference-grt-sweep-lr0.01")
    assert needs_probe(wall, {}, {}) and not needs_probe(grt, {}, {})  # a width needs no run recorded first
    assert resolve(wall, {}, specs, {}) is None
    cfg = {**wall.model_config, "d_model": 40, "d_ff": 160}
    probes = {"reference-dense-wallclock": {"d_model": 40, "model_config": cfg, "widths": [], "method": "m"}}
    fixed = resolve(wall, {}, specs, probes)
    assert fixed.model_config == cfg and fixed.est_tok_s == grt.est_tok_s and fixed.tokens == wall.tokens
    assert fixed.extra["wallclock_match"] == {"d_model": 40, "widths": [], "method": "m"}
    assert not needs_probe(wall, {}, probes)
    final = next(s for s in specs if s.name == "reference-dense-wallclock-final")
    assert resolve(final, {}, specs, probes) is None  # and its final waits for its sweep as every final does
    assert resolve(final, {wall.name: {"val_bpb_sample": 5.0}}, specs, probes).model_config == cfg


def test_matched_width_interpolates_where_the_speed_ratio_crosses_one(monkeypatch):
    import studies.speed as speed

    curve = {"ratio": lambda d: (200 / d) ** 2}  # a power law: the log-log interpolation lands on its crossing

    def fake(reference, fast, **kw):
        r = curve["ratio"](fast[1]["d_model"])
        return {"speed_ratio": r, "reference_tok_s": 1.0, "fast_tok_s": r}

    monkeypatch.setattr(speed, "probe", fake)
    dense = {"vocab_size": 256, "block_size": 16, "d_model": 20, "n_heads": 2, "n_layers": 1, "d_ff": 80}
    out = speed.matched_width(("grt", {}), dense, batch_size=4)
    assert out["d_model"] == 200 and out["model_config"] == {**dense, "d_model": 200, "d_ff": 800}
    assert [w["d_model"] for w in out["widths"]] == [20, 28, 40, 56, 80, 112, 160, 228]
    # the committed comparison's calibration gives the committed width through the same rule
    committed = json.loads((ROOT / "results" / "compare-reference" / "speed_probes.json").read_text())
    committed = committed["reference-dense-wallclock"]
    curve["ratio"] = {w["d_model"]: w["speed_ratio"] for w in committed["widths"]}.__getitem__
    start = {**committed["model_config"], "d_model": 136, "d_ff": 544}
    assert speed.matched_width(("grt", {}), start, batch_size=16)["d_model"] == committed["d_model"] == 328


def test_the_driver_sizes_the_wallclock_dense_by_its_probe_and_reports_it(tmp_path, monkeypatch, capsys):
    import studies.experiments as ex
    import studies.speed as speed

    def matched_width(reference, dense, **kw):  # the real search is the test above: here, the driver's use of it
        assert reference[0] == "grt" and dense["d_model"] == 512  # the tiny grid's start
        return {"d_model": 24, "model_config": {**dense, "d_model": 24, "d_ff": 96},
                "widths": [{"d_model": 512, "speed_ratio": 0.5}], "method": "stand-in"}

    monkeypatch.setattr(speed, "matched_width", matched_width)
    monkeypatch.setattr(ex.signal, "signal", lambda *a: None)  # the driver's Ctrl-C handler stays out of pytest
    res = tmp_path / "res"
    argv = ["run", "--grid", "tiny", "--groups", "reference", "--only", "reference-dense-wallclock-sweep-lr0.01",
            "--runs-dir", str(tmp_path / "runs"), "--results", str(res)]
    assert ex.main(argv) == 0
    assert "speed probe for reference-dense-wallclock: width 24 (speed ratio by width: 512 0.50)" in \
        capsys.readouterr().err
    probe = json.loads((res / "speed_probes.json").read_text())["reference-dense-wallclock"]
    rec = _records(tmp_path)["reference-dense-wallclock-sweep-lr0.01"]
    assert rec["model_config"] == probe["model_config"] and rec["params"]["embedding"] == 256 * 24
    assert rec["wallclock_match"] == {k: v for k, v in probe.items() if k != "model_config"}
    assert ex.main(["summary", "--grid", "tiny", "--results", str(res)]) == 1  # the selling points: pending
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("dense-wallclock"))
    assert line.split() == ["dense-wallclock", f"{rec['val_bpb_sample']:.4f}"]  # its one sweep point


def test_the_committed_reference_records_give_the_readme_numbers():
    from studies.reference_report import format_reference, reference_claims

    res = ROOT / "results" / "compare-reference"
    records = json.loads((res / "runs.json").read_text())
    probes = json.loads((res / "speed_probes.json").read_text())
    specs, by = grid("full"), {r["name"]: r for r in records}
    for s in needed_specs([s for s in specs if s.group == "reference"], by, specs):
        fixed = resolve(s, by, specs, probes)  # every run the grid needs is recorded, as the driver would run it
        assert (fixed.lr, fixed.model_config) == (by[s.name]["lr"], by[s.name]["model_config"]), s.name
    table = {}
    for line in format_reference(records):
        cells = line.split()
        if cells and cells[0] in ("grt", "dense-params", "dense-wallclock"):
            table.setdefault(cells[0], []).append(cells)
    assert table["grt"][0] == ["grt", "128", "16,640", "377,344", "33,152", "64,512", "902", "492,550", "0.003",
                               "3,000,320", "1058", "2.5967", "2.5740", "2837"]
    assert table["dense-params"][0][11:13] == ["2.5006", "2.4739"]
    assert table["dense-wallclock"][0][1] == "328" and table["dense-wallclock"][0][11:13] == ["-", "2.4270"]
    assert table["grt"][1] == ["grt", "-", "3.6666", ">3.1974", "3.3198", "3.6922", "3.7430"]
    assert table["dense-wallclock"][1] == ["dense-wallclock", "3.0653", ">2.9973", "3.0340", "-", "-", "-"]
    bpb, match = reference_claims(records)
    assert (bpb.id, bpb.holds) == ("lm.matched_params_bits_per_byte", False)
    assert bpb.measured == {"grt": 2.57402353257974, "dense-params": 2.4739092605823734,
                            "dense-wallclock": 2.427043289542739}
    assert (match.id, match.holds, match.measured["dense_d_model"]) == ("lm.matched_widths_match_params", True, 136)
