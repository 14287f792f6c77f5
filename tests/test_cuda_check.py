"""``bench/cuda_check.py``: skips cleanly without a GPU, and its checks run (eager on the CPU against the fused
kernels: the same code the GPU run executes, with the device swapped)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from grt_model.kernels import fused_available

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "cuda_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("cuda_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the script runs for real")
def test_skips_cleanly_without_a_gpu(capsys, tmp_path):
    assert _load().main(["--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "no CUDA device; skipped" in out[0]
    assert not (tmp_path / "c.json").exists()


def test_bad_flags_are_refused_before_work(capsys, tmp_path):
    for argv in (["--json", str(tmp_path)], ["--steps", "0"], ["--shapes", "huge"], ["--device", "tpu"]):
        with pytest.raises(SystemExit) as ex:
            _load().main(argv)
        assert ex.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.skipif(not fused_available(), reason="numba kernels unavailable")
def test_the_checks_run_with_the_eager_path_on_the_cpu():
    m = _load()
    lines = m.check_cascades(torch.device("cpu")) + m.check_ffn(torch.device("cpu"))
    assert len(lines) == 2 * len(m.CASCADES) + 2 and all(ln.startswith("equal") for ln in lines)
