"""The experiment grid's figures draw from records alone (synthetic ones here), the same bytes twice, and say
"unavailable" (never a traceback) when no record is there."""

from __future__ import annotations

import json

import pytest

import figures.studies_figs as sf
from figures.context import FigureContext
from figures.registry import FigureUnavailable
from figures.style import render


def _rec(name, group, variant, model, **kw):
    base = {"name": name, "group": group, "variant": variant, "model": model, "seed": 0, "phase": "grid",
            "params": {"total": 1000}, "tokens": 1000, "tok_per_s": 10.0, "wall_s": 100.0, "lr": 1e-3,
            "val_bpb_full": 3.0, "val_bpb_sample": 2.9, "neg_det_fraction": 0.0,
            "model_config": {"n_blocks": 2, "d_model": 16}}
    return {**base, **kw}


@pytest.fixture
def results(tmp_path, monkeypatch):
    recs = [_rec("shipped-seed0", "ablation", "shipped", "grt"),
            _rec("shipped-seed1", "ablation", "shipped", "grt", seed=1, val_bpb_full=3.02),
            _rec("coupling-off-seed0", "ablation", "coupling-off", "grt", val_bpb_full=3.1)]
    recs += [_rec(f"{v}-lr{lr:g}", "stability", v, m, lr=lr, final_val_loss=2.0 + lr, stable=lr < 0.1)
             for v, m in (("grt", "grt"), ("dense", "dense")) for lr in (1e-3, 1e-2, 1e-1)]
    recs += [_rec(f"depth{n}-{m}-final", "depth", f"depth{n}-{m}", m, phase="final",
                  params={"total": 1000 * n}, val_bpb_full=3.0 - 0.1 * n + (0.05 if m == "grt" else 0.0),
                  model_config={"n_blocks" if m == "grt" else "n_layers": n, "d_model": 16})
             for n in (2, 4) for m in ("grt", "dense")]
    recs += [_rec("dense-seed0", "ablation", "dense", "dense", val_bpb_full=2.9),
             _rec("tune-dense-01", "tuning", "tune-dense", "dense", search="tune-dense", phase="search", slot=1,
                  lr_mult={"matrices": 0.3}, val_bpb_full=2.95),
             _rec("tune-dense-02", "tuning", "tune-dense", "dense", search="tune-dense", phase="search", slot=2,
                  lr_mult={"matrices": 3.0}, val_bpb_full=2.8),
             _rec("tune-dense-best-seed1", "tuning", "tune-dense-best", "dense", search="tune-dense",
                  phase="tuned", seed=1, lr_mult={"matrices": 3.0}, val_bpb_full=2.82)]
    recs += [_rec(f"bpe-small-{m}-sweep-lr{lr:g}", "vocab", f"bpe-small-{m}", m, phase="sweep", lr=lr,
                  val_bpb_full=2.0 + lr) for m in ("grt", "dense") for lr in (1e-3, 3e-3)]
    recs += [_rec(f"bpe-small-{m}-final-seed{s}", "vocab", f"bpe-small-{m}", m, phase="final", seed=s,
                  val_bpb_full=1.9 + 0.01 * s) for m in ("grt", "dense") for s in (0, 1)]
    (tmp_path / "logs").mkdir()
    (tmp_path / "runs.json").write_text(json.dumps(recs))
    log = [{"event": "eval", "step": s, "tokens": 100 * s, "gates": [[0.5 + 0.01 * s, 0.5, 0.5], [0.5, 0.6, 0.4]]}
           for s in range(3)]
    (tmp_path / "logs" / "shipped-seed0.log.jsonl").write_text("\n".join(json.dumps(x) for x in log))
    long = [{"event": "eval", "step": s, "tokens": 100 * s, "val_bpb": 3.0 - 0.1 * s} for s in range(3)]
    (tmp_path / "logs" / "long-grt.log.jsonl").write_text("\n".join(json.dumps(x) for x in long))
    monkeypatch.setattr(sf, "RESULTS", tmp_path)
    return tmp_path


@pytest.mark.parametrize("fn", [sf.content_adaptive_fig, sf.stability_fig, sf.depth_fig, sf.gate_trajectories,
                                sf.tuning_search_fig, sf.vocab_fig])
def test_figures_draw_from_records_deterministically(results, fn):
    tmp_dir = results
    out1 = fn(FigureContext(out_dir=tmp_dir, quick=True))
    out2 = fn(FigureContext(out_dir=tmp_dir, quick=True))
    assert out1.caption and out1.numbers
    assert render(out1.fig)["svg"] == render(out2.fig)["svg"]


@pytest.mark.parametrize("fn", [sf.content_adaptive_fig, sf.stability_fig, sf.depth_fig, sf.gate_trajectories,
                                sf.tuning_search_fig, sf.vocab_fig])
def test_no_records_is_unavailable(tmp_path, monkeypatch, fn):
    tmp_dir = tmp_path
    monkeypatch.setattr(sf, "RESULTS", tmp_path)
    with pytest.raises(FigureUnavailable):
        fn(FigureContext(out_dir=tmp_dir, quick=True))


def test_the_vocabulary_figure_reads_sweeps_finals_and_the_long_curve(results):
    out = sf.vocab_fig(FigureContext(out_dir=results, quick=True))
    assert out.numbers["bpe-small-grt-sweep"] == {"0.001": 2.001, "0.003": 2.003}
    assert out.numbers["bpe-small-dense-final-seed1"] == 1.91
    assert out.numbers["long-grt-last"] == pytest.approx(2.8) and "long-dense-last" not in out.numbers
