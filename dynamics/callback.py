r"""``EquilibriumCallback``: the gauge census and the equilibrium monitor inside a Hugging Face ``Trainer``
(usage in the README).

At ``on_train_begin`` it runs :func:`gauge.census.census` on a float64 copy of the Trainer's model (the model and the
global RNG untouched) with a probe batch (``batch=``, or the first ``probe_size`` training examples collated by the
Trainer's collator: no sampler is drawn), or takes ``gauges=``, and attaches
:class:`dynamics.monitor.EquilibriumMonitor` to the Trainer's optimizer (wrappers such as accelerate's unwrapped).
Records go to the JSON-lines file, the CSV file (``csv_path``; columns :data:`CSV_FIELDS`), TensorBoard
(``tensorboard=``: a folder or a writer; :func:`dynamics.monitor.record_scalars`) and, at each logging step,
through ``Trainer.log`` (``trainer_log``: ``"all"`` the roll-up, ``"groups"`` every group's too, None nothing; a
callback is not handed the Trainer, so it is found on the call stack).

The monitor's state rides in the Trainer's checkpoints (an ``ExportableState``) without its history, which the
JSON-lines file holds: a resumed run rebuilds the monitor from both and appends after a ``resume`` line; a run at
step 0 onto a file that holds records is refused (a log is never truncated).  Only the main process watches.
``transformers`` is imported here; ``import dynamics`` imports this module only when ``EquilibriumCallback`` is
asked for.
"""

from __future__ import annotations

import csv
import inspect
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.utils import logging as hf_logging

from dynamics.monitor import (
    DEFAULT_BAND,
    EquilibriumMonitor,
    append_lines,
    describe_gauges,
    group_spec,
    is_empty,
    read_records,
    record_scalars,
    spec_groups,
    tensorboard_writer,
)
from rmsgauge import check_choice, check_range

logger = hf_logging.get_logger(__name__)
CSV_FIELDS = ("step", "group", "law", "lr", "wd", "norm", "angle", "norm_eq", "angle_eq", "relax_steps", "nu",
              "lag", "norm_track", "why")
TRAINER_LOG = ("all", "groups")


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


