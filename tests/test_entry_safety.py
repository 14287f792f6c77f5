"""Every entry point: nothing lost, nothing silently wrong.  One test per hazard (most are one CLI call), plus the
guard itself: ``rmsgauge.cli`` (one parser helper, one main, the output/input check), the run
folder's lock, the checksum policy, training longer, corrupt checkpoints, the Euler record, the matched-width claim, and
every parser's flags against the shared names.  The hf / lm-eval cases live in tests/test_hf.py and
tests/test_lm_eval.py (they need the extras)."""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import threading
from pathlib import Path

import pytest
import tomllib
import torch

from lm.checkpoint import checksum_path, load_checkpoint, save_checkpoint
from lm.dense import DenseConfig, DenseTransformer
from lm.errors import CheckpointError, RunFolderBusy
from lm.loop import train
from lm.runlog import LOCK_NAME, RunLock
from lm.train import main
from lm.trainconfig import TrainConfig
from rmsgauge.atomic import sha256_bytes
from rmsgauge.cli import (
    CONSOLE_COMMANDS,
    Failure,
    OneLineArgumentParser,
    check_outputs_against_inputs,
    make_parser,
    run_main,
)
from rmsgauge.corpus import bundled_corpus_files

ROOT = Path(__file__).resolve().parents[1]
TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "block_size": 16}
TINY_ARGS = ["--model", "dense", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--block-size", "16",
             "--set", "d_ff=32", "--batch-size", "2", "--eval-interval", "0", "--set", "eval_batches=1",
             "--set", "warmup_steps=1", "--set", "gauge_interval=0", "--threads", "1", "--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_bytes(bundled_corpus_files()[0].read_bytes()[:12_000])
    return path


def _cfg(out: Path, data: Path, **kw) -> TrainConfig:
    base = {"lr": 1e-2, "warmup_steps": 1, "batch_size": 2, "max_steps": 3, "eval_interval": 0, "eval_batches": 1,
            "log_interval": 1, "gauge_interval": 0, "ckpt_interval": 0, "probe_gauges": False, "device": "cpu",
            "threads": 1, "data": str(data), "out_dir": str(out)}
    return TrainConfig(**{**base, **kw})


@pytest.fixture
def run(tmp_path, corpus) -> Path:
    """A finished 3-step run in ``tmp_path/RUN`` (its own copy per test: tests change it)."""
    train("dense", DenseConfig(**TINY), _cfg(tmp_path / "RUN", corpus), progress=False)
    return tmp_path / "RUN"


def _code(fn, argv) -> int:
    try:
        return fn(argv)
    except SystemExit as e:
        return e.code


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("note:", "--force:", "removed "))]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha256_bytes(p.read_bytes()) for p in root.rglob("*") if p.is_file()}


def _rewrite(path: Path, edit) -> None:
    """Change a checkpoint's payload and give it a matching sha256: a bug or another program, not bit rot."""
    ck = torch.load(path, weights_only=True)
    edit(ck)
    buf = io.BytesIO()
    torch.save(ck, buf)
    path.write_bytes(buf.getvalue())
    checksum_path(path).write_text(f"{sha256_bytes(buf.getvalue())}  {path.name}\n")


# ---- Lost: no output is one of the command's inputs ------------------------------------------------------------


def test_train_json_equal_to_data_or_config_is_refused(tmp_path, corpus, capsys):
    data = tmp_path / "d.txt"
    data.write_bytes(corpus.read_bytes())
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"train": {"max_steps": 1}}')
    before = _snapshot(tmp_path)
    for argv in (["--corpus", str(data), "--json", str(data)], ["--corpus", str(data), "--config", str(cfg), "--json",
                                                              str(cfg)]):
        assert _code(main, [*TINY_ARGS, *argv, "--out-dir", str(tmp_path / "o")]) == 2
        assert "is the input" in _one_line(capsys.readouterr().err)
    assert _snapshot(tmp_path) == before and not (tmp_path / "o").exists()


