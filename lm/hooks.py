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

The loop has no hook of its own, and nothing in ``lm`` attaches one.  ``python -m studies.train`` (and the
comparison's runs) attach :class:`dynamics.train_hook.TrainHook` (built by :func:`studies.train.monitor_hooks`): a
gauge census of the model on the probe batch at the start, then every ``gauge_interval`` steps each gauge
tensor's norm and per-step rotation against the equilibrium laws of :mod:`dynamics.laws`.  Those packages sit
above ``lm``, so the loop never imports them; it only calls whatever hooks it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


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
