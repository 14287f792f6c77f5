r"""Rotational variants of SGD with momentum, AdamW and Lion: every gauge group at its equilibrium from step 1.

Kosson, Messmer & Jaggi (*Rotational Equilibrium*, arXiv:2305.17212, §5; code: epfml/REQ) replace the slow approach
to equilibrium (:math:`\approx 1/(2\eta\lambda)` steps) by its end state.  Our construction (own implementation):

1. the base optimizer (``torch.optim.SGD``, ``torch.optim.AdamW`` or :class:`dynamics.lion.Lion`) steps as usual;
   whole gauge tensors sit in param groups with ``weight_decay = 0`` (the value is kept as ``rot_wd``: it sets
   :math:`\varphi^*`);
2. per rotational unit (a gauge group, or with ``per_neuron=True`` each row of it, REQ's option) the step
   :math:`\Delta = W_I - W_I'` is made tangent, :math:`\Delta_\perp = \Delta - \frac{\langle\Delta,
   W_I\rangle}{\lVert W_I\rVert^2}W_I` (any decay is radial and drops out);
3. :math:`W_I \leftarrow \rho_I\,\widehat{W_I - \tan\varphi^*\,\lVert W_I\rVert\,\hat\Delta_\perp}`: consecutive
   iterates are exactly :math:`\varphi^*` apart at the held norm :math:`\rho_I` (its norm at construction); a unit
   with no tangent step does not move;
4. every other parameter gets the base optimizer's step untouched, bit for bit.

:math:`\varphi^*` is the base optimizer's exact equilibrium angle at the param group's current lr (read every step,
so schedules carry over): AdamW's at its betas (:func:`dynamics.laws.equilibrium_angle`), SGD's with coupled L2
(Wan et al., arXiv:2006.08419; Nesterov or dampening: :mod:`dynamics.heavyball`), Lion's sign-correlation series
(:mod:`dynamics.scalefree`; REQ's :math:`\sqrt{\pi/2}\sqrt{2\eta\lambda}\sigma` is its linearized small-d form).

**Parameter groups.**  ``groups=[{"params": ["blocks.0.*", "head.weight"], "lr": 1e-3, "weight_decay": 0.05}, ...]``
names parameters (exact names or ``fnmatch`` patterns) with their own hyperparameters; the rest take the defaults.
``no_decay`` names parameters the base optimizer steps without decay (never a gauge: its decay sets its angle).
Every name and pattern must match.  A bad value is one line naming the parameter and its range, at construction and
again before each step (a scheduler or a hand edit of ``param_groups`` may have moved it).

**Checkpoints.**  :meth:`RotationalOptimizer.state_dict` holds the base optimizer's state and the held norms
(``"rotational_held"``), so a resumed run continues bit for bit; :meth:`~RotationalOptimizer.load_state_dict`
refuses a dict without them, or with other gauge groups or unit counts.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

import dynamics.laws as laws
import dynamics.scalefree as sf
from dynamics.heavyball import HeavyBall
from dynamics.lion import Lion
from dynamics.monitor import GaugeGroup, gauge_groups
from dynamics.monitor.groups import covers
from rmsgauge import check_range

KINDS = {"sgd": torch.optim.SGD, "sgdm": torch.optim.SGD, "adamw": torch.optim.AdamW, "lion": Lion}


HELD_KEY = "rotational_held"  # the state dict's entry for the held norms (group name -> (units,) tensor)


def check_hparams(where: str, lr: Any, wd: Any, *, gauge: bool) -> None:
    """One-line ``ValueError`` for an lr / weight decay pair that cannot set a rotation (``where`` names the group)."""
    check_range(f"{where}lr", lr, 0.0, None, lo_open=True)
    check_range(f"{where}weight_decay", wd, 0.0, None, lo_open=gauge)
    check_range(f"{where}lr * weight_decay", lr * wd, 0.0, 1.0, hi_open=True)


def check_group(kind: str, pg: Mapping[str, Any], *, gauge: bool) -> None:
    """One-line ``ValueError`` for any hyperparameter of a param group outside the range its law and the base step
    need: lr and weight decay (:func:`check_hparams`; the decay that sets the angle, ``rot_wd``, and the one the base
    applies), the momentum and dampening of SGD, the betas of AdamW and Lion, AdamW's eps."""
    i = pg.get("group_index", -1)  # -1: the defaults (no prefix); i: the caller's groups[i]
    where = "" if i < 0 else f"groups[{i}]."
    check_hparams(where, pg.get("lr"), pg.get("rot_wd", pg.get("weight_decay")), gauge=gauge)
    check_hparams(where, pg.get("lr"), pg.get("weight_decay"), gauge=False)
    if kind in ("sgd", "sgdm"):
        check_range(f"{where}momentum", pg.get("momentum"), 0.0, 1.0, hi_open=True)
        check_range(f"{where}dampening", pg.get("dampening", 0.0), 0.0, 1.0, hi_open=True)
        if not isinstance(pg.get("nesterov", False), bool):
            raise ValueError(f"{where}nesterov must be True or False, got {pg.get('nesterov')!r}")
        return
    betas = pg.get("betas")
    if not isinstance(betas, Sequence) or len(betas) != 2:
        raise ValueError(f"{where}betas must be a pair (beta1, beta2), got {betas!r}")
    check_range(f"{where}betas[0]", betas[0], 0.0, 1.0, hi_open=True)
    check_range(f"{where}betas[1]", betas[1], 0.0, 1.0, hi_open=True)
    if kind == "adamw":
        check_range(f"{where}eps", pg.get("eps"), 0.0, None)
        if pg.get("amsgrad"):
            raise ValueError(f"{where}amsgrad must be False: AMSGrad's running max of v-hat has no equilibrium angle")


