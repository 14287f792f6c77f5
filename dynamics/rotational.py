r"""Rotational variants of SGD with momentum and AdamW: every gauge group at its equilibrium from step 1.

Kosson, Messmer & Jaggi (*Rotational Equilibrium*, arXiv:2305.17212, §5) propose "rotational variants" that
replace the slow approach to equilibrium (:math:`\approx 1/(2\eta\lambda)` steps, :mod:`dynamics.laws`) by its
end state: each scale-invariant group :math:`W_I` keeps a fixed norm and turns by the equilibrium angle
:math:`\varphi^*` every step.  Our construction (own implementation):

1. the base optimizer (``torch.optim.SGD`` with momentum or ``torch.optim.AdamW``) computes its step as usual;
   whole gauge tensors sit in a param group with ``weight_decay = 0`` (their decay is replaced by the norm
   constraint; the decay value is kept as ``rot_wd`` because it sets :math:`\varphi^*`);
2. per gauge group, the step :math:`\Delta = W_I - W_I'` is made tangent,
   :math:`\Delta_\perp = \Delta - \frac{\langle\Delta, W_I\rangle}{\lVert W_I\rVert^2}W_I` (any decay is radial and
   drops out, which also covers gauge blocks of partly-gauge tensors that keep their decay);
3. :math:`W_I \leftarrow \rho_I\,\widehat{W_I - \tan\varphi^*\,\lVert W_I\rVert\,\hat\Delta_\perp}`, so the
   angle between consecutive iterates is exactly :math:`\arctan(\tan\varphi^*) = \varphi^*` and the norm is the
   held :math:`\rho_I` (the group's norm at construction);
4. non-gauge parameters get the base optimizer's step untouched.

:math:`\varphi^*` is the exact equilibrium angle of the base optimizer at the current lr (read every step, so
schedules carry over) from :func:`dynamics.laws.equilibrium_angle`: AdamW
:math:`\cos\varphi^* = (q+\beta_1)/(1+\beta_1 q)`, :math:`q = 1-\eta\lambda` (small-d limit: Kosson et al.'s
:math:`\sqrt{2\eta\lambda(1-\beta_1)/(1+\beta_1)}`); SGD with momentum and coupled L2
:math:`\cos\varphi^* = 1-\eta\lambda/(1+\mu)` (Wan et al., *Spherical Motion Dynamics*, arXiv:2006.08419:
:math:`\sqrt{2\eta\lambda/(1+\mu)}`).  A group whose tangent step is exactly zero (no gradient) does not move.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import dynamics.laws as laws
from dynamics.monitor import GaugeGroup, gauge_groups


class RotationalOptimizer(torch.optim.Optimizer):
    """Wraps a base torch optimizer; gauge groups rotate by the base optimizer's equilibrium angle at fixed norm.

    Use :func:`rotational_sgd` / :func:`rotational_adamw`.  ``param_groups`` and ``state`` are the base
    optimizer's (lr schedulers and checkpoints see one optimizer).
    """

    def __init__(self, model: nn.Module, gauges: Any, base_cls: type[torch.optim.Optimizer], kind: str,
                 decay: str, *, per_block: bool = True, **base_kwargs: Any) -> None:
        if kind not in ("sgd", "sgdm", "adamw"):
            raise ValueError(f"kind must be one of sgd, sgdm, adamw; got {kind!r}")
        self.kind, self.decay = kind, decay
        self.groups: list[GaugeGroup] = gauge_groups(model, gauges, per_block=per_block)
        named = dict(model.named_parameters())
        whole = {g.param for g in self.groups if g.axis is None} | {
            n for n in {g.param for g in self.groups} if _covers(named[n], [g for g in self.groups if g.param == n])}
        wd = float(base_kwargs.pop("weight_decay", 0.0))
        gauge_ps = [p for n, p in named.items() if n in whole and p.requires_grad]
        other_ps = [p for n, p in named.items() if n not in whole and p.requires_grad]
        pgroups = [{"params": gauge_ps, "weight_decay": 0.0, "rot_wd": wd, "rotational": True}]
        if other_ps:
            pgroups.append({"params": other_ps, "weight_decay": wd, "rot_wd": wd, "rotational": False})
        self.base = base_cls(pgroups, **base_kwargs)
        super().__init__([p for p in named.values() if p.requires_grad], dict(self.base.defaults))
        self.param_groups = self.base.param_groups
        self.state = self.base.state
        self._named = named
        self._pg = {id(p): pg for pg in self.param_groups for p in pg["params"]}
        with torch.no_grad():
            self.held = {g.name: float(g.view(named[g.param].detach()).double().norm()) for g in self.groups}
        zero = [g.name for g, v in zip(self.groups, self.held.values()) if v == 0.0]
        if zero:
            raise ValueError(f"gauge groups with zero norm cannot rotate: {zero}")

    # the equilibrium angle this wrapper holds, for the monitor and the tests
    def rotational_angle(self, pg: dict[str, Any]) -> float:
        """:math:`\\varphi^*` for a param group at its current lr (the base optimizer's exact equilibrium angle)."""
        return laws.equilibrium_angle(self.kind, self.decay, float(pg["lr"]), float(pg["rot_wd"]),
                                      momentum=float(pg.get("momentum", 0.0) or 0.0),
                                      betas=tuple(pg.get("betas", (0.9, 0.999))))

    def held_norm(self, param: str, axis: int | None = None, start: int = 0) -> float:
        """The held norm of a group (``axis`` None: of the whole tensor, the root sum of its groups' squares)."""
        mine = [g for g in self.groups if g.param == param]
        if axis is None:
            return math.sqrt(sum(self.held[g.name] ** 2 for g in mine))
        return next(self.held[g.name] for g in mine if g.axis == axis and g.start == start)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> Any:
        before = {n: self._named[n].detach().clone() for n in {g.param for g in self.groups}}
        loss = self.base.step(closure)
        for g in self.groups:  # loop over gauge groups (a handful per layer), never over entries
            p = self._named[g.param]
            w0 = g.view(before[g.param])
            delta = w0 - g.view(p.detach())
            w0n2 = (w0 * w0).sum()
            tangent = delta - w0 * ((delta * w0).sum() / w0n2)  # the radial part (decay) drops out
            tn = tangent.norm()
            if float(tn) == 0.0:  # no gradient reached this group: it does not move
                g.view(p).copy_(w0)
                continue
            phi = self.rotational_angle(self._pg[id(p)])
            new = w0 - tangent * (math.tan(phi) * w0n2.sqrt() / tn)  # |tangent step| = tan(phi) |W|: angle phi
            g.view(p).copy_(new * (self.held[g.name] / new.norm()))
        return loss

    def state_dict(self) -> dict[str, Any]:
        return self.base.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.base.load_state_dict(state_dict)
        self.param_groups = self.base.param_groups
        self.state = self.base.state
        self._pg = {id(p): pg for pg in self.param_groups for p in pg["params"]}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none=set_to_none)


