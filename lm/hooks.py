"""Step hooks: what the training loop lets code outside it observe.

A hook has ``on_start`` (once before the first step; may return fields for the ``start`` record), ``after_step``
(after every optimizer step) and ``on_end`` (may add summary keys), and optionally ``state_dict()`` /
``load_state_dict(d)``, which each checkpoint stores and ``--resume`` hands back.  ``python -m studies.train``
attaches the equilibrium monitor (:class:`dynamics.train_hook.TrainHook`); nothing in ``lm`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

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


class StepHook(Protocol):
    def on_start(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: LoopInfo) -> dict | None: ...

    def after_step(self, step: int, lr: float) -> None: ...

    def on_end(self, summary: dict) -> None: ...
