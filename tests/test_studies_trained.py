"""python -m studies.trained --checkpoint PATH: the trained-model claims on any GRT run (here a tiny one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grt_model.config import GRTConfig
from lm.loop import train
from lm.trainconfig import TrainConfig
from studies.trained import CLAIMS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_grt")
    cfg = GRTConfig.small(d_model=16, n_heads=2, n_blocks=1, d_ff=32, block_size=16)
    train("grt", cfg, TrainConfig(lr=3e-3, max_steps=3, batch_size=4, eval_interval=0, log_interval=1,
                                  gauge_interval=0, probe_gauges=False, threads=1, out_dir=str(out)), progress=False)
    return out


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "studies.trained", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_claims_on_a_checkpoint(tiny_run, tmp_path):
    out = tmp_path / "claims.json"
    res = _cli("--checkpoint", str(tiny_run / "ckpt.pt"), "--json", str(out), "--jac-tokens", "5")
    assert res.returncode in (0, 1), res.stderr
    rec = json.loads(out.read_text())
    assert rec["jac_tokens"] == 5
    det = next(c for c in rec["claims"] if c["id"] == "grt.coupled_det_sign_trained")
    n_proj = 4 * rec["config"]["n_blocks"] + rec["config"]["n_blocks"]  # q, k, v, o per head-token, and the mixer
    assert det["measured"]["of"] <= 5 * rec["config"]["n_heads"] * n_proj  # 5 Jacobian tokens, not the default 128
    assert [c["id"] for c in rec["claims"]] == list(CLAIMS.checks)  # no dense model given: no trained_vs_dense
    assert all(c["summary"] for c in rec["claims"])
    assert res.stdout.strip().splitlines()[-1].endswith(tuple(("hold", *(f"({c['dtype']})" for c in rec["claims"]))))


@pytest.mark.parametrize("args, needle", [
    (["--checkpoint", "no/such/ckpt.pt"], "no such file"),
    (["--seed", "-1"], "--seed must be in [0, 2**32)"),
    (["--jac-tokens", "0"], "--jac-tokens must be in [1, 4096]"),
])
def test_bad_input_is_one_line(args, needle):
    res = _cli(*args)
    assert res.returncode == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_output_equal_to_the_input_checkpoint_is_refused(tiny_run):
    ckpt = tiny_run / "ckpt.pt"
    before = ckpt.read_bytes()
    res = _cli("--checkpoint", str(ckpt), "--json", str(ckpt))
    assert res.returncode == 2 and "--json" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert ckpt.read_bytes() == before


def test_the_shipped_models_are_taken_by_name_or_by_their_file():
    import torch

    from studies.trained.__main__ import load

    by_default, card = load(None, "grt")
    by_name, _ = load(None, "grt", "grt")
    by_file, file_card = load(str(ROOT / "lm" / "reference_models" / "grt.pt"), "grt")
    assert card["sha256"] == file_card["sha256"]
    for m in (by_name, by_file):
        assert all(torch.equal(a, b) for a, b in zip(by_default.state_dict().values(), m.state_dict().values()))
    with pytest.raises(ValueError, match="is a 'dense' model"):
        load(None, "grt", "dense")


@pytest.mark.parametrize(("argv", "needle"), [
    (["--reference", "nope"], "no shipped model of that name"),
    (["--reference", "grt", "--checkpoint", "x.pt"], "give one of --checkpoint and --reference"),
])
def test_reference_flags_are_checked_before_work(argv, needle, capsys):
    from studies.trained.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err