def _covers(p: torch.Tensor, groups: list[GaugeGroup]) -> bool:
    """Do the blocks of one tensor cover it along one axis (then the tensor needs no decay at all)?"""
    for axis in (0, 1):
        blocks = [g for g in groups if g.axis == axis]
        if blocks and sum(g.stop - g.start for g in blocks) == p.shape[axis]:
            return True
    return False


def rotational_sgd(model: nn.Module, gauges: Any, *, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                   per_block: bool = True) -> RotationalOptimizer:
    """Rotational variant of ``torch.optim.SGD(momentum, weight_decay)`` (coupled L2 convention)."""
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    if weight_decay <= 0.0 or lr <= 0.0:
        raise ValueError(f"lr and weight_decay must be in (0, inf) (they set the angle), got {lr!r}, {weight_decay!r}")
    return RotationalOptimizer(model, gauges, torch.optim.SGD, "sgdm" if momentum > 0 else "sgd", "l2",
                               per_block=per_block, lr=lr, momentum=momentum, weight_decay=weight_decay)


def rotational_adamw(model: nn.Module, gauges: Any, *, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                     eps: float = 1e-8, weight_decay: float = 0.01, per_block: bool = True) -> RotationalOptimizer:
    """Rotational variant of ``torch.optim.AdamW`` (decoupled decay ``lr * weight_decay`` per step)."""
    if weight_decay <= 0.0 or lr <= 0.0:
        raise ValueError(f"lr and weight_decay must be in (0, inf) (they set the angle), got {lr!r}, {weight_decay!r}")
    return RotationalOptimizer(model, gauges, torch.optim.AdamW, "adamw", "torch", per_block=per_block, lr=lr,
                               betas=betas, eps=eps, weight_decay=weight_decay)
