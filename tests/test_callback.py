"""dynamics.EquilibriumCallback inside a real transformers.Trainer: a tiny Qwen3 (built locally, nothing downloaded)
trained on the bundled corpus, its records checked against the same monitor run by hand on the same steps."""

from __future__ import annotations

import copy
import csv
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from dynamics.monitor import EquilibriumMonitor, read_records, scalar_name, short_names
from rmsgauge import tolerance

tf = pytest.importorskip("transformers")

STEPS, BATCH, SEQ = 24, 4, 32
LOG_EVERY = 6
PLAIN_NAME = re.compile(r"[A-Za-z0-9_./-]+")  # what TensorBoard, W&B and MLflow take as a scalar name


class _Windows(torch.utils.data.Dataset):
    """Fixed, non-overlapping windows of the bundled corpus (no RNG: the order is the dataset's)."""

    def __init__(self, n: int) -> None:
        from rmsgauge.corpus import ByteCorpus

        tokens = torch.from_numpy(ByteCorpus.load().split("train")[: n * SEQ].astype(np.int64))
        self.x = tokens.reshape(n, SEQ)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


class _InOrder(tf.Trainer):
    def _get_train_sampler(self, train_dataset=None):  # the dataset's order, so the hand-run can replay it
        return torch.utils.data.SequentialSampler(train_dataset or self.train_dataset)


class _Writer:  # a TensorBoard writer stand-in (the tensorboard package is optional)
    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))


def _qwen3() -> torch.nn.Module:
    cfg = tf.Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    torch.manual_seed(0)
    return tf.Qwen3ForCausalLM(cfg)


def _hand_run(start: torch.nn.Module, args, trainer, ds) -> EquilibriumMonitor:
    """The same start, batches, optimizer class, kwargs and param groups as the Trainer built, in a plain loop."""
    from gauge.census import census as run_census

    cls, kw = tf.Trainer.get_optimizer_cls_and_kwargs(args, start)
    decay = set(trainer.get_decay_parameter_names(start))
    params = dict(start.named_parameters())
    opt = cls([{"params": [p for n, p in params.items() if n in decay], "weight_decay": args.weight_decay},
               {"params": [p for n, p in params.items() if n not in decay], "weight_decay": 0.0}], **kw)
    probe = dict(tf.default_data_collator([ds[0], ds[1]]))
    mon = EquilibriumMonitor(start, opt, run_census(start, batch=probe, own_eps=False, seed=0))
    start.train()
    for i in range(STEPS):
        batch = tf.default_data_collator([ds[j] for j in range(i * BATCH, (i + 1) * BATCH)])
        start(**batch).loss.backward()
        opt.step()
        opt.zero_grad()
    return mon


