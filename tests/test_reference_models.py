"""Shipped reference models: loading, checksum failure, shipping, and the recipe replay.

The shipping pipeline is tested on a tiny run of its own; the tests of the shipped files themselves
(``lm/reference_models/{grt,dense}.*``) skip, saying so, while those files are absent.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from lm.checkpoint import model_from_checkpoint
from lm.dense import DenseConfig
from lm.errors import CheckpointError
from lm.loop import train
from lm.models import config_from_dict, config_to_dict
from lm.recipes import RECIPE_NAMES, REFERENCE_RECIPE_NAMES, get_recipe
from lm.reference import (
    MAX_FILE_BYTES,
    NAMES,
    load_reference,
    main,
    reference_card,
    reference_dir,
    reference_log,
    ship_run,
    verify_reference,
)
from lm.runlog import read_log
from lm.trainconfig import TrainConfig
from rmsgauge import tolerance
from rmsgauge.corpus import bundled_corpus_files

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "block_size": 16}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ref")
    data = root / "c.txt"
    data.write_bytes(bundled_corpus_files()[0].read_bytes()[:20_000])
    out = root / "run"
    train("dense", DenseConfig(**TINY), TrainConfig(lr=1e-2, warmup_steps=1, batch_size=4, max_steps=3,
                                                     eval_interval=0, eval_batches=1, log_interval=1, device="cpu",
                                                     threads=1, data=str(data), out_dir=str(out)), progress=False)
    return out


@pytest.fixture
def shipped(tmp_path, tiny_run) -> Path:
    dest = tmp_path / "models"
    ship_run(tiny_run, "dense", "python -m lm.train (test)", dest=dest)
    return dest


def test_ship_then_load_gives_the_trained_weights(shipped, tiny_run):
    from lm.checkpoint import load_checkpoint

    model = load_reference("dense", root=shipped)
    card = model.reference_card
    assert not model.training and model.config == DenseConfig(**card["model_config"])
    trained = model_from_checkpoint(load_checkpoint(tiny_run / "ckpt.pt"))
    for (n, a), (_, b) in zip(model.state_dict().items(), trained.state_dict().items()):
        assert torch.equal(a, b), n
    summary = json.loads((tiny_run / "summary.json").read_text())
    for key in ("tokens_seen", "train_time_s", "wall_time_s", "final_val_bpb", "machine", "command", "sha256"):
        assert card[key] is not None, key
    assert card["tokens_seen"] == summary["tokens_seen"] and card["final_val_bpb"] == summary["final_val_bpb"]
    payload = torch.load(shipped / "dense.pt", weights_only=True)
    assert "optimizer" not in payload and set(payload) == {"format", "model_kind", "model_config", "dtype", "model"}
    assert reference_log("dense", root=shipped) == read_log(tiny_run / "log.jsonl")


def test_a_tampered_copy_fails_its_checksum_naming_the_file(shipped, capsys):
    data = bytearray((shipped / "dense.pt").read_bytes())
    data[-100] ^= 0x04
    (shipped / "dense.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"dense\.pt: sha256 .* does not match its model card"):
        load_reference("dense", root=shipped)
    assert main(["verify", "--root", str(shipped)]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "dense.pt" in err[0]


def test_a_shipped_file_loads_by_name_or_path_through_its_card(shipped, tiny_run, capsysbinary):
    """``--checkpoint <name>.pt`` of a shipped model (no ``.sha256``: its card holds the sha256) loads verified by the
    card, the same model as by name; sampled, it gives the same bytes as the run's checkpoint; tampered, it is one
    line naming the file."""
    from lm.checkpoint import load_checkpoint
    from lm.reference import load_model
    from lm.sample import main as sample_main

    model, verified = load_model(checkpoint=shipped / "dense.pt")
    assert verified and model.reference_card == reference_card("dense", root=shipped) and not model.training
    trained = model_from_checkpoint(load_checkpoint(tiny_run / "ckpt.pt"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained.state_dict().values()))
    argv = ["--tokens", "6", "--seed", "4", "--quiet"]
    assert sample_main(["--checkpoint", str(shipped / "dense.pt"), *argv]) == 0
    from_card = capsysbinary.readouterr().out
    assert sample_main(["--checkpoint", str(tiny_run / "ckpt.pt"), *argv]) == 0
    assert capsysbinary.readouterr().out == from_card
    data = bytearray((shipped / "dense.pt").read_bytes())
    data[-100] ^= 0x04
    (shipped / "dense.pt").write_bytes(bytes(data))
    assert sample_main(["--checkpoint", str(shipped / "dense.pt"), *argv]) == 1
    err = [ln for ln in capsysbinary.readouterr().err.decode().splitlines() if ln.strip()]
    assert len(err) == 1 and "dense.pt: sha256" in err[0] and "model card" in err[0]


def test_ship_refuses_unfinished_runs_and_empty_commands(tmp_path, tiny_run):
    with pytest.raises(ValueError, match="--command"):
        ship_run(tiny_run, "dense", "  ", dest=tmp_path / "m")
    partial = tmp_path / "partial"
    shutil.copytree(tiny_run, partial)
    s = json.loads((partial / "summary.json").read_text())
    (partial / "summary.json").write_text(json.dumps({**s, "complete": False}))
    with pytest.raises(ValueError, match="not finished"):
        ship_run(partial, "dense", "cmd", dest=tmp_path / "m")
    assert not (tmp_path / "m" / "dense.json").exists()


def test_recipes_are_the_reference_comparisons_finals():
    """Each recipe trains what the experiment grid's reference final trains for its model (the same model, batches,
    steps, warmup and evaluations) at the lr its committed sweep chose; it logs and checkpoints like the shipped run."""
    from studies.grid import grid

    finals = {s.variant: s for s in grid("full") if s.group == "reference" and s.phase == "final"}
    committed = Path(__file__).resolve().parents[1] / "results" / "compare-reference" / "runs.json"
    lrs = {r["variant"]: r["lr"] for r in json.loads(committed.read_text()) if r["phase"] == "final"}
    for name, variant in (("reference-grt", "reference-grt"), ("reference-dense", "reference-dense-params")):
        recipe, spec = get_recipe(name), finals[variant]
        assert recipe.model_config == config_from_dict(recipe.model, recipe.model_config).to_dict() == spec.model_config
        tc = TrainConfig(**recipe.train_config)
        assert tc.lr == lrs[variant] and tc.max_tokens == spec.tokens and (tc.seed, tc.threads) == (0, 1)
        grid_tc = TrainConfig(**spec.train_config(tc.lr, tc.out_dir))
        assert -(-tc.max_tokens // (tc.batch_size * int(spec.model_config["block_size"]))) == grid_tc.max_steps
        for key in ("batch_size", "warmup_steps", "eval_interval", "eval_batches", "seed", "data", "schedule",
                    "min_lr_frac", "wd", "lr_mult", "tokenizer"):
            assert getattr(tc, key) == getattr(grid_tc, key), key
    with pytest.raises(ValueError, match="--recipe must be one of"):
        get_recipe("reference-gpt")


def _shipped_or_skip(name: str) -> dict:
    if not (reference_dir() / f"{name}.json").exists():
        pytest.skip(f"lm/reference_models/{name}.json is not shipped yet (python -m lm.reference ship ...)")
    return reference_card(name)


@pytest.mark.parametrize("name", NAMES)
def test_shipped_model_loads_verified_and_matches_its_recipe(name):
    card = _shipped_or_skip(name)
    verify_reference(name)
    model = load_reference(name)
    assert (reference_dir() / f"{name}.pt").stat().st_size <= MAX_FILE_BYTES
    assert card["tokens_seen"] >= 3_000_000
    recipe = get_recipe(f"reference-{name}")
    # fields added to the configs since shipping take their defaults (the card's config rebuilt equals the recipe's)
    shipped_cfg = config_to_dict(config_from_dict(card["model_kind"], card["model_config"]))
    assert shipped_cfg == recipe.model_config and card["model_kind"] == recipe.model
    ran = {k: v for k, v in TrainConfig(**card["train_config"]).to_dict().items() if k != "out_dir"}
    assert ran == {k: v for k, v in recipe.train_config.items() if k != "out_dir"}
    x = torch.arange(16).unsqueeze(0)
    assert torch.isfinite(model(x)[0]).all()


@pytest.mark.parametrize("name", NAMES)
def test_shipped_model_samples_by_name_and_by_path(name, capsysbinary):
    """``python -m lm.sample --reference NAME`` and ``--checkpoint lm/reference_models/NAME.pt`` (which has no
    ``.sha256``: its card holds the sha256) both load the shipped model verified, and give the same bytes."""
    _shipped_or_skip(name)
    from lm.sample import main as sample_main

    argv = ["--tokens", "5", "--seed", "1", "--quiet"]
    assert sample_main(["--reference", name, *argv]) == 0
    by_name = capsysbinary.readouterr().out
    assert sample_main(["--checkpoint", str(reference_dir() / f"{name}.pt"), *argv]) == 0
    assert capsysbinary.readouterr().out == by_name and len(by_name) == 1 + 5 + 1  # "\n", 5 bytes, "\n"
    from lm.train import main as train_main

    assert train_main(["sample", "--reference", name, *argv]) == 0
    assert capsysbinary.readouterr().out == by_name


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_recipe_replay_matches_the_shipped_log(tmp_path, name):
    """Train the recipe to its first logged step (the log's train records are every log_interval steps) and
    compare the step-0 validation loss and that step's loss and running mean with the shipped log.  Same
    machine and torch: bit for bit; elsewhere float32 round-off of that many steps (tolerance helper)."""
    card = _shipped_or_skip(name)
    recipe = get_recipe(f"reference-{name}")
    log = reference_log(name)
    ev0 = next(r for r in log if r["event"] == "eval" and r["step"] == 0)
    first = next(r for r in log if r["event"] == "train")
    tc = TrainConfig(**{**recipe.train_config, "out_dir": str(tmp_path / "replay"), "probe_gauges": False})
    train(recipe.model, config_from_dict(recipe.model, recipe.model_config), tc, stop_after=first["step"],
          progress=False)  # the probe leaves weights and RNG alone: skipping it does not change the trajectory
    mine = read_log(tmp_path / "replay" / "log.jsonl")
    my_ev0 = next(r for r in mine if r["event"] == "eval" and r["step"] == 0)
    my_first = next(r for r in mine if r["event"] == "train")
    assert my_first["step"] == first["step"]
    cfg = card["model_config"]
    layers = cfg.get("n_layers", cfg.get("n_blocks"))
    tokens = tc.batch_size * cfg["block_size"]
    tol = tolerance("float32", size=tokens * cfg["d_model"], depth=first["step"] * (layers + 2))
    for key, want, got in (("step-0 val_loss", ev0["val_loss"], my_ev0["val_loss"]),
                           ("loss", first["loss"], my_first["loss"]), ("loss_avg", first["loss_avg"],
                                                                       my_first["loss_avg"])):
        assert tol.holds(got - want, want), f"{name} {key}: replay {got!r} vs shipped {want!r} (rtol {tol.rtol:.2g})"


def test_reference_cli_lists_and_verifies(shipped, capsys):
    assert main(["list", "--root", str(shipped)]) == 0
    assert "python -m lm.train --recipe reference-dense" in capsys.readouterr().out
    assert main(["verify", "--root", str(shipped)]) == 0
    assert REFERENCE_RECIPE_NAMES == tuple(f"reference-{n}" for n in NAMES)
    assert set(REFERENCE_RECIPE_NAMES) <= set(RECIPE_NAMES)
