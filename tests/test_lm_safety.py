"""Training and its files: nothing lost, nothing silently wrong.  Each test sets up one way a run could lose work
or report a wrong result (a run overwritten, a setting that crashes late, a non-finite loss, bytes changed on the
way, a misleading summary) and checks that it is refused or reported."""

from __future__ import annotations

import json
import math
import os
import signal
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from lm.checkpoint import checksum_path, load_checkpoint, save_checkpoint
from lm.dense import DenseConfig, DenseTransformer
from lm.errors import CheckpointError, NonFiniteError
from lm.loop import train
from lm.train import main
from lm.trainconfig import TrainConfig
from rmsgauge import atomic_write_json
from rmsgauge.corpus import ByteCorpus, bundled_corpus_files, load_bytes

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "block_size": 16}


def _argv(out: Path, data: Path, *extra: str) -> list[str]:
    return ["--model", "dense", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--block-size", "16",
            "--set", "d_ff=32", "--batch-size", "4", "--eval-interval", "2", "--set", "eval_batches=1",
            "--set", "warmup_steps=1", "--set", "log_interval=1", "--set", "gauge_interval=1", "--threads", "1",
            "--device", "cpu", "--corpus", str(data), "--out-dir", str(out), "--quiet", *extra]


def _cfg(out: Path, data: Path, **kw) -> TrainConfig:
    base = {"lr": 1e-2, "warmup_steps": 1, "batch_size": 4, "max_steps": 4, "eval_interval": 2, "eval_batches": 1,
            "log_interval": 1, "gauge_interval": 1, "ckpt_interval": 0, "device": "cpu", "threads": 1,
            "data": str(data), "out_dir": str(out)}
    return TrainConfig(**{**base, **kw})


def _code(fn, *args) -> int:
    """The exit status of a CLI ``main``: returned, or raised as SystemExit (argparse's usage errors)."""
    try:
        return fn(*args)
    except SystemExit as e:
        return e.code


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# ---- a new run never destroys an existing one --------------------------------------------------


def test_new_run_refuses_a_folder_holding_a_run(tmp_path, small_corpus, capsys):
    out = tmp_path / "a"
    assert main(_argv(out, small_corpus, "--max-steps", "3")) == 0
    log_before = (out / "log.jsonl").read_bytes()
    ckpt_before = (out / "ckpt.pt").read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(_argv(out, small_corpus, "--max-steps", "2"))
    assert exc.value.code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--resume" in line and "--force" in line and "already holds a run" in line
    assert (out / "log.jsonl").read_bytes() == log_before and (out / "ckpt.pt").read_bytes() == ckpt_before
    argv = _argv(out, small_corpus, "--max-steps", "2")
    argv[argv.index("--out-dir") + 1] = ""
    with pytest.raises(SystemExit):  # an empty --out-dir is refused, not turned into runs/train
        main(argv)
    assert "--out-dir must be a folder path" in capsys.readouterr().err


def test_force_moves_the_old_run_aside(tmp_path, small_corpus):
    out = tmp_path / "a"
    assert main(_argv(out, small_corpus, "--max-steps", "3")) == 0
    old_log = (out / "log.jsonl").read_bytes()
    assert main(_argv(out, small_corpus, "--max-steps", "2", "--force")) == 0
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("a.replaced-")]
    assert len(aside) == 1 and (aside[0] / "log.jsonl").read_bytes() == old_log
    assert load_checkpoint(out / "ckpt.pt")["step"] == 2 and load_checkpoint(aside[0] / "ckpt.pt")["step"] == 3


def test_train_api_refuses_to_overwrite_too(tmp_path, small_corpus):
    mcfg = DenseConfig(**TINY)
    train("dense", mcfg, _cfg(tmp_path / "r", small_corpus, max_steps=2), progress=False)
    with pytest.raises(ValueError, match="already holds a run"):
        train("dense", mcfg, _cfg(tmp_path / "r", small_corpus, max_steps=2), progress=False)


# ---- legal-looking settings that would crash after the run are refused before it -----------------


def test_lr_times_wd_is_checked_before_any_work(tmp_path, small_corpus, capsys):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as exc:
        main(_argv(out, small_corpus, "--lr", "10"))
    assert exc.value.code == 2
    assert "train.lr * train.wd must be in [0, 1)" in _one_error_line(capsys.readouterr().err)
    assert not out.exists()


# ---- non-finite training stops, keeps the last good checkpoint, exits non-zero ------------------