def test_equilibrium_callback_in_a_trainer_matches_the_monitor_run_by_hand(tmp_path, capsys):
    model = _qwen3()
    start = copy.deepcopy(model)
    ds = _Windows(STEPS * BATCH)
    args = tf.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH, max_steps=STEPS,
                                learning_rate=3e-3, weight_decay=0.1, lr_scheduler_type="constant", warmup_steps=0,
                                max_grad_norm=0.0, logging_steps=LOG_EVERY, save_strategy="no", report_to=[],
                                use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    from dynamics import EquilibriumCallback

    writer = _Writer()
    cb = EquilibriumCallback(jsonl=tmp_path / "eq.jsonl", tensorboard=writer, trainer_log="groups")
    trainer = _InOrder(model=model, args=args, train_dataset=ds, callbacks=[cb])
    trainer.model_accepts_loss_kwargs = False  # the plain mean loss, as the hand-run computes it
    trainer.train()

    lines = [json.loads(s) for s in (tmp_path / "eq.jsonl").read_text().splitlines()]
    census, records, summary = lines[0], lines[1:-1], lines[-1]
    assert census["event"] == "census" and summary["event"] == "summary" and len(records) == STEPS
    # Qwen3's per-head QK-norm: q_proj and k_proj of every layer, one gauge per head's row block
    assert sorted(census["gauges"]) == sorted(f"model.layers.{i}.self_attn.{w}_proj.weight" for i in range(2)
                                              for w in "qk")
    names = list(records[0]["groups"])
    assert len(names) == 2 * (4 + 2)  # 4 query heads and 2 key/value heads per layer
    assert all(r["groups"][n]["law"] == "adamw/torch" for r in records for n in names)

    mon = _hand_run(start, args, trainer, ds)
    n_entries = max(dict(start.named_parameters())[g.param].numel() for g in mon.groups)
    for got, want in zip(records, mon.history):
        assert got["step"] == want["step"]
        for n in names:
            g, w = got["groups"][n], want["groups"][n]
            tol = tolerance("float32", size=n_entries, depth=STEPS)  # float32 training, float64 measurement
            for key in ("norm", "angle", "norm_eq", "angle_eq", "relax_steps"):
                assert abs(g[key] - w[key]) <= tol.bound(abs(w[key])), (n, key, got["step"], g[key], w[key])
    # CSV: one row per step and group; TensorBoard scalars; the table printed at the end
    with (tmp_path / "eq.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == STEPS * len(names) and rows[0]["group"] == names[0]
    assert float(rows[-1]["norm"]) == records[-1]["groups"][names[-1]]["norm"]  # repr round-trips a float exactly
    tags = {t for t, _, _ in writer.scalars}
    assert f"equilibrium/{scalar_name(names[0])}/eff_lr_over_eq" in tags
    assert len(writer.scalars) >= STEPS * len(names) * 2
    assert all(PLAIN_NAME.fullmatch(t) for t in tags)
    # the Trainer's own log: the figures beside each loss, at its step, with plain names
    history = trainer.state.log_history
    loss_steps = [h["step"] for h in history if "loss" in h]
    figures = [h for h in history if "equilibrium/all/norm_over_eq_median" in h]
    assert loss_steps == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY)) == [h["step"] for h in figures]
    for h in figures:
        rec = records[h["step"] - 1]["groups"][names[0]]
        assert h[f"equilibrium/{scalar_name(names[0])}/eff_lr"] == rec["angle"]
        assert all(PLAIN_NAME.fullmatch(k) for k in h if k.startswith("equilibrium/"))
    out = capsys.readouterr().out
    prefix, shown = short_names(names)
    assert "equilibrium monitor at step 24" in out and prefix == "model.layers."
    assert all(f"\n{n} " in out for n in shown)  # every group's name whole, its shared prefix dropped
    assert summary["groups"][names[0]]["law"] == "adamw/torch" and cb.summary == {k: v for k, v in summary.items()
                                                                                    if k != "event"}


class _StopAt(tf.TrainerCallback):
    """Ends the training after step ``at``, its checkpoint saved, as an interruption would."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            control.should_save = control.should_training_stop = True


def _short_run(tmp_path, name: str, callbacks: list, resume: bool = False, steps: int = 4) -> tf.Trainer:
    """``steps`` steps of the tiny Qwen3 under the Trainer's default linear decay, a checkpoint every 2 steps."""
    args = tf.TrainingArguments(output_dir=str(tmp_path / name), per_device_train_batch_size=BATCH, max_steps=steps,
                                learning_rate=3e-3, weight_decay=0.1, max_grad_norm=0.0, logging_strategy="no",
                                save_strategy="steps", save_steps=2, report_to=[], use_cpu=True, seed=0,
                                dataloader_num_workers=0, disable_tqdm=True)
    trainer = _InOrder(model=_qwen3(), args=args, train_dataset=_Windows(steps * BATCH), callbacks=callbacks)
    trainer.model_accepts_loss_kwargs = False
    trainer.train(resume_from_checkpoint=True if resume else None)
    return trainer


