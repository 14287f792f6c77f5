r"""``EquilibriumCallback``: the gauge census and the equilibrium monitor inside a Hugging Face ``Trainer``.

::

    from dynamics import EquilibriumCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[EquilibriumCallback(jsonl="eq.jsonl")])
    trainer.train()   # eq.jsonl (census, one record per step, summary), eq.csv, the table printed at the end

At ``on_train_begin`` it runs :func:`gauge.census.census` on the model the Trainer holds (a float64 copy: the model
and the global RNG are untouched) with a probe batch (``batch=``, or the first ``probe_size`` examples of the
Trainer's training set collated by its own collator: no sampler is drawn, so the data order is unchanged), and
attaches :class:`dynamics.monitor.EquilibriumMonitor` to the Trainer's optimizer, whatever param groups it built
(wrappers such as accelerate's ``AcceleratedOptimizer`` are unwrapped to the torch optimizer).  Every recorded step
goes to the JSON-lines file (strict JSON), to a CSV file (one row per step and gauge group) and, when
``tensorboard=`` names a folder (the ``tensorboard`` package is optional) or passes a writer, to TensorBoard
scalars ``equilibrium/<group>/{norm,angle,norm_over_eq,angle_over_eq}``.  At ``on_train_end`` the summary is
appended to the JSON lines and the monitor's table is printed.  Only the main process (``state.is_world_process_zero``)
watches.  When the learning-rate schedule moves the equilibrium faster than the norm can follow, one warning is
logged (``transformers`` logging; :func:`dynamics.optlaws.schedule_lag`).

``transformers`` is imported here at module level; ``import dynamics`` does not import this module until
``dynamics.EquilibriumCallback`` is asked for.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback
from transformers.utils import logging as hf_logging

from dynamics.monitor import DEFAULT_BAND, EquilibriumMonitor, describe_gauges, is_empty
from rmsgauge import check_range, json_safe

logger = hf_logging.get_logger(__name__)
CSV_FIELDS = ("step", "group", "law", "lr", "wd", "norm", "angle", "norm_eq", "angle_eq", "relax_steps", "nu",
              "lag")


def unwrap_optimizer(opt: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside wrappers that keep it as ``.optimizer`` (accelerate's ``AcceleratedOptimizer``)."""
    seen = 0
    while not type(opt).__module__.startswith("torch.") and isinstance(getattr(opt, "optimizer", None),
                                                                       torch.optim.Optimizer) and seen < 8:
        opt, seen = opt.optimizer, seen + 1
    if not isinstance(opt, torch.optim.Optimizer):
        raise ValueError(f"EquilibriumCallback: the Trainer's optimizer is a {type(opt).__name__}, not a torch "
                         "optimizer; nothing to attach to")
    return opt


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside ``DistributedDataParallel`` / ``torch.compile`` wrappers (same parameters)."""
    for attr in ("module", "_orig_mod"):
        inner = getattr(model, attr, None)
        if isinstance(inner, nn.Module):
            return unwrap_model(inner)
    return model


class EquilibriumCallback(TrainerCallback):
    """Census + equilibrium monitor for ``transformers.Trainer`` (see the module docstring)."""

    def __init__(self, jsonl: str | Path, *, csv_path: str | Path | bool = True, tensorboard: Any = None,
                 batch: Any = None, gauges: Any = None, probe_size: int = 2, interval: int = 1,
                 band: float = DEFAULT_BAND, per_block: bool = True, print_table: bool = True) -> None:
        check_range("probe_size", probe_size, 1, None)
        self.jsonl = Path(jsonl)
        self.csv_path = self.jsonl.with_suffix(".csv") if csv_path is True else (Path(csv_path) if csv_path else None)
        self.batch, self.gauges, self.probe_size = batch, gauges, int(probe_size)
        self.monitor_kw = {"interval": interval, "band": band, "per_block": per_block}
        self.print_table = print_table
        self.writer = self._writer(tensorboard)
        self.monitor: EquilibriumMonitor | None = None
        self.found: dict[str, Any] | None = None
        self.summary: dict[str, Any] | None = None
        self.table: str | None = None
        self._done = 0

    @staticmethod
    def _writer(tb: Any) -> Any:
        if tb is None or hasattr(tb, "add_scalar"):
            return tb
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ValueError("tensorboard: the tensorboard package is not installed (pip install tensorboard); "
                             "pass tensorboard=None to write JSON lines and CSV only") from None
        return SummaryWriter(log_dir=str(tb))

    # ------------------------------------------------------------------------------------------------ events
    def on_train_begin(self, args: Any, state: Any, control: Any, model: nn.Module | None = None,
                       optimizer: Any = None, train_dataloader: Any = None, **kwargs: Any) -> None:
        if not getattr(state, "is_world_process_zero", True) or model is None or optimizer is None:
            return
        net = unwrap_model(model)
        spec = self.gauges if self.gauges is not None else self._census(net, train_dataloader, args)
        self.found = describe_gauges(spec)
        self.jsonl.parent.mkdir(parents=True, exist_ok=True)
        if is_empty(spec):
            logger.warning("EquilibriumCallback: the census found no gauge tensors; nothing to monitor")
            self.jsonl.write_text(json.dumps(json_safe({"event": "census", **self.found})) + "\n")
            return
        self.monitor = EquilibriumMonitor(net, unwrap_optimizer(optimizer), spec, log_path=self.jsonl,
                                          on_lag=logger.warning, **self.monitor_kw)
        with self.jsonl.open("a") as f:  # the monitor truncated the file: the census record comes first
            f.write(json.dumps(json_safe({"event": "census", **self.found})) + "\n")
        if self.csv_path is not None:
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            with self.csv_path.open("w", newline="") as f:
                csv.writer(f).writerow(CSV_FIELDS)
        self._done = 0

    def _census(self, net: nn.Module, loader: Any, args: Any) -> Any:
        from gauge.census import census  # gauge sits beside dynamics: imported when a run asks

        batch = self.batch if self.batch is not None else probe_batch(loader, self.probe_size)
        device = next(net.parameters()).device
        batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()} \
            if isinstance(batch, dict) else batch
        return census(net, batch=batch, own_eps=False, seed=int(getattr(args, "seed", 0)))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is None:
            return
        new = self.monitor.history[self._done:]
        self._done = len(self.monitor.history)
        if not new:
            return
        rows = [[rec["step"], name] + [r.get(k) for k in CSV_FIELDS[2:]] for rec in new
                for name, r in rec["groups"].items()]
        if self.csv_path is not None:
            with self.csv_path.open("a", newline="") as f:
                csv.writer(f).writerows(rows)
        if self.writer is not None:
            for rec in new:
                for name, r in rec["groups"].items():
                    self._scalars(name, r, rec["step"])

    def _scalars(self, name: str, r: dict[str, Any], step: int) -> None:
        vals = {"norm": r["norm"], "angle": r["angle"]}
        for key, eq in (("norm", "norm_eq"), ("angle", "angle_eq")):
            v = r.get(eq)
            if v is not None and math.isfinite(v) and v > 0:
                vals[f"{key}_over_eq"] = r[key] / v
        for k, v in vals.items():
            self.writer.add_scalar(f"equilibrium/{name}/{k}", v, step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is None:
            return
        self.on_step_end(args, state, control)
        self.monitor.detach()
        self.summary = self.monitor.summary()
        self.table = self.monitor.table()
        with self.jsonl.open("a") as f:
            f.write(json.dumps(json_safe({"event": "summary", **self.summary})) + "\n")
        if self.writer is not None and hasattr(self.writer, "flush"):
            self.writer.flush()
        if self.print_table:
            print(self.table)


def probe_batch(loader: Any, k: int) -> Any:
    """The first ``k`` examples of the loader's dataset, collated by its own collator (no sampler is drawn)."""
    ds = getattr(loader, "dataset", None)
    collate = getattr(loader, "collate_fn", None)
    if ds is None or collate is None:
        raise ValueError("EquilibriumCallback: no train_dataloader to draw a probe batch from; pass batch= (an "
                         "example batch the model takes as model(**batch)) or gauges=")
    return collate([ds[i] for i in range(min(k, len(ds)))])