def test_nan_norm_eps_is_refused_before_training(tmp_path, small_corpus, capsys):
    """``--set model.norm_eps=nan`` would train NaN to the end: it is a usage error, before any step."""
    out = tmp_path / "n"
    with pytest.raises(SystemExit) as exc:
        main(_argv(out, small_corpus, "--max-steps", "4", "--set", "model.norm_eps=nan"))
    assert exc.value.code == 2
    assert "DenseConfig.norm_eps" in _one_error_line(capsys.readouterr().err) and not out.exists()


class _PoisonAt:
    """A hook that writes NaN into the weights after ``step``: the next step's loss is non-finite."""

    name = "poison"

    def __init__(self, step: int) -> None:
        self.step = step

    def on_start(self, model, optimizer, info):
        self.model = model

    def after_step(self, step, lr):
        if step == self.step:
            with torch.no_grad():
                next(self.model.parameters()).fill_(math.nan)

    def on_end(self, summary):
        pass


def test_nonfinite_training_loss_keeps_last_good_checkpoint(tmp_path, small_corpus):
    out = tmp_path / "p"
    cfg = _cfg(out, small_corpus, max_steps=6, ckpt_interval=2, eval_interval=0)
    with pytest.raises(NonFiniteError, match=r"step 4: the training loss is nan.*checkpoint.*step 2"):
        train("dense", DenseConfig(**TINY), cfg, progress=False, hooks=[_PoisonAt(3)])
    ck = load_checkpoint(out / "ckpt.pt")  # checksum verifies: the good one, untouched
    assert ck["step"] == 2 and all(torch.isfinite(v).all() for v in ck["model"].values())
    lines = (out / "log.jsonl").read_text().splitlines()
    recs = [json.loads(ln) for ln in lines]  # strict JSON: json.loads would accept NaN, so check the text too
    assert not any(tok in (out / "log.jsonl").read_text() for tok in ("NaN", "Infinity"))
    bad = [r for r in recs if r["event"] == "nonfinite"]
    assert bad and bad[0]["loss"] is None and "loss" in bad[0]["nonfinite"]
    assert not (out / "summary.json").exists()


def test_nonfinite_cli_exit_status_is_1(tmp_path, small_corpus, capsys, monkeypatch):
    rc = main(_argv(tmp_path / "q", small_corpus, "--max-steps", "4"), hooks_for=lambda cfg: [_PoisonAt(1)])
    assert rc == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "non-finite" in line and "--debug" in line


def test_logs_are_strict_json_with_null_and_flag(tmp_path):
    from lm.runlog import JsonLog

    log = JsonLog(tmp_path / "l.jsonl", None)
    log.write({"event": "eval", "step": 1, "val_loss": math.nan, "x": [1.0, math.inf]})
    text = (tmp_path / "l.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    rec = json.loads(text)
    assert rec["val_loss"] is None and rec["x"] == [1.0, None] and rec["nonfinite"] == ["val_loss", "x[1]"]


# ---- bytes in, bytes out ------------------------------------------------------------------------


def test_corpus_is_read_as_bytes(tmp_path):
    blob = bytes(range(256)) * 40 + b"\xff\xfe\x00\xc3"  # not UTF-8
    path = tmp_path / "blob.bin"
    path.write_bytes(blob)
    corpus = ByteCorpus.load(path)
    assert corpus.tokens.tobytes() == blob  # no U+FFFD, no growth
    assert load_bytes(path) == blob


def test_bundled_corpus_token_stream_is_unchanged():
    """Reading the bundled plays as bytes gives the token stream the text reader gave (the plays are UTF-8
    with LF newlines), so earlier runs' data order and splits stand."""
    files = bundled_corpus_files()
    old = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files).encode("utf-8")
    assert np.array_equal(ByteCorpus.load().tokens, np.frombuffer(old, dtype=np.uint8))


# ---- late checks and misleading summaries -------------------------------------------------------


@pytest.mark.parametrize("kind", ["json_dir", "json_under_file", "out_is_file", "out_under_file"])
def test_output_paths_are_checked_before_any_work(tmp_path, small_corpus, capsys, kind):
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    out, extra = tmp_path / "o", []
    if kind == "json_dir":
        extra = ["--json", str(tmp_path)]
    elif kind == "json_under_file":
        extra = ["--json", str(a_file / "s.json")]
    elif kind == "out_is_file":
        out = a_file
    else:
        out = a_file / "run"
    with pytest.raises(SystemExit) as exc:
        main(_argv(out, small_corpus, "--max-steps", "2", *extra))
    assert exc.value.code == 2
    _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "o").exists() and a_file.read_text() == "x"