@pytest.mark.parametrize("target", ["ckpt.pt", "ckpt.pt.sha256", "log.jsonl", "summary.json"])
def test_sample_and_resume_json_never_replace_the_run(run, capsys, target):
    before = _snapshot(run)
    for argv in (["sample", "--checkpoint", str(run / "ckpt.pt"), "--tokens", "2", "--json", str(run / target)],
                 ["--out-dir", str(run), "--resume", "--max-steps", "4", "--quiet", "--json", str(run / target)]):
        assert _code(main, argv) == 2
        _one_line(capsys.readouterr().err)
    from lm.sample import main as sample_main

    assert _code(sample_main, ["--checkpoint", str(run / "ckpt.pt"), "--json", str(run / target)]) == 2
    _one_line(capsys.readouterr().err)
    assert _snapshot(run) == before


def test_json_never_replaces_another_runs_checkpoint(run, corpus, tmp_path, capsys):
    """Not an input of this command, but a checksummed checkpoint: an output never replaces it."""
    before = _snapshot(run)
    assert _code(main, [*TINY_ARGS, "--corpus", str(corpus), "--out-dir", str(tmp_path / "o"), "--json",
                        str(run / "ckpt.pt")]) == 2
    assert "checksummed" in _one_line(capsys.readouterr().err) and _snapshot(run) == before


def test_gauge_json_equal_to_the_corpus_is_refused(tmp_path, corpus, capsys):
    from gauge.__main__ import main as gauge_main

    data = tmp_path / "c.txt"
    data.write_bytes(corpus.read_bytes())
    assert _code(gauge_main, ["--corpus", str(data), "--json", str(data), "--train-steps", "0"]) == 2
    assert "is the input --corpus" in _one_line(capsys.readouterr().err)
    assert data.read_bytes() == corpus.read_bytes()


def test_reference_ship_never_writes_over_the_run(run, capsys):
    from lm.reference import main as ref_main

    before = _snapshot(run)
    assert _code(ref_main, ["ship", str(run), "--name", "ckpt", "--command", "c", "--dest", str(run)]) == 2
    assert "ckpt.pt" in _one_line(capsys.readouterr().err) and _snapshot(run) == before


@pytest.mark.parametrize("case", ["same", "symlink", "hardlink", "inside", "holds", "written", "outputs"])
def test_outputs_against_inputs(tmp_path, case):
    f = tmp_path / "in.txt"
    f.write_text("x")
    folder = tmp_path / "data"
    folder.mkdir()
    kw: dict = {"inputs": {"--data": f}, "outputs": {"--json": f}}
    if case == "symlink":
        (tmp_path / "link.txt").symlink_to(f)
        kw["outputs"] = {"--json": tmp_path / "link.txt"}
    elif case == "hardlink":
        os.link(f, tmp_path / "hard.txt")
        kw["outputs"] = {"--json": tmp_path / "hard.txt"}
    elif case == "inside":
        kw = {"inputs": {"--data": folder}, "outputs": {"--json": folder / "new.json"}}
    elif case == "holds":
        kw = {"inputs": {"--data": f}, "outputs": {}, "out_dirs": {"--out-dir": tmp_path}}
    elif case == "written":
        kw = {"inputs": {"--data": f}, "outputs": {"--json": tmp_path / "o" / "log.jsonl"},
              "out_dirs": {"--out-dir": tmp_path / "o"}, "written": {"--out-dir": ("log.jsonl",)}}
    elif case == "outputs":
        kw = {"inputs": {}, "outputs": {"--json": tmp_path / "a.json", "--other": tmp_path / "./a.json"}}
    with pytest.raises(ValueError, match=r"--json|--out-dir"):
        check_outputs_against_inputs(**kw)
    check_outputs_against_inputs({"--data": f}, {"--json": tmp_path / "out.json"}, {"--out-dir": tmp_path / "o"},
                                 written={"--out-dir": ("log.jsonl",)})  # distinct paths pass


# ---- Silently wrong: checksums, the lock, training longer, corrupt checkpoints ---------------------------------


