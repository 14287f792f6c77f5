"""Property-based CLI fuzzing (issue 15): every CLI, fed flag values drawn from NaN, inf, negatives, empty
strings, junk, and paths that are files, folders or unwritable (under a file), ends in success or in a
one-line error -- never a traceback, never a partial output file, and fast (bad input is refused before
any work: a draw still running after ``ALARM_S`` seconds fails).

Each CLI's ``main(argv)`` runs in-process inside a scratch folder (the current directory during the
call).  Every draw holds only invalid values, so the expected outcome is exit status 1 or 2 with one
error line (argparse's usage block above it allowed) and the scratch folder unchanged.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import signal
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ALARM_S = 20  # generous for a first call's imports; a validation error takes milliseconds

BAD_INT = ("nan", "inf", "-1", "", "abc", "-inf", "1.5")
BAD_FLOAT = ("nan", "inf", "-inf", "", "abc", "-1")
BAD_OUT_FILE = ("adir", "afile/x.json", "")  # a folder, under a file (unwritable for anyone), empty
BAD_OUT_DIR = ("afile", "afile/sub", "")
BAD_DATA = ("missing.txt", "emptydir", "")

CLIS: dict[str, tuple[str, dict[str, tuple[str, ...]], tuple[str, ...]]] = {
    # name: (module with main, {flag: invalid values}, flags always passed (valid, keep outputs in the sandbox))
    "lm.train": ("lm.train", {
        "--max-steps": BAD_INT, "--batch-size": BAD_INT, "--eval-interval": BAD_INT, "--threads": BAD_INT,
        "--seed": BAD_INT, "--d-model": BAD_INT, "--n-heads": BAD_INT, "--n-layers": BAD_INT, "--seq-len": BAD_INT,
        "--max-tokens": BAD_INT, "--lr": BAD_FLOAT, "--json": BAD_OUT_FILE, "--out-dir": BAD_OUT_DIR,
        "--model": ("gpt", ""), "--dtype": ("float16", ""), "--device": ("tpu", ""), "--data": BAD_DATA[:2],
        "--set": ("lr=nan", "bogus=1", "model.vocab_size=0", "x", "wd=nan", "model.init_std=-1"),
        "--block-size": ("8",), "--heads": ("2",), "--recipe": ("nope", ""), "--config": ("missing.json", "afile"),
    }, ("--quiet",)),
    "lm.sample": ("lm.sample", {
        "--ckpt": ("missing.pt", "adir", "afile", ""), "--tokens": BAD_INT, "--temperature": BAD_FLOAT,
        "--top-k": ("-1", "257", "nan", ""), "--seed": BAD_INT, "--prompt": ("",), "--json": BAD_OUT_FILE,
        "--device": ("tpu", ""),
    }, ()),
    "lm.compare": ("lm.compare", {
        "--budget-tokens": BAD_INT, "--lrs": ("nan", "-1", "", "abc", "10"), "--batch-size": BAD_INT,
        "--evals": BAD_INT, "--eval-batches": BAD_INT, "--jobs": BAD_INT, "--seed": BAD_INT,
        "--wall-d-model": ("-2", "nan", "50"), "--json": BAD_OUT_FILE, "--out-dir": BAD_OUT_DIR,
        "--grt": ("width=3", "d_model=abc", "x"), "--out": ("runs",), "--device": ("tpu",),
    }, ("--quick", "--jobs", "0")),
    "gauge": ("gauge.__main__", {
        "--d-model": BAD_INT, "--n-heads": BAD_INT, "--n-layers": BAD_INT, "--batch-size": BAD_INT,
        "--seq-len": BAD_INT, "--train-steps": BAD_INT, "--lr": BAD_FLOAT, "--c-min": BAD_FLOAT,
        "--c-max": BAD_FLOAT, "--c-points": BAD_INT, "--eps": ("nan", "abc", "", "-1"),
        "--census-c": ("nan", "", "-1", "0"), "--seed": BAD_INT, "--threads": BAD_INT, "--json": BAD_OUT_FILE,
        "--corpus": BAD_DATA, "--dtype": ("float16", ""), "--heads": ("2",), "--block": ("8",),
    }, ()),
    "dynamics": ("dynamics.__main__", {
        "--optimizer": ("adam", ""), "--decay": ("x",), "--lr": BAD_FLOAT, "--wd": (*BAD_FLOAT, "1"),
        "--momentum": (*BAD_FLOAT, "1"), "--betas": ("1,1", "nan,0.9", "", "0.9"), "--steps": BAD_INT,
        "--seed": BAD_INT, "--dtype": ("float16", ""), "--json": BAD_OUT_FILE,
    }, ()),
    "grt_model": ("grt_model.__main__", {
        "--preset": ("big", ""), "--set": ("x=1", "d_model=abc", "n_heads=3"), "--seed": BAD_INT,
        "--dtype": ("float16", ""), "--device": ("tpu", ""), "--batch-size": BAD_INT, "--seq-len": BAD_INT,
        "--threads": BAD_INT, "--json": BAD_OUT_FILE, "--n-heads": BAD_INT, "--d-model": BAD_INT,
    }, ()),
    "figures": ("figures.__main__", {
        "--only": ("nosuch", ",", ""), "--checkpoint": ("missing.pt", "adir"), "--cache-dir": ("afile",),
        "--seed": BAD_INT, "--threads": BAD_INT, "--claims": ("bogus", "", ","), "--json": BAD_OUT_FILE,
        "--out": ("afile", "afile/sub"),
    }, ("--out", "figs", "--quick")),
    "proofs": ("proofs.__main__", {
        "--only": ("zzz-no-such-proof",), "--json": BAD_OUT_FILE,
    }, ()),
}


class TooSlow(BaseException):  # not an Exception: a CLI's catch-all must not swallow it
    """The draw was still running after ALARM_S seconds: validation came after work began."""


def _alarm(signum, frame):
    raise TooSlow


def _snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else -1) for p in root.rglob("*")}


def _sandbox() -> Path:
    root = Path(tempfile.mkdtemp(prefix="rmsgauge-fuzz-"))
    (root / "afile").write_text("not a folder\n")
    (root / "adir").mkdir()
    (root / "adir" / "keep.txt").write_text("x\n")
    (root / "emptydir").mkdir()
    return root


def run_cli(module: str, argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """``main(argv)`` of ``module`` inside ``cwd``: (exit status, stdout, stderr); a traceback fails the test."""
    main = importlib.import_module(module).main
    out, err = io.StringIO(), io.StringIO()
    old_cwd = os.getcwd()
    old_handler = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ALARM_S)
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code
    except TooSlow:
        pytest.fail(f"{module} {argv}: still running after {ALARM_S}s (bad input must be refused before work)")
    except Exception as e:  # an escaped exception is a traceback for the user
        pytest.fail(f"{module} {argv}: traceback {type(e).__name__}: {e}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)
        os.chdir(old_cwd)
    return (0 if code is None else code), out.getvalue(), err.getvalue()


def _error_lines(err: str) -> list[str]:
    """stderr without argparse's usage block (``usage:`` and its indented continuation lines)."""
    lines, in_usage = [], False
    for ln in err.splitlines():
        if ln.startswith("usage:"):
            in_usage = True
            continue
        if in_usage and ln.startswith(" "):
            continue
        in_usage = False
        if ln.strip():
            lines.append(ln)
    return lines