def test_sample_json_dir_is_refused_before_sampling(tmp_path, small_corpus, capsys):
    from lm.sample import main as sample_main

    train("dense", DenseConfig(**TINY), _cfg(tmp_path / "m", small_corpus, max_steps=1), progress=False)
    with pytest.raises(SystemExit) as exc:
        sample_main(["--checkpoint", str(tmp_path / "m" / "ckpt.pt"), "--json", str(tmp_path)])
    assert exc.value.code == 2
    out = capsys.readouterr()
    assert out.out == "" and "is a directory" in _one_error_line(out.err)


def test_interrupted_summary_names_the_step_of_its_val_loss(tmp_path, small_corpus, capsys):
    out = tmp_path / "i"
    assert main(_argv(out, small_corpus, "--max-steps", "6", "--eval-interval", "0", "--stop-after", "3")) == 0
    printed = capsys.readouterr().out
    assert "val loss at step 0" in printed and "stopped at step 3" in printed
    assert "final val loss" not in printed
    assert json.loads((out / "summary.json").read_text())["final_val_step"] == 0


def test_gauge_summary_after_resume_covers_the_whole_run(tmp_path, small_corpus):
    from studies.train import monitor_hooks

    mcfg = DenseConfig(**TINY)
    cfg_full, cfg_part = (_cfg(tmp_path / n, small_corpus, max_steps=8) for n in ("full", "part"))
    full = train("dense", mcfg, cfg_full, progress=False, hooks=monitor_hooks(cfg_full))
    train("dense", mcfg, cfg_part, stop_after=5, progress=False, hooks=monitor_hooks(cfg_part))
    resumed = train("dense", mcfg, cfg_part, resume=True, progress=False, hooks=monitor_hooks(cfg_part))
    assert full["equilibrium"]["groups"] and full["equilibrium"]["steps"] == 8
    assert resumed["equilibrium"] == full["equilibrium"]  # same samples, bit for bit


def test_sigint_during_evaluation_is_acknowledged(tmp_path, small_corpus, capsys, monkeypatch):
    import lm.loop as lt  # the loop calls evaluate from its own module

    real = lt.evaluate
    calls = []

    def evaluate_and_interrupt(*a, **kw):
        calls.append(1)
        if len(calls) == 2:  # the evaluation at step 2
            signal.raise_signal(signal.SIGINT)
        return real(*a, **kw)

    monkeypatch.setattr(lt, "evaluate", evaluate_and_interrupt)
    s = train("dense", DenseConfig(**TINY), _cfg(tmp_path / "s", small_corpus, max_steps=8), progress=False)
    err = capsys.readouterr().err
    assert "SIGINT received while evaluating at step 2" in err and "stopping after the current step" in err
    assert s["interrupted"] and s["steps"] == 2 and load_checkpoint(tmp_path / "s" / "ckpt.pt")["step"] == 2


# ---- smaller guards ----------------------------------------------------------------------------


@pytest.mark.parametrize(("setting", "message"), [
    ("model.vocab_size=512", "model.vocab_size must be 256"),
    ("model.init_std=nan", "DenseConfig.init_std must be a finite number in [0, inf)"),
    ("model.init_std=-1", "DenseConfig.init_std must be a finite number in [0, inf)"),
    ("model.qk_norm_eps=inf", "DenseConfig.qk_norm_eps must be a finite number in [0, inf)"),
])
def test_model_keys_are_validated(tmp_path, small_corpus, capsys, setting, message):
    with pytest.raises(SystemExit) as exc:
        main(_argv(tmp_path / "v", small_corpus, "--set", setting))
    assert exc.value.code == 2 and message in _one_error_line(capsys.readouterr().err)


def test_memory_is_estimated_before_building(tmp_path, small_corpus, capsys):
    with pytest.raises(SystemExit) as exc:
        main(_argv(tmp_path / "big", small_corpus, "--d-model", "65536", "--n-heads", "2", "--set", "d_ff=262144",
                   "--n-layers", "64"))
    assert exc.value.code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "this run needs at least" in line and "GB" in line and "available" in line
    assert not (tmp_path / "big").exists()


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory, small_corpus) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "run"
    train("dense", DenseConfig(**TINY), _cfg(out, small_corpus, max_steps=1), progress=False)
    return out / "ckpt.pt"


def _ckpt_with_vocab(tmp_path: Path, vocab: int) -> Path:
    model = DenseTransformer(DenseConfig(**{**TINY, "vocab_size": vocab}))
    return save_checkpoint(tmp_path / f"v{vocab}.pt", model_kind="dense", model=model, optimizer=None,
                           train_config={}, step=0, tokens_seen=0)


