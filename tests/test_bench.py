"""The benchmark's checks before work and its claims (``python -m lm.bench``).  No timing is asserted: bad flags and
bad outputs are refused in one line before anything runs, and each ratio becomes a claim record against its
target as documented."""

from __future__ import annotations

import math
import time

import pytest
import torch

from lm.bench import TARGETS, Row, claims
from lm.bench.__main__ import main
from lm.reference import reference_dir


@pytest.mark.parametrize(("argv", "msg"), [
    (["--json", "{tmp}"], "is a directory"),
    (["--json", "{tmp}/afile/x.json"], "is a file, not a folder"),
    (["--json", str(reference_dir() / "grt.json")], "the shipped models"),
    (["--case", "cascade,huge"], "--case must be a comma-separated subset"),
    (["--case", ""], "--case must be a comma-separated subset"),
    (["--batch-size", "0"], "--batch-size must be in [1, 1024], got 0"),
    (["--repeats", "1000"], "--repeats must be in [1, 100], got 1000"),
    (["--census-layers", "29"], "--census-layers must be in [1, 28], got 29"),
    (["--device", "tpu"], "--device"),
    pytest.param(["--device", "cuda"], "no CUDA device here",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")),
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


def test_ratios_become_claims_against_their_targets():
    rows = [Row("qkvo", "reference", 8, 1, 100.0), Row("qkvo", "fused", 64, 1, 4.0), Row("qkvo", "dense", 64, 1, 1.0),
            Row("mixer", "reference", 8, 1, 30.0), Row("mixer", "fused", 64, 1, 2.0),
            Row("mixer", "dense", 64, 1, 1.0), Row("block", "grt", 64, 1, 3.0, 12.0),
            Row("block", "dense", 64, 1, 2.0, 10.0)]
    found = {c.id: c for c in claims(rows, "float32")}
    assert set(found) == {"bench.fused_vs_reference", "bench.qkvo_vs_dense", "bench.mixer_vs_dense",
                          "bench.block_step_vs_dense", "bench.peak_memory_vs_dense"}  # cases not run: no claim
    assert found["bench.fused_vs_reference"].measured == 15.0  # the worst of Q/K/V/O (25x) and mixer (15x)
    assert not found["bench.fused_vs_reference"].holds
    assert found["bench.qkvo_vs_dense"].measured == 4.0 and not found["bench.qkvo_vs_dense"].holds
    assert found["bench.mixer_vs_dense"].measured == 2.0 and found["bench.mixer_vs_dense"].holds
    assert math.isclose(found["bench.block_step_vs_dense"].measured, 2 / 3)
    assert found["bench.peak_memory_vs_dense"].measured == 1.2
    assert all(c.stated == TARGETS[c.id][0] for c in found.values())
    details = found["bench.qkvo_vs_dense"].details
    assert details["backend"] == "fused" and math.isnan(details["eager"])  # no eager row given
    census = {"layers": 4, "wall_s": 30.0, "cpu_s": 40.0, "peak_gb": 3.0, "gauges": 8}
    assert not [c for c in claims([], "float32", census) if c.id.startswith("bench.census")]  # judged at 28 only
    full = {c.id: c for c in claims([], "float32", census | {"layers": 28, "wall_s": 700.0})}
    assert not full["bench.census_qwen3_seconds"].holds and full["bench.census_qwen3_peak_gb"].holds
