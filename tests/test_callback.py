"""dynamics.EquilibriumCallback inside a real transformers.Trainer: a tiny Qwen3 (built locally, nothing downloaded)
trained on the bundled corpus, its records checked against the same monitor run by hand on the same steps."""

from __future__ import annotations

import copy
import csv
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from dynamics.monitor import EquilibriumMonitor
from rmsgauge import tolerance

tf = pytest.importorskip("transformers")

STEPS, BATCH, SEQ = 24, 4, 32


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
                                max_grad_norm=0.0, logging_strategy="no", save_strategy="no", report_to=[],
                                use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    from dynamics import EquilibriumCallback

    writer = _Writer()
    cb = EquilibriumCallback(jsonl=tmp_path / "eq.jsonl", tensorboard=writer)
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
    assert f"equilibrium/{names[0]}/angle_over_eq" in tags and len(writer.scalars) >= STEPS * len(names) * 2
    out = capsys.readouterr().out
    assert "equilibrium monitor:" in out and names[0][:40] in out
    assert summary["groups"][names[0]]["law"] == "adamw/torch" and cb.summary == {k: v for k, v in summary.items()
                                                                                    if k != "event"}


def test_import_dynamics_does_not_import_transformers():
    code = "import sys, dynamics, dynamics.monitor, dynamics.rotational; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_tensorboard_folder_without_the_package_is_a_one_line_error(tmp_path):
    from dynamics import EquilibriumCallback

    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match=r"^tensorboard: the tensorboard package is not installed") as e:
            EquilibriumCallback(jsonl=tmp_path / "eq.jsonl", tensorboard=tmp_path / "tb")
        assert "\n" not in str(e.value)
    else:
        cb = EquilibriumCallback(jsonl=tmp_path / "eq.jsonl", tensorboard=tmp_path / "tb")
        assert hasattr(cb.writer, "add_scalar")