def test_sampling_edge_cases(tmp_path, tiny_ckpt, capsys):
    from lm.sample import main as sample_main
    from lm.sample import sample_bytes

    wide = _ckpt_with_vocab(tmp_path, 512)  # ids >= 256 are not bytes: never drawn
    for seed in range(4):
        out = sample_bytes(str(wide), "ab", 30, temperature=5.0, top_k=0, seed=seed)
        assert len(out) == 32
    narrow = _ckpt_with_vocab(tmp_path, 128)
    with pytest.raises(SystemExit) as exc:
        sample_main(["--checkpoint", str(narrow), "--prompt", "naïve"])
    assert exc.value.code == 2 and "outside the model's vocabulary of 128" in _one_error_line(capsys.readouterr().err)
    tiny_t = sample_bytes(str(tiny_ckpt), "ab", 5, temperature=1e-320, top_k=0)  # greedy in the limit
    greedy = sample_bytes(str(tiny_ckpt), "ab", 5, temperature=0.0)
    assert tiny_t == greedy
    with pytest.raises(SystemExit) as exc:
        sample_main(["--checkpoint", str(tiny_ckpt), "--prompt", ""])
    assert exc.value.code == 2 and "--prompt must hold at least one byte" in capsys.readouterr().err


def test_checkpoint_sha256_detects_a_flipped_bit(tmp_path, tiny_ckpt, capsys):
    from lm.sample import main as sample_main

    copy = tmp_path / "ckpt.pt"
    data = bytearray(tiny_ckpt.read_bytes())
    data[len(data) // 2] ^= 0x01
    copy.write_bytes(bytes(data))
    checksum_path(copy).write_bytes(checksum_path(tiny_ckpt).read_bytes())
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(copy)
    assert sample_main(["--checkpoint", str(copy), "--tokens", "2"]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert str(copy) in line and "sha256" in line


@pytest.mark.parametrize(("sidecar", "words"), [
    (b"", "the checksum file is empty"),
    (b"\n  \n", "the checksum file is empty"),
    (b"not-a-digest  ckpt.pt\n", "is not a sha256sum line"),
])
def test_a_broken_checksum_file_is_one_line_naming_it(tmp_path, tiny_ckpt, capsys, sidecar, words):
    import shutil

    run = shutil.copytree(tiny_ckpt.parent, tmp_path / "run")
    checksum_path(run / "ckpt.pt").write_bytes(sidecar)
    assert _code(main, ["--out-dir", str(run), "--resume", "--max-steps", "2", "--quiet"]) in (1, 2)
    line = _one_error_line(capsys.readouterr().err)
    assert str(checksum_path(run / "ckpt.pt")) in line and words in line, line
    with pytest.raises(CheckpointError, match=words):
        load_checkpoint(run / "ckpt.pt")


def test_corrupt_checkpoint_is_one_line_naming_the_file(tmp_path, capsys):
    from lm.sample import main as sample_main

    bad = tmp_path / "junk.pt"
    bad.write_bytes(b"not a checkpoint at all")
    assert sample_main(["--checkpoint", str(bad), "--tokens", "2"]) == 1
    assert str(bad) in _one_error_line(capsys.readouterr().err)


def test_resume_on_changed_data_is_refused(tmp_path, small_corpus, capsys):
    data = tmp_path / "d.txt"
    data.write_bytes(small_corpus.read_bytes())
    out = tmp_path / "c"
    assert main(_argv(out, data, "--max-steps", "4", "--stop-after", "2")) == 0
    data.write_bytes(small_corpus.read_bytes()[::-1])
    capsys.readouterr()
    assert _code(main, ["--out-dir", str(out), "--resume", "--quiet"]) == 2
    assert "the data changed since the checkpoint" in _one_error_line(capsys.readouterr().err)


def test_orphan_tmp_of_a_killed_save_is_cleaned(tmp_path, small_corpus, capsys):
    out = tmp_path / "t"
    assert main(_argv(out, small_corpus, "--max-steps", "4", "--stop-after", "2")) == 0
    orphan = out / ".ckpt.pt.abc123.tmp"  # what a save killed mid-write leaves
    orphan.write_bytes(b"half")
    assert main(["--out-dir", str(out), "--resume", "--quiet"]) == 0
    assert not orphan.exists() and "removed .ckpt.pt.abc123.tmp" in capsys.readouterr().err


def test_atomic_writes_respect_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write_json(tmp_path / "x.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_data_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for data, msg in ((tmp_path / "missing", "does not exist"), (tmp_path / "empty", "holds no text files")):
        with pytest.raises(SystemExit) as exc:
            main(_argv(tmp_path / "o", data))
        assert exc.value.code == 2 and msg in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()
