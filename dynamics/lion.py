r"""Lion (Chen et al., *Symbolic Discovery of Optimization Algorithms*, arXiv:2302.06675), as a torch optimizer.

torch has no Lion; this is the published rule (as google/automl's, lucidrains' ``lion-pytorch`` and epfml/REQ's),
for the monitor's law (:mod:`dynamics.scalefree`) and :func:`dynamics.rotational.rotational_lion` to be checked
against:

.. math::  c_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\qquad
           W_{t+1} = (1-\eta\lambda)W_t - \eta\,\operatorname{sign}(c_t),\qquad
           m_t = \beta_2 m_{t-1} + (1-\beta_2) g_t .

The monitor recognizes any optimizer class named ``Lion`` whose param groups carry ``lr``, ``betas`` and
``weight_decay``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from rmsgauge import check_range


class Lion(torch.optim.Optimizer):
    """Lion with decoupled weight decay ``lr * weight_decay`` per step (torch's convention, as AdamW)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        check_range("lr", lr, 0.0, None, lo_open=True)
        check_range("betas[0]", betas[0], 0.0, 1.0, hi_open=True)
        check_range("betas[1]", betas[1], 0.0, 1.0, hi_open=True)
        check_range("weight_decay", weight_decay, 0.0, None)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                update = (m * b1).add_(p.grad, alpha=1.0 - b1).sign_()
                if wd:
                    p.mul_(1.0 - lr * wd)
                p.add_(update, alpha=-lr)
                m.lerp_(p.grad, 1.0 - b2)
        return loss