def _draw(name: str):
    flags = CLIS[name][1]
    return st.lists(st.sampled_from(sorted(flags)), min_size=1, max_size=3, unique=True).flatmap(
        lambda chosen: st.tuples(*[st.sampled_from(flags[f]).map(lambda v, f=f: (f, v)) for f in chosen]))


def _check(name: str, pairs: tuple[tuple[str, str], ...]) -> None:
    module, _, fixed = CLIS[name]
    argv = [*fixed]
    for flag, value in pairs:
        argv += [flag, value]
    root = _sandbox()
    before = _snapshot(root)
    code, _, err = run_cli(module, argv, root)
    assert "Traceback" not in err, f"{name} {argv}: traceback on stderr:\n{err}"
    assert code in (1, 2), f"{name} {argv}: exit status {code} for invalid input (stderr: {err!r})"
    lines = _error_lines(err)
    assert len(lines) == 1, f"{name} {argv}: expected one error line, got {len(lines)}:\n{err}"
    after = _snapshot(root)
    assert after == before, f"{name} {argv}: wrote {sorted(set(after) - set(before))} although it failed"


def _fuzz_test(name: str):
    @settings(max_examples=8)
    @given(pairs=_draw(name))
    def test(pairs):
        _check(name, pairs)

    return test


test_fuzz_lm_train = _fuzz_test("lm.train")
test_fuzz_lm_sample = _fuzz_test("lm.sample")
test_fuzz_lm_compare = _fuzz_test("lm.compare")
test_fuzz_gauge = _fuzz_test("gauge")
test_fuzz_dynamics = _fuzz_test("dynamics")
test_fuzz_grt_model = _fuzz_test("grt_model")
test_fuzz_figures = _fuzz_test("figures")
test_fuzz_proofs = _fuzz_test("proofs")


def test_tiny_successful_runs_train_and_sample():
    """A few valid draws succeed, writing exactly their outputs."""
    from lm.corpus import bundled_corpus_files

    root = _sandbox()
    (root / "c.txt").write_bytes(bundled_corpus_files()[0].read_bytes()[:8_000])
    argv = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--seq-len", "16", "--set", "d_ff=32",
            "--batch-size", "2", "--max-steps", "2", "--threads", "1", "--device", "cpu", "--data", "c.txt",
            "--out-dir", "run", "--json", "s.json", "--quiet"]
    code, _, err = run_cli("lm.train", argv, root)
    assert code == 0, err
    assert {"run/ckpt.pt", "run/ckpt.pt.sha256", "run/log.jsonl", "run/summary.json", "s.json"} <= set(_snapshot(root))
    for prompt, temp in (("a", "0"), ("ROMEO", "1e-300"), ("é", "100")):
        code, _, err = run_cli("lm.sample", ["--ckpt", "run/ckpt.pt", "--prompt", prompt, "--temperature", temp,
                                             "--tokens", "3"], root)
        assert code == 0, err


@pytest.mark.parametrize("name", sorted(CLIS))
def test_help_is_words_not_keys(name):
    """``--help`` works for every CLI and exits 0 (and lm.train's explains flags in words, not config keys)."""
    root = _sandbox()
    code, out, _ = run_cli(CLIS[name][0], ["--help"], root)
    assert code == 0 and "usage:" in out
    if name == "lm.train":
        assert "train.max_steps" not in out and "optimizer steps to train for" in out
