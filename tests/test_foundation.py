"""The shared core: butterfly wiring, tolerance helper, claim record, corpus, CI/README consistency."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from table_check import assert_cells_whole  # tests/ is on the path (conftest's folder)

from grt_model import butterfly_pairs
from grt_model.butterfly import from_pairs, pair_index, stage_stride, to_pairs
from rmsgauge import (
    Claim,
    ClaimGroup,
    check_range,
    claims_table,
    eps_of,
    run_claims,
    seed_everything,
    tolerance,
    write_claims_json,
)
from rmsgauge.claims import WIDTH
from rmsgauge.corpus import ByteCorpus, decode, encode, load_text

ROOT = Path(__file__).resolve().parents[1]


def test_butterfly_pairs_written_out_width_8():
    # d = 8: log2 d = 3 strides (1, 2, 4) that then cycle.
    assert butterfly_pairs(8, 0) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert butterfly_pairs(8, 1) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert butterfly_pairs(8, 2) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert butterfly_pairs(8, 3) == butterfly_pairs(8, 0)


def test_butterfly_pairs_written_out_width_16_stride_8():
    assert butterfly_pairs(16, 3) == [(0, 8), (1, 9), (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15)]
    assert butterfly_pairs(4, 1) == [(0, 2), (1, 3)]


@given(st.sampled_from([2, 4, 8, 16, 32, 64, 256, 1024]), st.integers(0, 40))
def test_each_stage_pairing_is_a_perfect_matching(width, stage):
    pairs = butterfly_pairs(width, stage)
    flat = sorted(i for p in pairs for i in p)
    assert flat == list(range(width))
    h = stage_stride(width, stage)
    assert all(i1 - i0 == h and (i0 & h) == 0 for i0, i1 in pairs)


@given(st.sampled_from([2, 4, 8, 16, 64]), st.integers(0, 12), st.integers(1, 3))
def test_pair_views_match_explicit_index(width, stage, batch):
    x = torch.randn(batch, width)
    h = stage_stride(width, stage)
    x0, x1 = to_pairs(x, h)
    idx = pair_index(width, stage)
    assert torch.equal(x0, x[:, idx[:, 0]]) and torch.equal(x1, x[:, idx[:, 1]])
    assert torch.equal(from_pairs(x0, x1, h), x)


@pytest.mark.parametrize("bad", [0, 3, 6, 12, -4])
def test_butterfly_rejects_non_power_of_two(bad):
    with pytest.raises(ValueError, match="power of two"):
        butterfly_pairs(bad, 0)


def test_tolerance_scales_with_eps_and_size():
    t64 = tolerance("float64", size=100)
    t32 = tolerance(torch.float32, size=100)
    assert t32.rtol / t64.rtol == pytest.approx(eps_of("float32") / eps_of("float64"))
    assert tolerance("float64", size=400).rtol == pytest.approx(2 * t64.rtol)
    assert tolerance("float64", rtol=1e-3).rtol == 1e-3
    with pytest.raises(ValueError):
        eps_of("int7")


def test_claim_record_json_and_table(tmp_path):
    c = Claim(id="gauge.example_claim", statement="x is zero", stated=0.0, measured=1e-17, tolerance=1e-15,
              holds=True, source_status="approximate", exact_law="x = 0 exactly", details={"n": 3})
    path = tmp_path / "c.json"
    write_claims_json(path, [c], dtype="float64")
    rec = json.loads(path.read_text())["claims"][0]
    for key in ("id", "statement", "stated", "measured", "tolerance", "holds"):
        assert key in rec
    assert "HOLDS" in claims_table([c])
    with pytest.raises(ValueError, match="claim id"):
        Claim(id="nodot", statement="s", stated=None, measured=0, tolerance=None, holds=True)


def test_one_runner_builds_the_context_once_and_runs_the_checks_in_their_declared_order():
    """The context is built once and closed after; each check runs once per call, in the group's order (not the
    order ``only`` lists); reseeding gives every check the same draw; a raising check is one FAILS record."""
    events = []

    @contextlib.contextmanager
    def context(*, seed, quick, progress, scale):
        events.append(("build", seed, quick, scale))
        yield [{"dtype": "float64"}, {"dtype": "float32"}]
        events.append("closed")

    def draw(dtype):
        return Claim(id="t.draw", statement="s", stated=None, measured=float(torch.rand(())), tolerance=None,
                     holds=True, dtype=dtype)

    def boom(dtype):
        raise RuntimeError("planted\nsecond line")

    group = ClaimGroup(context=context, reseed=True, checks={"t.draw": draw, "t.boom": boom})
    said = []
    claims = run_claims(group, only=("t.boom", "t.draw"), seed=3, scale=2, progress=said.append)
    assert events == [("build", 3, False, 2), "closed"] and said == ["t.draw", "t.boom"]
    assert [(c.id, c.dtype) for c in claims] == [("t.draw", "float64"), ("t.draw", "float32"), ("t.boom", "n/a")]
    assert claims[0].measured == claims[1].measured  # both calls seeded from 3
    assert not claims[2].holds and claims[2].details["error"] == "RuntimeError: planted"
    with pytest.raises(ValueError, match=r"unknown claim id\(s\) \['t.nope'\]; known: t.draw, t.boom"):
        run_claims(group, only=("t.nope",), scale=1)


# words a claim's cells are made of: names, formulas, numbers as the records print them
CELL_WORD = st.one_of(st.from_regex(r"[a-z<>|=;,()]{1,10}", fullmatch=True),
                      st.floats(-1e6, 1e6, allow_nan=False).map(lambda x: f"{x:.3g}"))
CELL_TEXT = st.lists(CELL_WORD, min_size=1, max_size=14).map(" ".join)


@given(st.lists(st.tuples(CELL_TEXT, CELL_TEXT, st.booleans()), min_size=1, max_size=4), st.booleans())
def test_claims_table_shows_every_cell_whole(rows, two_dtypes):
    dtypes = ("float64", "float32") if two_dtypes else ("float64",)
    claims = [Claim(id=f"gauge.claim_{k}", statement="s", stated=stated, measured=0.0, tolerance=None, holds=holds,
                    dtype=d, summary=summary) for k, (stated, summary, holds) in enumerate(rows) for d in dtypes]
    lines = assert_cells_whole(claims)
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)


def test_claims_table_keeps_the_gauge_cells_whole():
    """The gauge rows whose cells were cut with "...": each number and word of them is shown."""
    rows = [({"||g||": 3.6, "<g,W>": 1e-15}, "<g,W>/(|g||W|) 1.2e-17", "<g,W>/(|g||W|) -1.4e-10"),
            (None, "neuron 0.00074 head 4.4e-16", "neuron 0.00074 head 0"),
            ("the weight producing z = xW in a pre-norm block", "4 gauges with QK-norm, 0 without",
             "4 gauges with QK-norm, 0 without")]
    claims = [Claim(id=f"gauge.row_{k}", statement="s", stated=stated, measured=0.0, tolerance=None, holds=True,
                    dtype=d, summary=s)
              for k, (stated, *ours) in enumerate(rows) for d, s in zip(("float64", "float32"), ours)]
    lines = assert_cells_whole(claims)
    assert not any(line.rstrip().endswith("...") for line in lines), lines


def test_check_range_names_parameter():
    with pytest.raises(ValueError, match=r"wd must be in \[0, 1\)"):
        check_range("wd", 1.0, 0.0, 1.0, hi_open=True)
    assert check_range("lr", 0.1, 0.0, None, lo_open=True) == 0.1


def test_seed_everything_reproduces_all_three():
    import random

    seed_everything(7)
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(7)
    assert a == (random.random(), np.random.rand(), torch.rand(1).item())


def test_corpus_is_bundled_and_splits_never_overlap(tmp_path):
    corpus = ByteCorpus.load()
    assert len(corpus.tokens) > 1_000_000  # about 1.2 MB of plays
    assert "HAMLET" in load_text()
    train, val = corpus.split("train"), corpus.split("val")
    assert len(train) + len(val) == len(corpus.tokens)
    g = torch.Generator().manual_seed(0)
    x, y = corpus.batch("val", 4, 32, generator=g)
    assert x.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])
    (tmp_path / "a.txt").write_text("hello ")
    (tmp_path / "b.txt").write_text("world")
    assert load_text(tmp_path) == "hello \nworld"
    assert decode(encode("naïve")) == "naïve"
    with pytest.raises(FileNotFoundError):
        load_text(tmp_path / "missing")


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text().splitlines()
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmds = [ln.strip() for ln in readme[:15] if "pytest" in ln and ln.strip().startswith("pip install")]
    assert len(test_cmds) == 1, "README's first lines must hold exactly one install+test command"
    assert test_cmds[0] in ci
    # inside a virtual environment of its own, made fresh by the run: what a newcomer's install gets
    assert ci.index("-m venv") < ci.index("/bin/activate") < ci.index(test_cmds[0])
