"""Step hooks: what the training loop lets code outside it observe, without the loop knowing about it.

A hook is any object with these three methods (:class:`StepHook`)::

    on_start(model, optimizer, info)  -> dict | None   # once, before the first step; may add fields to
                                                       # the run's "start" log record
    after_step(step, lr)                               # after every optimizer step (step = steps done)
    on_end(summary)                                    # once, after the last step; may add summary keys

and, optionally, ``state_dict() -> dict`` / ``load_state_dict(d)``: the loop stores that state in each
checkpoint and hands it back on ``--resume``, so a hook's end-of-run statistics cover the whole run, not
only the part after the last resume.  The weights between two ``after_step`` calls are exactly the
weights the next step starts from, so a hook that wants a per-step change snapshots in one call and
compares in the next.

:class:`GaugeRotationHook` is the loop's default: the scale probe at the start (which tensors are
scale gauges) and, every ``gauge_interval`` steps, each gauge tensor's norm and per-step rotation angle
against AdamW's rotational-equilibrium predictions (:class:`lm.scale_probe.GaugeTracker`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from lm.scale_probe import GaugeTracker, expected_gauges, find_scale_gauges


@dataclass
class LoopInfo:
    """What a hook may read about the run at ``on_start``."""

    model_kind: str  # "dense" | "grt"
    train_config: Any  # lm.train.TrainConfig
    start: int  # first step this process runs (> 0 after --resume)
    total: int  # the run's last step
    is_main: bool  # rank 0: the only rank that writes logs
    probe_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]  # a fixed small (x, y) from the validation split
    log: Callable[[dict], None]  # append one record to the run's log.jsonl (rank 0; a no-op elsewhere)
    message: Callable[[str], None]  # one line for the user (the progress stream)


@runtime_checkable
class StepHook(Protocol):
    def on_start(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: LoopInfo) -> dict | None: ...

    def after_step(self, step: int, lr: float) -> None: ...

    def on_end(self, summary: dict) -> None: ...


class GaugeRotationHook:
    """The scale probe and the gauge-rotation log (``gauge`` records, ``summary["gauges"]``)."""

    name = "gauge_rotation"

    def __init__(self) -> None:
        self.tracker: GaugeTracker | None = None
        self.probe: dict[str, Any] = {"ran": False}
        self.interval = 0
        self.total = 0
        self._log: Callable[[dict], None] = lambda rec: None
        self._history: list[dict] = []  # restored by load_state_dict before on_start

    def on_start(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: LoopInfo) -> dict | None:
        cfg = info.train_config
        self.interval, self.total, self._log = cfg.gauge_interval, info.total, info.log
        if not (cfg.probe_gauges and cfg.gauge_interval > 0 and info.is_main):
            return {"gauge_probe": self.probe}
        px, py = info.probe_batch()
        pr = find_scale_gauges(model, px, py, seed=cfg.seed)  # float64 copy: leaves model and RNG alone
        exp = expected_gauges(model)
        self.probe = {"ran": True, "gauges": pr.gauges, "unused": pr.unused, "expected": exp,
                      "agrees_with_theory": None if exp is None else sorted(exp) == sorted(pr.gauges),
                      "threshold_float64": pr.threshold, "margin": pr.margin, "probe_loss": pr.loss,
                      "max_gauge_deviation": max((pr.deviation[n] for n in pr.gauges), default=None),
                      "min_nongauge_deviation": min((v for n, v in pr.deviation.items() if n not in pr.gauges
                                                     and n not in pr.unused), default=None)}
        named = dict(model.named_parameters())
        hyper = {n: (g["weight_decay"], g["betas"][0]) for g in optimizer.param_groups for n in g["names"]}
        self.tracker = GaugeTracker({n: named[n] for n in pr.gauges}, {n: hyper[n] for n in pr.gauges})
        self.tracker.history = list(self._history)
        shown = pr.gauges if len(pr.gauges) <= 4 else [*pr.gauges[:4], "..."]
        info.message(f"scale probe: {len(pr.gauges)} gauge tensor(s) {shown}; float64 threshold "
                     f"{pr.threshold:.2e}, margin x{pr.margin:.2e}")
        if self._tracked(info.start + 1):
            self.tracker.snapshot()
        return {"gauge_probe": self.probe}

    def _tracked(self, step: int) -> bool:
        return bool(self.tracker) and step <= self.total and (step % self.interval == 0 or step == self.total)

    def after_step(self, step: int, lr: float) -> None:
        if self.tracker is None:
            return
        if self._tracked(step):
            self._log({"event": "gauge", **self.tracker.measure(step, lr)})
        if self._tracked(step + 1):
            self.tracker.snapshot()  # the weights the next step starts from

    def on_end(self, summary: dict) -> None:
        summary["gauge_probe"] = self.probe
        summary["gauges"] = self.tracker.summary() if self.tracker else {}

    def state_dict(self) -> dict:
        return {"history": self.tracker.history if self.tracker else self._history}

    def load_state_dict(self, state: dict) -> None:
        self._history = list(state.get("history", []))