def test_checkpoint_without_checksum_is_refused_unless_trusted(run, capsys):
    checksum_path(run / "ckpt.pt").unlink()
    with pytest.raises(CheckpointError, match=r"no checksum file ckpt\.pt\.sha256.*--trust-unverified"):
        load_checkpoint(run / "ckpt.pt")
    assert load_checkpoint(run / "ckpt.pt", trust_unverified=True)["verified"] is False
    for argv in (["sample", "--checkpoint", str(run / "ckpt.pt"), "--tokens", "2"],
                 ["--out-dir", str(run), "--resume", "--max-steps", "4", "--quiet"]):
        before = _snapshot(run)
        assert _code(main, argv) == 1
        assert "--trust-unverified" in _one_line(capsys.readouterr().err) and _snapshot(run) == before
    assert main(["sample", "--checkpoint", str(run / "ckpt.pt"), "--tokens", "2", "--trust-unverified"]) == 0
    assert main(["--out-dir", str(run), "--resume", "--max-steps", "4", "--quiet", "--trust-unverified"]) == 0
    assert load_checkpoint(run / "ckpt.pt")["step"] == 4  # the resumed run's own checkpoint is checksummed again


def test_flipped_byte_without_checksum_is_not_loaded(run, capsys):
    checksum_path(run / "ckpt.pt").unlink()
    data = bytearray((run / "ckpt.pt").read_bytes())
    data[int(len(data) * 0.9)] ^= 1
    (run / "ckpt.pt").write_bytes(bytes(data))
    assert _code(main, ["--out-dir", str(run), "--resume", "--max-steps", "4", "--quiet"]) == 1
    assert str(run / "ckpt.pt") in _one_line(capsys.readouterr().err)


class _Gate:
    """A hook that parks the training at step 1 until released: a run that is still going."""

    name = "gate"

    def __init__(self) -> None:
        self.at_step, self.release = threading.Event(), threading.Event()

    def on_start(self, model, optimizer, info):
        return {}

    def after_step(self, step, lr):
        self.at_step.set()
        self.release.wait(60)

    def on_end(self, summary):
        pass