def _match(names: Sequence[str], patterns: Iterable[str], what: str) -> set[str]:
    out: set[str] = set()
    for pat in patterns:
        hit = {n for n in names if n == pat or fnmatch.fnmatchcase(n, pat)}
        if not hit:
            raise ValueError(f"{what}: no parameter named or matching {pat!r} (the model has {len(names)} parameters)")
        out |= hit
    return out


class RotationalOptimizer(torch.optim.Optimizer):
    """Wraps a base torch optimizer; gauge units rotate by the base optimizer's equilibrium angle at fixed norm.

    Use :func:`rotational_sgd` / :func:`rotational_adamw` / :func:`rotational_lion`.  ``param_groups`` and ``state``
    are the base optimizer's (lr schedulers and checkpoints see one optimizer).
    """

    def __init__(self, model: nn.Module, gauges: Any, kind: str, *, per_block: bool = True,
                 per_neuron: bool = False, groups: Sequence[Mapping[str, Any]] | None = None,
                 no_decay: Iterable[str] = (), **defaults: Any) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
        check_group(kind, defaults, gauge=True)  # the defaults, before any work
        self.kind, self.per_neuron = kind, bool(per_neuron)
        self.groups: list[GaugeGroup] = gauge_groups(model, gauges, per_block=per_block)
        self._named = named = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.base = KINDS[kind](self._param_groups(named, defaults, groups or (), no_decay))
        super().__init__([p for p in named.values()], dict(self.base.defaults))
        self.param_groups = self.base.param_groups
        self.state = self.base.state
        self._pg = {id(p): pg for pg in self.param_groups for p in pg["params"]}
        self._gauge_ids = {id(named[g.param]) for g in self.groups}
        self.check_groups()
        with torch.no_grad():
            self.held = {g.name: self._units(g, named[g.param].detach()).norm(dim=1) for g in self.groups}
        zero = [g.name for g in self.groups if bool((self.held[g.name] == 0).any())]
        if zero:
            raise ValueError(f"gauge units with zero norm cannot rotate: {zero}")

    def check_groups(self, saved: Sequence[Mapping[str, Any]] | None = None) -> None:
        """:func:`check_group` on every param group (at construction and before each step), or on the ``saved``
        values of a state dict's groups before they are loaded."""
        for pg, values in zip(self.param_groups, self.param_groups if saved is None else saved):
            check_group(self.kind, {**values, "params": pg["params"]},
                        gauge=any(id(p) in self._gauge_ids for p in pg["params"]))

    def _param_groups(self, named: dict[str, torch.Tensor], defaults: dict[str, Any],
                      groups: Sequence[Mapping[str, Any]], no_decay: Iterable[str]) -> list[dict[str, Any]]:
        names, gauge_names = list(named), {g.param for g in self.groups}
        blocks = {n: [(g.axis, g.start, g.stop) for g in self.groups if g.param == n] for n in gauge_names}
        whole = {g.param for g in self.groups if g.axis is None} | {  # blocks that tile it: it needs no decay at all
            n for n in gauge_names if any(covers([b for b in blocks[n] if b[0] == a], named[n].shape) for a in (0, 1))}
        nd = _match(names, no_decay, "no_decay")
        if nd & gauge_names:
            raise ValueError(f"no_decay names gauge tensor(s) {sorted(nd & gauge_names)}: a rotational gauge needs "
                             f"weight_decay in (0, inf) (it sets the angle); drop them from no_decay or from gauges")
        owner: dict[str, int] = {}
        specs = [dict(defaults)]
        for i, grp in enumerate(groups):
            extra = set(grp) - {"params"} - set(defaults) - {"lr", "weight_decay"}
            if "params" not in grp or extra:
                raise ValueError(f"groups[{i}] must have 'params' and only the optimizer's options; unknown: "
                                 f"{sorted(extra) if extra else 'params missing'}")
            for n in _match(names, grp["params"], f"groups[{i}].params"):
                if n in owner:
                    raise ValueError(f"groups[{i}].params: {n!r} is already in groups[{owner[n]}]")
                owner[n] = i
            specs.append({**defaults, **{k: v for k, v in grp.items() if k != "params"}})
        out = []
        for i, spec in enumerate(specs):  # spec 0: the defaults; spec i + 1: groups[i]
            mine = [n for n in names if owner.get(n, -1) == i - 1]
            where = "" if i == 0 else f"groups[{i - 1}]."
            wd = spec.pop("weight_decay", 0.0)
            check_hparams(where, spec.get("lr"), wd, gauge=any(n in gauge_names for n in mine))
            rot = [named[n] for n in mine if n in whole]
            rest_d = [named[n] for n in mine if n not in whole and n not in nd]
            rest_nd = [named[n] for n in mine if n not in whole and n in nd]
            for ps, w, is_rot in ((rot, 0.0, True), (rest_d, wd, False), (rest_nd, 0.0, False)):
                if ps:
                    out.append({**spec, "params": ps, "weight_decay": w, "rot_wd": wd, "rotational": is_rot,
                                "group_index": i - 1})
        return out

    def rotational_angle(self, pg: dict[str, Any]) -> float:
        """:math:`\\varphi^*` for a param group at its current lr (the base optimizer's exact equilibrium angle)."""
        check_group(self.kind, pg, gauge=True)  # a scheduler or a hand edit may have moved any of them
        lr, wd = pg["lr"], pg["rot_wd"]
        if self.kind == "lion":
            d = lr * wd
            return math.acos(float(sf.equilibrium_cos(d, sf.lion_correlation_sum(d, *pg["betas"]))))
        if self.kind == "adamw":
            return laws.equilibrium_angle("adamw", "torch", lr, wd, betas=tuple(pg["betas"]))
        mu, damp, nesterov = float(pg["momentum"]), float(pg.get("dampening", 0.0)), pg.get("nesterov", False)
        if nesterov or damp:  # the general heavy-ball law (dynamics.heavyball) for what torch's SGD also does
            return math.acos(HeavyBall(lr=lr, l2=wd, momentum=mu, nesterov=nesterov, dampening=damp).equilibrium_cos())
        return laws.equilibrium_angle("sgdm" if mu > 0 else "sgd", "l2", lr, wd, momentum=mu)

    def held_norm(self, param: str, axis: int | None = None, start: int = 0, stop: int | None = None) -> float:
        """The held norm of ``param`` (``axis`` None), or of its block ``[start, stop)`` on ``axis``: one of the
        gauge groups, or (``per_neuron``) any run of rows inside one; NaN for a block no unit matches."""
        mine = [g for g in self.groups if g.param == param]
        if axis is None:
            return math.sqrt(sum(float(self.held[g.name].pow(2).sum()) for g in mine))
        for g in mine:
            end = g.stop if stop is None else stop
            if g.axis != axis or not g.start <= start < end <= g.stop:
                continue
            if (start, end) == (g.start, g.stop):
                return math.sqrt(float(self.held[g.name].pow(2).sum()))
            if self.per_neuron and axis == 0:
                return math.sqrt(float(self.held[g.name][start - g.start:end - g.start].pow(2).sum()))
        return math.nan

    def _units(self, g: GaugeGroup, t: torch.Tensor) -> torch.Tensor:
        """The group's rotational units as rows: ``(rows, -1)`` per neuron, else ``(1, -1)``."""
        v = g.view(t)
        return v.reshape(v.shape[0], -1) if self.per_neuron and v.dim() > 1 else v.reshape(1, -1)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> Any:
        self.check_groups()  # before the base moves anything: a bad value never reaches the weights
        before = {n: self._named[n].detach().clone() for n in {g.param for g in self.groups}}
        loss = self.base.step(closure)
        for g in self.groups:  # a handful of groups per layer; the units of a group in one vectorized pass
            p = self._named[g.param]
            w0 = self._units(g, before[g.param])  # (U, m)
            delta = w0 - self._units(g, p.detach())
            w0n2 = (w0 * w0).sum(1, keepdim=True)  # (U, 1)
            tangent = delta - w0 * ((delta * w0).sum(1, keepdim=True) / w0n2)  # the radial part (decay) drops out
            tn = tangent.norm(dim=1, keepdim=True)
            phi = self.rotational_angle(self._pg[id(p)])
            scale = torch.where(tn > 0, math.tan(phi) * w0n2.sqrt() / torch.where(tn > 0, tn, 1.0), 0.0)
            new = w0 - tangent * scale  # |tangent step| = tan(phi) |W|: the angle is phi; no gradient: no move
            new = new * (self.held[g.name].to(new.dtype).unsqueeze(1) / new.norm(dim=1, keepdim=True))
            g.view(p).copy_(new.reshape(g.view(p).shape))
        return loss

    def state_dict(self) -> dict[str, Any]:
        """The base optimizer's state dict plus the held norms (``"rotational_held"``): a resumed run holds the
        norms it held, not the norms of its loaded weights (equal only to round-off, which the next steps carry)."""
        return {**self.base.state_dict(), HELD_KEY: {name: h.clone() for name, h in self.held.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        held = state_dict.get(HELD_KEY)
        if not isinstance(held, Mapping):
            raise ValueError(f"state_dict has no {HELD_KEY!r} (the held norms of the gauge units): save it with "
                             f"RotationalOptimizer.state_dict()")
        if set(held) != set(self.held):
            raise ValueError(f"state_dict[{HELD_KEY!r}] holds gauge groups {sorted(held)}, this optimizer has "
                             f"{sorted(self.held)}")
        bad = [n for n, h in held.items() if not isinstance(h, torch.Tensor) or h.shape != self.held[n].shape]
        if bad:
            raise ValueError(f"state_dict[{HELD_KEY!r}]: the unit counts of {bad} differ from this optimizer's "
                             f"(per_neuron and the gauge blocks must match the saved run)")
        self.check_groups(state_dict.get("param_groups", ()))  # before anything is loaded
        self.base.load_state_dict({k: v for k, v in state_dict.items() if k != HELD_KEY})
        self.param_groups = self.base.param_groups
        self.state = self.base.state
        self._pg = {id(p): pg for pg in self.param_groups for p in pg["params"]}
        self.held = {n: held[n].to(device=h.device, dtype=h.dtype, copy=True) for n, h in self.held.items()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none=set_to_none)


def rotational_sgd(model: nn.Module, gauges: Any, *, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                   per_block: bool = True, per_neuron: bool = False, groups: Sequence[Mapping[str, Any]] | None = None,
                   no_decay: Iterable[str] = ()) -> RotationalOptimizer:
    """Rotational variant of ``torch.optim.SGD(momentum, weight_decay)`` (coupled L2 convention)."""
    return RotationalOptimizer(model, gauges, "sgdm" if momentum > 0 else "sgd", per_block=per_block,
                               per_neuron=per_neuron, groups=groups, no_decay=no_decay, lr=lr, momentum=momentum,
                               weight_decay=weight_decay)


def rotational_adamw(model: nn.Module, gauges: Any, *, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                     eps: float = 1e-8, weight_decay: float = 0.01, per_block: bool = True, per_neuron: bool = False,
                     groups: Sequence[Mapping[str, Any]] | None = None,
                     no_decay: Iterable[str] = ()) -> RotationalOptimizer:
    """Rotational variant of ``torch.optim.AdamW`` (decoupled decay ``lr * weight_decay`` per step)."""
    return RotationalOptimizer(model, gauges, "adamw", per_block=per_block, per_neuron=per_neuron, groups=groups,
                               no_decay=no_decay, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def rotational_lion(model: nn.Module, gauges: Any, *, lr: float, betas: tuple[float, float] = (0.9, 0.99),
                    weight_decay: float = 1.0, per_block: bool = True, per_neuron: bool = False,
                    groups: Sequence[Mapping[str, Any]] | None = None,
                    no_decay: Iterable[str] = ()) -> RotationalOptimizer:
    """Rotational variant of :class:`dynamics.lion.Lion` (decoupled decay ``lr * weight_decay``; REQ's
    ``RotationalLion`` construction, with the exact equilibrium angle of :mod:`dynamics.scalefree`)."""
    return RotationalOptimizer(model, gauges, "lion", per_block=per_block, per_neuron=per_neuron, groups=groups,
                               no_decay=no_decay, lr=lr, betas=betas, weight_decay=weight_decay)
