"""The equilibrium monitor's trainer adapter (``lm.hooks.StepHook`` protocol)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from dynamics.monitor import EquilibriumMonitor, describe_gauges, is_empty


class TrainHook:
    """Trainer adapter in the loop's hook protocol (``lm.hooks.StepHook``), on an existing monitor
    (``TrainHook(monitor=m)``) or built at start by :meth:`TrainHook.lazy` from the model's gauges (e.g. a census on
    the probe batch, passed in by the command-line entry: the loop imports nothing above it).  ``after_step`` returns
    the step's record or None (and appends it to ``info.log`` when the loop gives one); ``on_end`` adds
    ``summary["equilibrium"]`` (and ``summary["gauge_census"]`` for a lazy hook).  A lazy hook attaches nothing to a
    model with no gauges (recorded, not an error) or in a process that does not log (``info.is_main`` false).
    """

    name = "equilibrium_monitor"

    def __init__(self, monitor: EquilibriumMonitor | None = None,
                 gauges_of: Callable[[nn.Module, Any], Any] | None = None, **monitor_kw: Any) -> None:
        self.monitor, self._gauges_of, self._kw = monitor, gauges_of, monitor_kw
        self.found: dict[str, Any] | None = None  # describe_gauges() of what gauges_of returned (lazy hooks)
        self._returned = 0
        self._log: Callable[[dict], None] | None = None
        self._pending: dict[str, Any] | None = None  # state loaded before on_start built the monitor

    @classmethod
    def lazy(cls, gauges_of: Callable[[nn.Module, Any], Any], **monitor_kw: Any) -> TrainHook:
        """A hook that builds ``EquilibriumMonitor(model, optimizer, gauges_of(model, info), **monitor_kw)``."""
        return cls(gauges_of=gauges_of, **monitor_kw)

    def on_start(self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 info: Any = None, **ctx: Any) -> dict[str, Any]:
        log = getattr(info, "log", None)
        self._log = log if callable(log) else None
        if self.monitor is None and self._gauges_of is not None:
            if model is None or optimizer is None:
                raise ValueError("TrainHook.on_start needs model and optimizer when built with TrainHook.lazy")
            if not getattr(info, "is_main", True):
                return {}  # only the logging process watches: the others would compute what nobody writes
            spec = self._gauges_of(model, info)
            self.found = describe_gauges(spec)
            if not is_empty(spec):
                self.monitor = EquilibriumMonitor(model, optimizer, spec, **self._kw)
            self._say(info)
        elif self.monitor is None:
            raise ValueError("TrainHook needs a monitor or gauges_of (use TrainHook.lazy)")
        if self._pending is not None:
            self.load_state_dict(self._pending)
        self._returned = len(self.monitor.history) if self.monitor is not None else 0
        out: dict[str, Any] = {"equilibrium_groups": [g.name for g in self.monitor.groups] if self.monitor else []}
        if self.found is not None:
            out["gauge_census"] = self.found
        return out

    def _say(self, info: Any) -> None:
        message = getattr(info, "message", None)
        if not callable(message) or self.found is None:
            return
        names = self.found["gauges"] + list(self.found.get("partial", {}))
        if not names:
            message("gauge census: no gauge tensors, nothing to monitor")
            return
        shown = names if len(names) <= 4 else [*names[:4], "..."]
        tol = self.found.get("tolerance_float64")
        message(f"gauge census: {len(names)} gauge tensor(s) {shown}"
                + (f"; float64 tolerance {tol:.2e}" if isinstance(tol, float) and math.isfinite(tol) else ""))

    def after_step(self, step: int, lr: float | None = None, **ctx: Any) -> dict[str, Any] | None:
        if self.monitor is None:
            return None
        h = self.monitor.history
        new, self._returned = h[self._returned:], len(h)
        if self._log is not None:
            for rec in new:
                self._log(rec)
        return new[-1] if new else None

    def on_end(self, summary: dict[str, Any] | None = None, **ctx: Any) -> dict[str, Any]:
        if self.monitor is not None:
            self.monitor.detach()
        s = self.monitor.summary() if self.monitor is not None else {"steps": 0, "groups": {}}
        if summary is not None:
            summary["equilibrium"] = s
            if self.found is not None:
                summary["gauge_census"] = self.found
        return s

    def state_dict(self) -> dict[str, Any]:
        if self.monitor is not None:
            return self.monitor.state_dict()
        return dict(self._pending) if self._pending is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the monitor's state; before ``on_start`` (the loop restores hooks first) it waits for the monitor."""
        if not state:
            return
        if self.monitor is None:
            self._pending = dict(state)
            return
        self.monitor.load_state_dict(state)
        self._pending = None
        self._returned = len(self.monitor.history)