def test_run_folder_lock_refuses_a_second_training(run, corpus, capsys):
    """Two trainings of one folder at once: the second is refused naming the lock and its holder, before writing."""
    gate = _Gate()
    first: dict = {}
    cfg = _cfg(run, corpus, max_steps=5)
    t = threading.Thread(target=lambda: first.update(s=train("dense", DenseConfig(**TINY), cfg, resume=True,
                                                             progress=False, hooks=[gate])))
    t.start()
    try:
        assert gate.at_step.wait(60)
        assert (run / LOCK_NAME).is_file()
        before = (run / "log.jsonl").read_bytes()
        for argv in (["--out-dir", str(run), "--resume", "--max-steps", "6", "--quiet"],
                     [*TINY_ARGS, "--corpus", str(corpus), "--out-dir", str(run), "--force"]):
            assert _code(main, argv) == 1
            line = _one_line(capsys.readouterr().err)
            assert "is in use" in line and LOCK_NAME in line and f"pid {os.getpid()}" in line
        assert (run / "log.jsonl").read_bytes() == before
    finally:
        gate.release.set()
        t.join(60)
    assert first["s"]["steps"] == 5 and not (run / LOCK_NAME).exists()  # released at the end
    log = [json.loads(ln) for ln in (run / "log.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in log if r["event"] == "train"]
    assert len(steps) == len(set(steps)) and sum(r["event"] == "end" for r in log) == 2  # the run, then its resume


def test_stale_lock_is_named_and_taken_over(run, capsys):
    (run / LOCK_NAME).write_text(json.dumps({"pid": 999999, "host": "gone", "started": "then",
                                             "command": "a killed run"}) + "\n")
    assert main(["--out-dir", str(run), "--resume", "--max-steps", "4", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "stale lock" in err and "pid 999999" in err and not (run / LOCK_NAME).exists()


def test_a_refused_run_leaves_no_folder_and_no_lock(tmp_path):
    """A run refused after it took the lock (the data is too short for a window) leaves neither lock nor folder."""
    tiny = tmp_path / "tiny.txt"
    tiny.write_bytes(b"0123456789")
    with pytest.raises(ValueError, match="split"):
        train("dense", DenseConfig(**TINY), _cfg(tmp_path / "never", tiny), progress=False)
    assert not (tmp_path / "never").exists()
    lock = RunLock(tmp_path / "x").acquire()
    with pytest.raises(RunFolderBusy, match="is in use"):
        RunLock(tmp_path / "x").acquire()
    lock.release()
    assert not (tmp_path / "x" / LOCK_NAME).exists()


@pytest.mark.parametrize(("first", "extend", "steps"), [
    (["--max-steps", "3"], ["--max-steps", "5"], 5),
    (["--max-steps", "3"], ["--max-tokens", "160"], 5),  # 160 / (2 x 16) = 5 steps
    (["--max-tokens", "96"], ["--max-steps", "5"], 5),  # an explicit --max-steps clears the inherited max_tokens
    (["--max-tokens", "96"], ["--max-tokens", "160"], 5),
])
def test_resume_trains_a_finished_run_longer(tmp_path, corpus, capsys, first, extend, steps):
    out = tmp_path / "r"
    assert main([*TINY_ARGS, "--corpus", str(corpus), "--out-dir", str(out), *first]) == 0
    assert main(["--out-dir", str(out), "--resume", "--quiet", *extend]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == steps and s["complete"] and load_checkpoint(out / "ckpt.pt")["step"] == steps
    assert "the run length changed" in capsys.readouterr().err
    assert _code(main, ["--out-dir", str(out), "--resume", "--quiet", "--max-steps", "7", "--max-tokens", "500"]) == 2
    assert "give one of them" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize(("field", "edit"), [
    ("train_config", lambda c: c["train_config"].pop("max_tokens")),
    ("optimizer", lambda c: c.update(optimizer={"state": {}, "param_groups": []})),
    ("optimizer", lambda c: c.update(optimizer=[1])),
    ("rng", lambda c: c.pop("rng")),
    ("model_kind", lambda c: c.update(model_kind="xyz")),
    ("step", lambda c: c.update(step="3")),
    ("extra", lambda c: c.update(extra=[1, 2])),
    ("model_config", lambda c: c["model_config"].update(d_model="x")),
    ("weights", lambda c: c["model"].pop(next(iter(c["model"])))),
    ("optimizer state", lambda c: next(iter(c["optimizer"]["state"].values())).update(exp_avg=torch.zeros(3))),
])
def test_corrupt_checkpoint_is_one_line_naming_the_file(run, capsys, field, edit):
    _rewrite(run / "ckpt.pt", edit)
    before = _snapshot(run)
    assert _code(main, ["--out-dir", str(run), "--resume", "--max-steps", "4", "--quiet"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert str(run / "ckpt.pt") in line and "KeyError" not in line and _snapshot(run) == before


@pytest.mark.parametrize(("kw", "name"), [
    ({"lr": float("nan"), "weight_decay": 0.1}, "lr"), ({"lr": float("inf"), "weight_decay": 0.1}, "lr"),
    ({"lr": 1e-3, "weight_decay": float("nan")}, "weight_decay"), ({"lr": 2.0, "weight_decay": 0.6}, "lr \\* weight"),
])
def test_rotational_optimizers_refuse_nonfinite_and_runaway_decay(kw, name):
    """The rotational optimizers (dynamics/rotational.py, validated by its owner) refuse NaN, inf and lr*wd >= 1."""
    from dynamics.rotational import rotational_adamw, rotational_sgd

    model = DenseTransformer(DenseConfig(**TINY))
    gauges = {"blocks.0.attn.q_proj.weight": [(0, 0, 8)]}
    for make in (rotational_adamw, rotational_sgd):
        with pytest.raises(ValueError, match=name):
            make(model, gauges, **kw)


# ---- Tracebacks and slow failures: gauge corpus, figures outputs and checkpoint ---------------------------------


@pytest.mark.parametrize(("content", "message"), [(b"", "empty"), (b"0123456789", "split holds")])
def test_gauge_small_corpus_is_one_line_before_work(tmp_path, capsys, content, message):
    from gauge.__main__ import main as gauge_main

    data = tmp_path / "c.txt"
    data.write_bytes(content)
    assert _code(gauge_main, ["--corpus", str(data)]) == 2
    assert message in _one_line(capsys.readouterr().err)


def test_figures_checks_outputs_and_checkpoint_before_work(run, tmp_path, capsys, monkeypatch):
    from figures import registry
    from figures.__main__ import main as figures_main

    monkeypatch.setattr(registry, "generate", lambda *a, **k: pytest.fail("a figure was drawn"))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    base = ["--only", "grt.fig_gates", "--quick", "--claims", "proofs"]
    cases = [
        (["--out-dir", "/sys/rmsgauge-read-only"], "not writable", 2),
        (["--out-dir", str(tmp_path / "f"), "--json", str(tmp_path)], "is a directory", 2),
        (["--out-dir", str(tmp_path / "f"), "--checkpoint", str(junk)], str(junk), 1),
        (["--out-dir", str(tmp_path / "f"), "--checkpoint", str(run / "ckpt.pt")], "need a GRT", 2),
        (["--out-dir", str(run), "--checkpoint", str(run / "ckpt.pt")], "holds the input", 2),
        (["--out-dir", str(tmp_path / "f"), "--checkpoint", str(run / "ckpt.pt"), "--json", str(run / "ckpt.pt")],
         "never replaces it", 2),
        (["--out-dir", str(tmp_path / "f"), "--json", str(tmp_path / "f" / "claims.json")], "claims.json", 2),
    ]
    before = _snapshot(tmp_path)
    for argv, message, code in cases:
        assert _code(figures_main, [*base, *argv]) == code, argv
        assert message in _one_line(capsys.readouterr().err), argv
    assert _snapshot(tmp_path) == before and not (tmp_path / "f").exists()


# ---- Checks a bug can flip: the Euler record, the matched-width claim --------------------------------------------


def test_euler_record_names_the_tensor_it_differentiated():
    """The record names the tensor autograd differentiated, read off the model: a check that differentiates k_proj
    while it means q_proj (a planted one-line bug) records k_proj, so tests/test_gauge.py's q_proj test fails."""
    import inspect
    import textwrap

    import gauge.checks as checks
    from gauge.model import GaugeConfig, build_setup

    setup = build_setup(GaugeConfig(d_model=16, n_heads=2, n_layers=1, batch_size=2, block_size=8, train_steps=0,
                                    c_points=3), qk_norm=True)
    assert checks.check_euler_radial_gradient(setup, "float64").details["tensor"] == "blocks.0.attn.q_proj.weight"
    src = textwrap.dedent(inspect.getsource(checks.check_euler_radial_gradient.__wrapped__
                                            if hasattr(checks.check_euler_radial_gradient, "__wrapped__")
                                            else checks.check_euler_radial_gradient))
    src = "\n".join(ln for ln in src.splitlines() if not ln.startswith("@"))
    planted = src.replace("W = setup.weight(dtype)", "W = model.blocks[cfg.layer].attn.k_proj.weight")
    assert planted != src
    ns = dict(vars(checks))
    exec(compile(planted, "<planted>", "exec"), ns)
    claim = ns["check_euler_radial_gradient"](setup, "float64")
    assert claim.details["tensor"] == "blocks.0.attn.k_proj.weight"


def test_reference_param_match_claim_fails_on_a_planted_bug(tmp_path, monkeypatch, capsys):
    """The reference comparison states 'matched widths give matched parameter counts' as a claim; the driver exits 1,
    before any training, when a bug breaks it (here: the closed-form count off by one layer)."""
    import lm.sizing
    import studies.experiments as ex
    from studies.grid import grid
    from studies.reference_report import param_match_claim

    cfg = {s.variant: s.model_config for s in grid("tiny")}
    assert param_match_claim(cfg["reference-grt"], cfg["reference-dense-params"]).holds
    real = lm.sizing.dense_params
    monkeypatch.setattr(lm.sizing, "dense_params", lambda d, h, layers, *a: real(d, h, layers + 1, *a))
    monkeypatch.setattr(ex.subprocess, "Popen", lambda *a, **k: pytest.fail("trained although the claim failed"))
    assert ex.main(["run", "--grid", "tiny", "--groups", "reference", "--runs-dir", str(tmp_path / "runs"),
                    "--results", str(tmp_path / "res")]) == 1
    err = capsys.readouterr().err
    assert "lm.matched_widths_match_params fails" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() and not (tmp_path / "res").exists()


# ---- The guard: one parser helper, one main, shared flag names, console commands --------------------------------

# every CLI's parser (module, builder), all built by the helper; each subcommand is checked too
CONVERTED = {
    "lm.train": ("lm.train", "build_parser"), "lm.sample": ("lm.sample", "build_parser"),
    "lm.evaluate": ("lm.evaluate", "build_parser"),
    "lm.hf": ("lm.hf", "build_parser"), "lm.reference": ("lm.reference", "build_parser"),
    "gauge": ("gauge.__main__", "build_parser"), "dynamics": ("dynamics.__main__", "build_parser"),
    "proofs": ("proofs.__main__", "build_parser"), "figures": ("figures.__main__", "build_parser"),
    "studies.rotational_compare": ("studies.rotational_compare", "build_parser"),
    "grt_model": ("grt_model.__main__", "build_parser"), "studies.experiments": ("studies.experiments", "build_parser"),
    "studies.trained": ("studies.trained.__main__", "build_parser"),
    "gauge census": ("gauge.census.cli", "build_parser"),
    "lm.bench": ("lm.bench.__main__", "build_parser"), "tools.mutate": ("tools.mutate", "build_parser"),
    "tools.readme_blocks": ("tools.readme_blocks", "build_parser"), "lm.bpe": ("lm.bpe", "build_parser"),
}
# the command lines that are not a parser of their own, and why
NOT_PARSERS = {
    "studies.job": "the experiment driver's worker: one positional run folder, written by the driver",
    "studies.train": "lm.train's parser (CONVERTED) under another prog",
    "gauge.py": "runs gauge.__main__ (CONVERTED)", "dynamics.py": "runs dynamics.__main__ (CONVERTED)",
    "test_rmsgauge.py": "pytest's own command line: every flag passes through to pytest",
}

def _parsers(root: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [root]
    for a in root._actions:
        if isinstance(a, argparse._SubParsersAction):
            for p in dict.fromkeys(a.choices.values()):
                out += _parsers(p)
    return out


def _build(module: str, fn: str) -> argparse.ArgumentParser:
    return getattr(importlib.import_module(module), fn)()


def _command_lines() -> set[str]:
    """Every file of the checkout that runs as a command (a ``__main__`` block), as ``package.module`` (or the
    script's path outside the packages)."""
    out = set()
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT)
        if rel.parts[0] in {"tests", "build", ".git"} or "site-packages" in rel.parts or "__main__" not in (
                text := f.read_text(encoding="utf-8")) or 'if __name__ == "__main__"' not in text:
            continue
        packaged = (ROOT / rel.parts[0] / "__init__.py").is_file() and len(rel.parts) > 1
        out.add(".".join(rel.with_suffix("").parts) if packaged else str(rel))
    return {n.removesuffix(".__main__") for n in out}


def test_every_command_line_is_on_the_helper_or_says_why_not():
    modules = {m for m, _ in CONVERTED.values()}
    names = {m.removesuffix(".__main__") for m in modules} | set(NOT_PARSERS)
    missing = sorted(_command_lines() - names)
    assert not missing, f"command lines not built by rmsgauge.cli (add them to CONVERTED, or say why): {missing}"


# one spelling per concept: a flag whose destination is one of these concepts is spelled this way in every CLI
SHARED_FLAGS = ("--d-model", "--n-heads", "--n-layers", "--batch-size", "--block-size", "--seed", "--dtype",
                "--threads", "--device", "--json", "--verbose", "--quiet", "--out-dir", "--corpus", "--checkpoint",
                "--model-dir", "--resume", "--force", "--trust-unverified", "--debug")


@pytest.mark.parametrize("name", sorted(CONVERTED))
def test_every_parser_uses_the_helper_and_the_shared_names(name):
    for p in _parsers(_build(*CONVERTED[name])):
        assert isinstance(p, OneLineArgumentParser), f"{p.prog}: not built by rmsgauge.cli.make_parser/add_subcommand"
        flags = {o for a in p._actions for o in a.option_strings}
        forwarded = p.get_default("_cli_forward")
        assert forwarded or "--debug" in flags, f"{p.prog}: no --debug"
        for a in p._actions:  # a flag whose destination is a shared concept uses the shared spelling
            shared = {f for f in SHARED_FLAGS if f[2:].replace("-", "_") == a.dest}
            assert not shared or shared & set(a.option_strings), f"{p.prog}: {a.option_strings} for {shared}"


def test_console_commands_match_pyproject():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(CONSOLE_COMMANDS) and set(scripts.values()) == {"rmsgauge.cli:console"}
    for module, _ in CONSOLE_COMMANDS.values():
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module


@pytest.mark.parametrize(("raised", "code", "message"), [
    (ValueError("--x must be in [0, 1]"), 2, "--x must be in [0, 1]"),
    (Failure("corrupt file f"), 1, "corrupt file f"),
    (RuntimeError("boom"), 1, "RuntimeError: boom"),
    (KeyboardInterrupt(), 130, "interrupted"),
])
def test_run_main_exit_statuses(capsys, raised, code, message):
    p = make_parser("prog")

    def work(args, checked):
        raise raised

    assert run_main(p, [], work) == code
    assert message in _one_line(capsys.readouterr().err)
    with pytest.raises(type(raised)):
        run_main(p, ["--debug"], work)
    if code != 130:  # a check's ValueError is a usage error (exit 2) whatever it is named
        with pytest.raises(SystemExit) as e:
            run_main(p, [], work, check=lambda a: (_ for _ in ()).throw(ValueError("bad flag")))
        assert e.value.code == 2


def test_save_checkpoint_without_checksum_removes_a_stale_one(tmp_path):
    model = DenseTransformer(DenseConfig(**TINY))
    path = save_checkpoint(tmp_path / "c.pt", model_kind="dense", model=model, optimizer=None, train_config={},
                           step=0, tokens_seen=0)
    assert checksum_path(path).exists()
    save_checkpoint(path, model_kind="dense", model=model, optimizer=None, train_config={}, step=0, tokens_seen=0,
                    checksum=False)
    assert not checksum_path(path).exists()
    with pytest.raises(CheckpointError, match="--trust-unverified"):
        load_checkpoint(path)


@pytest.mark.parametrize("what", ["while printing", "at the final flush"])
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(what):
    """`python -m ... | head`: the command stops with 141 (128 + SIGPIPE, as `cat` does), nothing on stderr."""
    import subprocess
    import sys

    body = ("lambda: [print('y' * 100) for _ in range(20000)]" if what == "while printing"  # 2 MB: past the buffer
            else "lambda: (__import__('time').sleep(0.5), print('short'))")  # written after the reader left
    code = f"import sys; from rmsgauge.cli import run_guarded; sys.exit(run_guarded('prog', {body}))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[1])
    if what == "while printing":
        proc.stdout.read(10)
    proc.stdout.close()  # the reader goes away
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err


# ---- An unknown flag is named as unknown, with the nearest real flag ---------------------------------------------


def _parser_paths(root: argparse.ArgumentParser,
                  path: tuple[str, ...] = ()) -> list[tuple[list[str], argparse.ArgumentParser]]:
    """``(the subcommand names that reach it, parser)`` for ``root`` and every subcommand below it."""
    out = [(list(path), root)]
    for a in root._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, p in a.choices.items():
                out += _parser_paths(p, (*path, name))
    return out


def _swap_last_two(flag: str) -> str:
    return flag[:-2] + flag[-1] + flag[-2]


@pytest.mark.parametrize("name", sorted(CONVERTED))
def test_every_parser_names_a_misspelled_flag_and_the_real_one(name, capsys):
    """Each long flag of every parser and subcommand, its last two letters swapped and a value after it (argparse
    alone read the value as the next positional: ``--d-modle 64`` was "invalid choice: '64'")."""
    root = _build(*CONVERTED[name])
    checked = 0
    for path, p in _parser_paths(root):
        if p.get_default("_cli_forward"):  # another CLI reads this subcommand's flags (and checks them)
            continue
        flags = {o for a in p._actions for o in a.option_strings if o.startswith("--")}
        for flag in sorted(f for f in flags if len(f) >= 7):
            typo = _swap_last_two(flag)
            if any(f.startswith(typo) for f in flags):  # a doubled letter, or an abbreviation of a real flag
                continue
            with pytest.raises(SystemExit) as e:
                root.parse_args([*path, typo, "64"])
            assert e.value.code == 2
            assert capsys.readouterr().err == f"{p.prog}: error: unknown flag {typo}; did you mean {flag}?\n"
            checked += 1
    assert checked, f"{name}: no long flag to misspell"


def test_gauge_names_the_flag_a_misspelling_meant(capsys):
    from gauge.__main__ import main as gauge_main

    with pytest.raises(SystemExit) as e:
        gauge_main(["--d-modle", "64"])
    assert e.value.code == 2
    assert capsys.readouterr().err == "python gauge.py: error: unknown flag --d-modle; did you mean --d-model?\n"


@pytest.mark.parametrize(("argv", "unknown"), [
    (["--corpus", "census", "--zzz-top"], "--zzz-top"),  # a value that is a subcommand's name is still a value
    (["--json=out.json", "--d-modle=64"], "--d-modle"),
    (["--eps", "1e-6,torch", "-q"], "-q"),
])
def test_unknown_flags_are_found_past_values(argv, unknown, capsys):
    from gauge.__main__ import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2 and f"unknown flag {unknown};" in capsys.readouterr().err


def test_known_flags_values_and_forwarded_flags_still_parse():
    from gauge.__main__ import build_parser

    args, rest = build_parser().parse_known_args(["census", "--model", "m", "--frob"])  # census reads its own
    assert args.command == "census" and rest == ["--model", "m", "--frob"]
    args = build_parser().parse_args(["--d-mod", "32", "--corpus", "census", "--c-min=0.5"])  # an abbreviation too
    assert (args.d_model, args.corpus, args.c_min, args.command) == (32, "census", 0.5, None)


# ---- gauge.py and dynamics.py say how long the whole run took ---------------------------------------------------

SLOW_START_S = 1.5  # a process that spends this long before the command's imports: the time the old line missed


@pytest.mark.parametrize("module", ["gauge.__main__", "dynamics.__main__"])
def test_the_elapsed_time_covers_the_process_from_its_start(module):
    import re
    import subprocess
    import sys

    code = (f"import time; time.sleep({SLOW_START_S})\n"
            "import importlib; from rmsgauge import Claim\n"
            f"cmd = importlib.import_module({module!r})\n"
            "cmd.run_claims = lambda *a, **k: [Claim(id='gauge.example', statement='s', stated=None, measured=0.0, "
            "tolerance=None, holds=True, summary='x 1')]\n"
            "raise SystemExit(cmd.main([]))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    header = out.stdout.split("\nclaim ")[0]  # the lines above the table
    seconds = [float(s) for s in re.findall(r"(\d+(?:\.\d+)?) s\b", header)]
    assert seconds and max(seconds) >= SLOW_START_S, header
    assert "since the process started" in header, header