class EquilibriumCallback(TrainerCallback, ExportableState):
    """Census + equilibrium monitor for ``transformers.Trainer`` (see the module docstring)."""

    def __init__(self, jsonl: str | Path, *, csv_path: str | Path | bool = True, tensorboard: Any = None,
                 batch: Any = None, gauges: Any = None, probe_size: int = 2, interval: int = 1,
                 band: float = DEFAULT_BAND, per_block: bool = True, print_table: bool = True,
                 trainer_log: str | None = "all") -> None:
        check_range("probe_size", probe_size, 1, None)
        if trainer_log is not None:
            check_choice("trainer_log", trainer_log, TRAINER_LOG)
        self.jsonl = Path(jsonl)
        self.csv_path = self.jsonl.with_suffix(".csv") if csv_path is True else (Path(csv_path) if csv_path else None)
        self.batch, self.gauges, self.probe_size = batch, gauges, int(probe_size)
        self.monitor_kw = {"interval": interval, "band": band, "per_block": per_block}
        self.print_table, self.trainer_log = print_table, trainer_log
        self._tensorboard_arg = tensorboard
        self.writer = tensorboard_writer(tensorboard)
        self.monitor: EquilibriumMonitor | None = None
        self.found: dict[str, Any] | None = None
        self.summary: dict[str, Any] | None = None
        self.table: str | None = None
        self._trainer: Any = None
        self._logging = False
        self._done = 0

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (``ExportableState``): the constructor's plain arguments and the monitor's state
        without its history (the JSON-lines file holds the records)."""
        tb = self._tensorboard_arg
        args = {"jsonl": str(self.jsonl), "csv_path": str(self.csv_path) if self.csv_path else False,
                "tensorboard": str(tb) if isinstance(tb, (str, Path)) else None, "probe_size": self.probe_size,
                **self.monitor_kw, "print_table": self.print_table, "trainer_log": self.trainer_log}
        saved = None
        if self.monitor is not None:
            mon = self.monitor.state_dict()
            saved = {"gauges": group_spec(self.monitor.groups), "found": self.found, "records": len(mon["history"]),
                     "monitor": {k: v for k, v in mon.items() if k != "history"}}
        return {"args": args, "attributes": {"saved": saved}}

    def _saved(self, state: Any) -> dict[str, Any] | None:
        """This callback's entry in a resumed Trainer's state (the checkpoint's), None where it holds none."""
        entries = (getattr(state, "stateful_callbacks", None) or {}).get(type(self).__name__)
        for entry in entries if isinstance(entries, list) else [entries]:
            if isinstance(entry, dict) and entry.get("args", {}).get("jsonl") == str(self.jsonl):
                return (entry.get("attributes") or {}).get("saved")
        return None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: nn.Module | None = None,
                       optimizer: Any = None, train_dataloader: Any = None, **kwargs: Any) -> None:
        if not getattr(state, "is_world_process_zero", True) or model is None or optimizer is None:
            return
        resumed_at = int(getattr(state, "global_step", 0) or 0)
        if not resumed_at:
            for path in (self.jsonl, self.csv_path):
                if path is not None and path.exists() and path.stat().st_size > 0:
                    raise ValueError(f"EquilibriumCallback: {path} already holds records and this run starts at step "
                                     "0; pass a new jsonl= (or csv_path=) or move the file: a log is never truncated "
                                     "(a run resumed from a checkpoint appends to it)")
        net, opt = unwrap_model(model), unwrap_optimizer(optimizer)
        self._trainer = self._running_trainer()
        self.jsonl.parent.mkdir(parents=True, exist_ok=True)
        saved = self._saved(state) if resumed_at else None
        if saved is not None:
            spec, self.found = spec_groups(saved["gauges"]), saved["found"]
        else:
            spec = self.gauges if self.gauges is not None else self._census(net, train_dataloader, args)
            self.found = describe_gauges(spec)
            if resumed_at:
                logger.warning(f"EquilibriumCallback: the checkpoint at step {resumed_at} holds no monitor state; "
                               f"the monitor starts afresh at step {resumed_at + 1}")
                append_lines(self.jsonl, [{"event": "resume", "step": resumed_at}])
            append_lines(self.jsonl, [{"event": "census", **self.found}])
            if is_empty(spec):
                logger.warning("EquilibriumCallback: the census found no gauge tensors; nothing to monitor")
                return
        self.monitor = EquilibriumMonitor(net, opt, spec, tensorboard=self.writer, on_lag=logger.warning,
                                          **self.monitor_kw)
        self.monitor.step = resumed_at  # a checkpoint's monitor state, where it holds one, sets it again
        if saved is not None:
            mon = saved["monitor"]
            history = read_records(self.jsonl, up_to=int(mon["step"])) if self.jsonl.exists() else []
            if len(history) != saved["records"]:
                logger.warning(f"EquilibriumCallback: {self.jsonl} holds {len(history)} of the {saved['records']} "
                               f"records up to step {mon['step']}; the summary covers the records it holds")
            self.monitor.load_state_dict({**mon, "history": history})
            append_lines(self.jsonl, [{"event": "resume", "step": resumed_at}])
        if self.csv_path is not None and not (self.csv_path.exists() and self.csv_path.stat().st_size > 0):
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            with self.csv_path.open("w", newline="") as f:
                csv.writer(f).writerow(CSV_FIELDS)
        self._done = len(self.monitor.history)

    def _running_trainer(self) -> Any:
        """The Trainer whose callback handler is calling this callback (callbacks are not handed the Trainer)."""
        frame = inspect.currentframe()
        try:
            while frame is not None:
                obj = frame.f_locals.get("self")
                handler = getattr(obj, "callback_handler", None)
                if callable(getattr(obj, "log", None)) and self in getattr(handler, "callbacks", ()):
                    return obj
                frame = frame.f_back
        finally:
            del frame
        return None

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
        append_lines(self.jsonl, new)
        if self.csv_path is not None:
            rows = [[rec["step"], name] + [r.get(k) for k in CSV_FIELDS[2:]] for rec in new
                    for name, r in rec["groups"].items()]
            with self.csv_path.open("a", newline="") as f:
                csv.writer(f).writerows(rows)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        """Beside each training log (the one with ``loss``), the latest record's figures through ``Trainer.log``."""
        if self._logging or self.monitor is None or self._trainer is None or self.trainer_log is None \
                or not logs or "loss" not in logs or not self.monitor.history:
            return
        figures = record_scalars(self.monitor.history[-1], self.monitor.band, groups=self.trainer_log == "groups")
        self._logging = True
        try:
            self._trainer.log(figures)
        finally:
            self._logging = False

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is None:
            return
        self.on_step_end(args, state, control)
        self.monitor.detach()
        self.summary = self.monitor.summary()
        self.table = self.monitor.table()
        append_lines(self.jsonl, [{"event": "summary", **self.summary}])
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