def test_a_resumed_trainer_appends_and_continues_the_global_step(tmp_path):
    from dynamics import EquilibriumCallback

    whole = EquilibriumCallback(jsonl=tmp_path / "whole.jsonl", print_table=False)
    _short_run(tmp_path, "whole", [whole])
    log = tmp_path / "eq.jsonl"
    _short_run(tmp_path, "parts", [EquilibriumCallback(jsonl=log, print_table=False), _StopAt(2)])
    first_part, first_rows = log.read_text(), (tmp_path / "eq.csv").read_text()
    resumed = EquilibriumCallback(jsonl=log, print_table=False)
    _short_run(tmp_path, "parts", [resumed], resume=True)
    assert log.read_text().startswith(first_part) and (tmp_path / "eq.csv").read_text().startswith(first_rows)
    events = [(r["event"], r.get("step", r.get("steps"))) for r in map(json.loads, log.read_text().splitlines())]
    assert events == [("census", None), ("equilibrium", 1), ("equilibrium", 2), ("summary", 2), ("resume", 2),
                      ("equilibrium", 3), ("equilibrium", 4), ("summary", 4)]
    got, want = read_records(log), read_records(tmp_path / "whole.jsonl")
    assert [r["step"] for r in got] == [1, 2, 3, 4] == [r["step"] for r in want]
    n_entries = max(p.numel() for p in _qwen3().parameters())
    tol = tolerance("float32", size=n_entries, depth=4)
    for g, w in zip(got, want):
        for name, r in g["groups"].items():
            for key in ("norm", "angle", "norm_eq", "angle_eq", "norm_track", "lr"):
                assert abs(r[key] - w["groups"][name][key]) <= tol.bound(abs(w["groups"][name][key])), (name, key)
    assert resumed.summary["steps"] == whole.summary["steps"] == 4 and resumed.summary["records"] == 4
    assert resumed.summary["model"]["status_counts"] == whole.summary["model"]["status_counts"]
    with (tmp_path / "eq.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [s for s in (1, 2, 3, 4) for _ in got[0]["groups"]]


def test_a_run_from_step_0_onto_a_log_that_holds_records_is_refused(tmp_path):
    from dynamics import EquilibriumCallback

    log = tmp_path / "eq.jsonl"
    log.write_text('{"a user\'s": "line"}\n')
    with pytest.raises(ValueError, match=r"^EquilibriumCallback: .*eq.jsonl already holds records") as e:
        _short_run(tmp_path, "out", [EquilibriumCallback(jsonl=log, print_table=False)], steps=2)
    assert "\n" not in str(e.value) and log.read_text() == '{"a user\'s": "line"}\n'


def test_import_dynamics_does_not_import_transformers():
    code = "import sys, dynamics, dynamics.monitor, dynamics.rotational; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_tensorboard_folder_without_the_package_is_a_one_line_error_for_callback_and_monitor(tmp_path):
    from dynamics import EquilibriumCallback

    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match=r"^tensorboard: the tensorboard package is not installed") as e:
            EquilibriumCallback(jsonl=tmp_path / "eq.jsonl", tensorboard=tmp_path / "tb")
        assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match=r"^tensorboard: the tensorboard package is not installed"):
            _monitor_with_tensorboard(tmp_path / "tb")
    else:
        cb = EquilibriumCallback(jsonl=tmp_path / "eq.jsonl", tensorboard=tmp_path / "tb")
        assert hasattr(cb.writer, "add_scalar") and hasattr(_monitor_with_tensorboard(tmp_path / "tb").writer,
                                                            "add_scalar")


def _monitor_with_tensorboard(folder) -> EquilibriumMonitor:
    model = _qwen3()
    opt = torch.optim.AdamW(model.parameters())
    return EquilibriumMonitor(model, opt, ["model.layers.0.self_attn.q_proj.weight"], tensorboard=folder)
