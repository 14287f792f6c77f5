"""Property-based CLI fuzzing: every CLI, fed flag values drawn from NaN, inf, negatives, empty
strings, junk, and paths that are files, folders or unwritable (under a file), ends in success or in a
one-line error -- never a traceback, never a partial output file, and fast (bad input is refused before
any work: a draw still running after ``ALARM_S`` seconds fails).  The hf, evaluate and bench CLIs
are drawn too, and *input-equals-output* draws: an output flag given the path of one of the command's inputs (the
same file, a file inside an input folder, a checkpoint, its checksum, its run's log), which must be refused
with the sandbox untouched.

Each CLI's ``main(argv)`` runs in-process inside a scratch folder (the current directory during the
call).  Every draw holds only invalid values, so the expected outcome is exit status 1 or 2 with one
error line (argparse's usage block above it allowed) and the scratch folder unchanged.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import shutil
import signal
import sys
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
        "--seed": BAD_INT, "--d-model": BAD_INT, "--n-heads": BAD_INT, "--n-layers": BAD_INT, "--block-size": BAD_INT,
        "--max-tokens": BAD_INT, "--lr": BAD_FLOAT, "--json": BAD_OUT_FILE, "--out-dir": BAD_OUT_DIR,
        "--model": ("gpt", ""), "--dtype": ("float16", ""), "--device": ("tpu", ""), "--corpus": BAD_DATA[:2],
        "--set": ("lr=nan", "bogus=1", "model.vocab_size=0", "x", "wd=nan", "model.init_std=-1"),
        "--heads": ("2",), "--recipe": ("nope", ""), "--config": ("missing.json", "afile"),
    }, ("--quiet",)),
    "lm.sample": ("lm.sample", {
        "--checkpoint": ("missing.pt", "adir", "afile", ""), "--tokens": BAD_INT, "--temperature": BAD_FLOAT,
        "--top-k": ("-1", "257", "nan", ""), "--seed": BAD_INT, "--prompt": ("",), "--json": BAD_OUT_FILE,
        "--device": ("tpu", ""),
    }, ()),
    "gauge": ("gauge.__main__", {
        "--d-model": BAD_INT, "--n-heads": BAD_INT, "--n-layers": BAD_INT, "--batch-size": BAD_INT,
        "--block-size": BAD_INT, "--train-steps": BAD_INT, "--lr": BAD_FLOAT, "--c-min": BAD_FLOAT,
        "--c-max": BAD_FLOAT, "--c-points": BAD_INT, "--eps": ("nan", "abc", "", "-1"),
        "--census-c": ("nan", "", "-1", "0"), "--seed": BAD_INT, "--threads": BAD_INT, "--json": BAD_OUT_FILE,
        "--corpus": BAD_DATA, "--dtype": ("float16", ""), "--heads": ("2",),
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
        "--only": ("nosuch", ",", ""), "--checkpoint": ("missing.pt", "adir"),
        "--seed": BAD_INT, "--threads": BAD_INT, "--claims": ("bogus", "", ","), "--json": BAD_OUT_FILE,
        "--out-dir": ("afile", "afile/sub", "/sys/rmsgauge-fuzz"),
    }, ("--out-dir", "figs", "--quick")),
    "proofs": ("proofs.__main__", {
        "--only": ("zzz-no-such-proof",), "--json": BAD_OUT_FILE,
    }, ()),
    "lm.hf import": ("lm.hf", {
        "--model-dir": ("missing", "afile", "emptydir", "adir"), "--checkpoint": ("adir", "afile/x.pt", ""),
        "--ckpt": ("new.pt",),
    }, ("import", "--model-dir", "HF", "--checkpoint", "new.pt")),
    "lm.hf export": ("lm.hf", {
        "--checkpoint": ("missing.pt", "adir", "afile", "junk.pt"), "--out-dir": ("afile", "afile/sub", "", "adir"),
        "--reference": ("gpt",),
    }, ("export", "--checkpoint", "RUN/ckpt.pt", "--out-dir", "exp")),
    "lm.evaluate": ("lm.evaluate", {
        "--batch-size": BAD_INT, "--limit": BAD_INT, "--num-fewshot": BAD_INT, "--bootstrap-iters": BAD_INT,
        "--device": ("tpu", "cuda:x"), "--json": BAD_OUT_FILE, "--model-dir": ("missing", "afile", "emptydir"),
        "--tasks": ("", ","), "--include-path": ("missing", "afile"),
    }, ("--model-dir", "HF", "--tasks", "fuzz_mc", "--include-path", "tasks", "--only-include-path")),
    "lm.bench": ("lm.bench.__main__", {
        "--batch-size": BAD_INT, "--repeats": BAD_INT, "--warmup": BAD_INT, "--threads": BAD_INT,
        "--sample-bytes": BAD_INT, "--census-layers": BAD_INT, "--case": ("nosuch", ""), "--dtype": ("float16", ""),
        "--device": ("tpu", ""), "--json": BAD_OUT_FILE,
    }, ("--case", "model", "--batch-size", "1", "--repeats", "1", "--warmup", "0")),
}
FIXTURE_CLIS = {"lm.hf import", "lm.hf export", "lm.evaluate"}  # need a trained run, an export and a task


class TooSlow(BaseException):  # not an Exception: a CLI's catch-all must not swallow it
    """The draw was still running after ALARM_S seconds: validation came after work began."""


def _alarm(signum, frame):
    raise TooSlow


def _snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else -1) for p in root.rglob("*")}


def _sandbox(fixtures: bool = False) -> Path:
    root = Path(tempfile.mkdtemp(prefix="rmsgauge-fuzz-"))
    if fixtures:
        shutil.rmtree(root)
        shutil.copytree(_template(), root)
        return root
    (root / "afile").write_text("not a folder\n")
    (root / "adir").mkdir()
    (root / "adir" / "keep.txt").write_text("x\n")
    (root / "emptydir").mkdir()
    return root


_TEMPLATE: list[Path] = []


def _template() -> Path:
    """Built once: the plain sandbox plus a corpus, a tiny trained run (RUN), its export (HF), a local task."""
    if _TEMPLATE:
        return _TEMPLATE[0]
    from lm.dense import DenseConfig
    from lm.loop import train
    from lm.trainconfig import TrainConfig
    from rmsgauge.corpus import bundled_corpus_files

    root = _sandbox()
    (root / "c.txt").write_bytes(bundled_corpus_files()[0].read_bytes()[:8_000])
    (root / "junk.pt").write_bytes(b"not a checkpoint")
    cfg = TrainConfig(max_steps=1, batch_size=2, warmup_steps=1, eval_interval=0, eval_batches=1, log_interval=1,
                      gauge_interval=0, probe_gauges=False, device="cpu", threads=1, data=str(root / "c.txt"),
                      out_dir=str(root / "RUN"))
    train("dense", DenseConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, block_size=16), cfg, progress=False)
    try:
        from lm.hf import save_pretrained_dir

        save_pretrained_dir(root / "RUN" / "ckpt.pt", root / "HF")
    except ModuleNotFoundError:  # no hf extra: the hf and evaluate draws are skipped
        pass
    (root / "fuzzmodels.py").write_text(  # a user's model module for gauge census --model fuzzmodels:make
        "import torch\nfrom torch import nn\n\n\ndef make():\n    m = nn.Sequential(nn.Linear(4, 4, bias=False), "
        "nn.RMSNorm(4))\n    x = torch.ones(3, 4)\n    return m, lambda mm: mm(x.double()).pow(2).sum()\n")
    results = root / "R"  # an experiment's records: what studies.experiments summary/status read
    (results / "logs").mkdir(parents=True)
    (results / "runs.json").write_text("[]")
    (results / "speed_probes.json").write_text("{}")
    (results / "logs" / "a.log.jsonl").write_text("{}\n")
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "mc.jsonl").write_text(json.dumps({"q": "The sky is", "choices": ["blue", "red"], "answer": 0}) + "\n")
    (tasks / "mc.yaml").write_text(
        f"task: fuzz_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tasks / 'mc.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{q}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: answer\nmetric_list:\n  - {metric: acc, aggregation: mean, higher_is_better: true}\n")
    _TEMPLATE.append(root)
    return root


# input-equals-output draws: (CLI, base argv, output flag, the inputs its value may name)
IO_CASES = {
    "lm.train": ("lm.train", ["--corpus", "c.txt", "--out-dir", "o", "--max-steps", "1", "--quiet"], "--json",
                 ("c.txt", "RUN/ckpt.pt")),
    "lm.train resume": ("lm.train", ["--out-dir", "RUN", "--resume", "--max-steps", "2", "--quiet"], "--json",
                        ("RUN/ckpt.pt", "RUN/ckpt.pt.sha256", "RUN/log.jsonl", "RUN/summary.json")),
    "lm.train sample": ("lm.train", ["sample", "--checkpoint", "RUN/ckpt.pt", "--tokens", "2"], "--json",
                        ("RUN/ckpt.pt", "RUN/ckpt.pt.sha256", "RUN/log.jsonl", "RUN/summary.json")),
    "lm.sample": ("lm.sample", ["--checkpoint", "RUN/ckpt.pt", "--tokens", "2"], "--json",
                  ("RUN/ckpt.pt", "RUN/ckpt.pt.sha256", "RUN/log.jsonl")),
    "gauge": ("gauge.__main__", ["--corpus", "c.txt", "--train-steps", "0", "--quiet"], "--json", ("c.txt",)),
    "lm.hf import": ("lm.hf", ["import", "--model-dir", "HF"], "--checkpoint",
                     ("HF/model.safetensors", "HF/x.pt", "RUN/ckpt.pt", "HF/SHA256SUMS")),
    "lm.hf export": ("lm.hf", ["export", "--checkpoint", "RUN/ckpt.pt"], "--out-dir", ("RUN", "HF", ".")),
    "lm.evaluate": ("lm.evaluate", ["--model-dir", "HF", "--tasks", "fuzz_mc", "--include-path", "tasks",
                                    "--only-include-path"], "--json",
                    ("tasks/mc.jsonl", "tasks/mc.yaml", "HF/config.json", "HF/new.json", "tasks/new.json")),
    "figures": ("figures.__main__", ["--checkpoint", "RUN/ckpt.pt", "--only", "grt.fig_gates", "--quick"], "--json",
                ("RUN/ckpt.pt", "RUN/ckpt.pt.sha256")),
    "gauge census": ("gauge.census.cli", ["--model", "fuzzmodels:make", "--quiet"], "--json", ("fuzzmodels.py",)),
    "studies.experiments summary": ("studies.experiments", ["summary", "--results", "R", "--runs-dir", "RUN"],
                                    "--json", ("R/runs.json", "R/speed_probes.json", "R/logs/a.log.jsonl",
                                               "R/new.json", "RUN/log.jsonl")),
}


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
    _refused_untouched(name, module, argv, _sandbox(fixtures=name in FIXTURE_CLIS))


def _refused_untouched(name: str, module: str, argv: list[str], root: Path) -> None:
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
test_fuzz_gauge = _fuzz_test("gauge")
test_fuzz_dynamics = _fuzz_test("dynamics")
test_fuzz_grt_model = _fuzz_test("grt_model")
test_fuzz_figures = _fuzz_test("figures")
test_fuzz_proofs = _fuzz_test("proofs")
test_fuzz_lm_bench = _fuzz_test("lm.bench")


def _needs_hf():
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    if not (_template() / "HF").is_dir():
        pytest.skip("no export in the fuzz template")


@settings(max_examples=6)
@given(pairs=_draw("lm.hf import"))
def test_fuzz_lm_hf_import(pairs):
    _needs_hf()
    _check("lm.hf import", pairs)


@settings(max_examples=6)
@given(pairs=_draw("lm.hf export"))
def test_fuzz_lm_hf_export(pairs):
    _needs_hf()
    _check("lm.hf export", pairs)


@settings(max_examples=6)
@given(pairs=_draw("lm.evaluate"))
def test_fuzz_lm_evaluate(pairs):
    _needs_hf()
    pytest.importorskip("lm_eval", reason="the eval extra is not installed")
    _check("lm.evaluate", pairs)


@settings(max_examples=12)
@given(data=st.data())
def test_fuzz_input_equals_output(data):
    """An output flag naming one of the command's inputs (or a file inside an input folder) is refused before
    any work, and nothing in the sandbox changes."""
    name = data.draw(st.sampled_from(sorted(IO_CASES)), label="cli")
    module, base, out_flag, inputs = IO_CASES[name]
    if module in ("lm.hf", "lm.evaluate"):
        _needs_hf()
    target = data.draw(st.sampled_from(inputs), label="input")
    _refused_onto_input(name, target)


def _refused_onto_input(name: str, target: str) -> None:
    module, base, out_flag, _ = IO_CASES[name]
    root = _sandbox(fixtures=True)
    sys.path.insert(0, str(root))  # the census imports the user's module from where the user stands
    try:
        _refused_untouched(name, module, [*base, out_flag, target], root)
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("fuzzmodels", None)


@pytest.mark.parametrize(("name", "target"), [(n, t) for n, case in sorted(IO_CASES.items()) for t in case[3]])
def test_every_output_onto_every_input_is_refused(name, target):
    """Each pair the draws above sample from, every time: no input of any command is ever written over."""
    if IO_CASES[name][0] in ("lm.hf", "lm.evaluate"):
        _needs_hf()
    _refused_onto_input(name, target)


def test_tiny_successful_runs_train_and_sample():
    """A few valid draws succeed, writing exactly their outputs."""
    from rmsgauge.corpus import bundled_corpus_files

    root = _sandbox()
    (root / "c.txt").write_bytes(bundled_corpus_files()[0].read_bytes()[:8_000])
    argv = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--block-size", "16", "--set", "d_ff=32",
            "--batch-size", "2", "--max-steps", "2", "--threads", "1", "--device", "cpu", "--corpus", "c.txt",
            "--out-dir", "run", "--json", "s.json", "--quiet"]
    code, _, err = run_cli("lm.train", argv, root)
    assert code == 0, err
    assert {"run/ckpt.pt", "run/ckpt.pt.sha256", "run/log.jsonl", "run/summary.json", "s.json"} <= set(_snapshot(root))
    for prompt, temp in (("a", "0"), ("ROMEO", "1e-300"), ("é", "100")):
        code, _, err = run_cli("lm.sample", ["--checkpoint", "run/ckpt.pt", "--prompt", prompt, "--temperature", temp,
                                             "--tokens", "3"], root)
        assert code == 0, err


@pytest.mark.parametrize("name", sorted(CLIS))
def test_help_is_words_not_keys(name):
    """``--help`` works for every CLI and exits 0 (and lm.train's explains flags in words, not config keys)."""
    root = _sandbox()
    sub = [a for a in CLIS[name][2][:1] if not a.startswith("-")]  # a subcommand CLI: its subcommand's help
    code, out, _ = run_cli(CLIS[name][0], [*sub, "--help"], root)
    assert code == 0 and "usage:" in out
    if name == "lm.train":
        assert "train.max_steps" not in out and "optimizer steps to train for" in out


@pytest.mark.parametrize(("name", "argv"), [
    ("figures", ["--out-dir", "figs", "--json", "adir", "--only", "gauge.forward_invariance", "--quick"]),
    ("figures", ["--out-dir", "figs", "--checkpoint", "junk.pt", "--only", "grt.fig_gates", "--quick"]),
    ("lm.bench", ["--json", "adir", "--case", "model", "--batch-size", "1", "--repeats", "1", "--warmup", "0"]),
], ids=["figures-json-dir", "figures-junk-checkpoint", "bench-json-dir"])
def test_reported_slow_failures_are_refused_before_work(name, argv):
    """Inputs that once ran work before refusing, drawn deterministically: each is refused in one line first."""
    _refused_untouched(name, CLIS[name][0], argv, _sandbox(fixtures=True))
