r"""Which law of :mod:`dynamics.laws` governs a gauge group, read off a live torch optimizer's param group.

:func:`resolve` gives the :class:`Law` of a parameter at its param group's hyperparameters *now* (the update is read
back as :math:`u_t = (qW_t - W_{t+1})/\eta_{eff}`); :func:`predict` and :func:`steps_to_equilibrium` apply it to the
group's measured statistics (:class:`GroupStats`).

==========================================  ===================  ==================================================
optimizer                                    law                  predicted from
==========================================  ===================  ==================================================
``torch.optim.SGD`` (momentum, Nesterov,     ``sgd|sgdm|nesterov  :mod:`dynamics.heavyball` (closed forms where
dampening, coupled ``weight_decay``)         /l2``                they exist: :func:`dynamics.laws.fixed_point_l2`)
``torch.optim.AdamW``, ``Adam(decoupled)``   ``adamw/torch``      :func:`dynamics.laws.adamw_equilibrium_norm`,
                                                                  :func:`dynamics.adamw_window.adamw_steps_to_equilibrium`
``torch.optim.Adam(weight_decay > 0)``       ``adam/l2``          none (:data:`dynamics.laws.ADAM_L2_WHY`)
a class named ``Lion`` (:mod:`dynamics.lion`) ``lion``             :mod:`dynamics.scalefree` (arcsine series)
``torch.optim.Muon``                         ``muon``             :mod:`dynamics.scalefree` with measured
                                                                  :math:`\nu` and correlation sum
transformers' ``Adafactor`` (relative step   ``adafactor/         none: :data:`dynamics.laws.ADAFACTOR_WHY`; the
or ``scale_parameter``)                      relative``           angle bound :math:`\arctan(\text{clip}\,\rho_t)`
the :mod:`dynamics.rotational` wrappers      ``rotational``       their held angle and norm
anything else, AMSGrad                       ``none``             measured angles and norms only
==========================================  ===================  ==================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch

import dynamics.adamw_window as aw
import dynamics.laws as laws
import dynamics.scalefree as sf
from dynamics.heavyball import HeavyBall


@dataclass(frozen=True)
class Law:
    """One gauge group's rule at one step (hashable: the monitor caches predictions on it)."""

    label: str
    kind: str  # heavyball | adamw | lion | muon | adafactor | rotational | none
    note: str
    lr: float
    wd: float
    q: float = 1.0  # the step's multiplicative decay (1 for coupled L2: the decay is inside u)
    lr_eff: float = 1.0  # u_t = (q W_t - W_{t+1}) / lr_eff
    rule: HeavyBall | None = None
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = 0.0
    rel_step: float | None = None  # Adafactor's rho_t
    clip: float = 1.0

    @property
    def d(self) -> float:
        return 1.0 - self.q


@dataclass
class GroupStats:
    """What the monitor measured for one group (running means over the recorded steps)."""

    numel: int
    rows: int  # rows of the group's view (Muon's share of the orthogonal update)
    shape: tuple[int, ...]  # the parameter's shape
    x0: float  # first recorded squared norm
    norm0: float = math.nan  # norm at the start of the current step
    G2: float = math.nan  # mean (||g|| ||W||)^2
    nu: float = math.nan  # mean ||u||^2
    uw: float = math.nan  # mean <u, W>
    fresh: bool = True  # the optimizer had no state for the parameter at the first record
    y0: float = 0.0  # <W, momentum buffer> at the first record (SGD family)
    z0: float = 0.0  # ||momentum buffer||^2 at the first record
    extra: dict[str, Any] = field(default_factory=dict)


def _num(pg: Mapping[str, Any], key: str, default: float) -> float:
    v = pg.get(key)
    return default if v is None else float(v)


def _none(note: str, pg: Mapping[str, Any], label: str = "none") -> Law:
    return Law(label, "none", note, _num(pg, "lr", math.nan), _num(pg, "weight_decay", 0.0))


def resolve(optimizer: torch.optim.Optimizer, pg: Mapping[str, Any], param: torch.Tensor) -> Law:
    """The :class:`Law` of ``param`` under ``optimizer`` with param group ``pg`` at its current hyperparameters."""
    lr, wd = _num(pg, "lr", math.nan), _num(pg, "weight_decay", 0.0)
    name = type(optimizer).__name__
    if hasattr(optimizer, "rotational_angle"):
        return Law("rotational", "rotational", "angle held by the rotational wrapper", lr, wd)
    if type(optimizer) is torch.optim.SGD:
        return _sgd(pg, lr, wd)
    adamw = type(optimizer) is torch.optim.AdamW or (type(optimizer) is torch.optim.Adam
                                                     and pg.get("decoupled_weight_decay", False))
    if adamw or (type(optimizer) is torch.optim.Adam and wd == 0.0):
        if pg.get("amsgrad"):
            return _none("AMSGrad: v-hat is a running max, no closed law", pg)
        note = "AdamW (decoupled decay lr*wd)" if wd else "Adam without decay: no equilibrium, the norm grows"
        return Law("adamw/torch", "adamw", note, lr, wd, q=1.0 - lr * wd, lr_eff=lr, betas=tuple(pg["betas"]))
    if type(optimizer) is torch.optim.Adam:
        return _none(laws.ADAM_L2_WHY, pg, "adam/l2")
    if name == "Lion" and "betas" in pg:
        return Law("lion", "lion", "Lion (sign update, decoupled decay lr*wd)", lr, wd, q=1.0 - lr * wd, lr_eff=lr,
                   betas=tuple(pg["betas"]))
    if hasattr(torch.optim, "Muon") and type(optimizer) is torch.optim.Muon:
        ratio = sf.muon_lr_ratio(tuple(param.shape), pg.get("adjust_lr_fn"))
        return Law("muon", "muon", "Muon (orthogonalized momentum, decoupled decay lr*wd)", lr, wd, q=1.0 - lr * wd,
                   lr_eff=lr * ratio, momentum=float(pg.get("momentum", 0.0)))
    if name == "Adafactor" and (pg.get("relative_step") or pg.get("scale_parameter")):
        step = int(optimizer.state.get(param, {}).get("step", 0))
        rho = laws.adafactor_relative_step(max(step, 1), bool(pg.get("warmup_init"))) if pg.get("relative_step") \
            else _num(pg, "lr", 0.0)
        return Law("adafactor/relative", "adafactor", laws.ADAFACTOR_WHY, rho, wd, rel_step=rho,
                   clip=float(pg.get("clip_threshold", 1.0)))
    return _none(f"{name}: no law (SGD, Nesterov, AdamW, Adam, Lion, Muon, Adafactor are covered)", pg)


def _sgd(pg: Mapping[str, Any], lr: float, wd: float) -> Law:
    mu, damp = float(pg.get("momentum", 0.0) or 0.0), float(pg.get("dampening", 0.0) or 0.0)
    nest = bool(pg.get("nesterov", False))
    label = ("nesterov" if nest else "sgdm" if mu > 0 else "sgd") + "/l2"
    if wd == 0.0:
        return Law(label, "heavyball", "SGD without decay: no equilibrium, the norm grows", lr, wd, lr_eff=lr,
                   momentum=mu)
    rule = HeavyBall(lr=lr, l2=wd, momentum=mu, nesterov=nest, dampening=damp)
    note = "torch.optim.SGD (coupled L2" + (", Nesterov" if nest else "") + (", dampening" if damp else "") + ")"
    return Law(label, "heavyball", note, lr, wd, lr_eff=lr, rule=rule, momentum=mu)


def predict(law: Law, st: GroupStats) -> dict[str, Any]:
    """``angle_eq``, ``norm_eq``, ``relax_steps``, ``angle_rw`` (None where the law gives none).

    Hyperparameters outside a law's range (a negative lr, lr * weight_decay >= 1, a beta outside [0, 1)): a one-line
    ``ValueError`` naming the parameter and its range (:func:`dynamics.laws.decoupled_decay`), never a math domain
    error or a number no law gives."""
    out: dict[str, Any] = {"angle_eq": None, "norm_eq": None, "relax_steps": None, "angle_rw": None}
    if law.kind in ("adamw", "lion", "muon") or (law.kind == "heavyball" and law.rule is not None):
        laws.decoupled_decay(law.lr, law.wd, "l2" if law.kind == "heavyball" else "torch")
    if law.kind == "heavyball":
        out.update(_heavyball(law, st))
    elif law.kind == "adamw":
        b1, b2 = law.betas
        out["angle_eq"] = laws.equilibrium_angle("adamw", "torch", law.lr, law.wd, betas=law.betas)
        out["norm_eq"] = laws.adamw_equilibrium_norm(law.lr, law.wd, st.numel, b1, beta2=b2)
        out["relax_steps"] = laws.relaxation_steps("adamw", "torch", law.lr, law.wd)
        if law.lr > 0 and st.norm0 > 0:  # AdamW's random-walk angle at the current norm (valid in the transient)
            out["angle_rw"] = laws.random_walk_angle(law.lr, st.norm0, st.numel, b1, law.d, beta2=b2)
    elif law.kind in ("lion", "muon"):
        out.update(_scale_free(law, st))
    elif law.kind == "adafactor":
        out["angle_eq"] = laws.adafactor_angle_bound(law.rel_step, law.clip)
    return out


def _heavyball(law: Law, st: GroupStats) -> dict[str, Any]:
    if law.rule is None:  # no decay
        return {"angle_eq": 0.0, "norm_eq": math.inf, "relax_steps": math.inf}
    r = law.rule
    plain = not r.nesterov and r.dampening == 0.0
    cos = laws.equilibrium_cos_l2(law.lr, law.wd, r.momentum) if plain else r.equilibrium_cos()
    norm = None
    if math.isfinite(st.G2):
        norm = float(math.sqrt(laws.fixed_point_l2(law.lr, law.wd, st.G2, r.momentum))) if plain \
            else float(math.sqrt(r.fixed_point(st.G2)))
    return {"angle_eq": math.acos(cos), "norm_eq": norm, "relax_steps": _relax(r)}


_relax = lru_cache(maxsize=256)(HeavyBall.relaxation_steps)  # an eigenvalue problem per rule: cached
_lion_A = lru_cache(maxsize=256)(sf.lion_correlation_sum)  # a series per (d, beta1, beta2): cached


def correlation_sum(law: Law, st: GroupStats) -> float | None:
    """:math:`A` of a scale-free law: Lion's series; Muon's 0 without momentum, else measured."""
    if law.kind == "lion":
        return _lion_A(law.d, *law.betas)
    if law.momentum == 0.0:
        return 0.0
    return sf.measured_correlation_sum(law.lr_eff, st.nu, st.uw) if math.isfinite(st.nu) else None


def _scale_free(law: Law, st: GroupStats) -> dict[str, Any]:
    nu = float(st.numel) if law.kind == "lion" else st.nu
    A = correlation_sum(law, st)
    out: dict[str, Any] = {"relax_steps": sf.relaxation_steps(law.d)}
    if law.kind == "muon":
        out["nu_nominal"] = sf.muon_nominal_nu(st.shape, st.rows)
    if A is None or not math.isfinite(nu) or law.d <= 0.0:
        return out if law.d > 0.0 else {**out, "angle_eq": 0.0, "norm_eq": math.inf}
    out["norm_eq"] = float(math.sqrt(sf.fixed_point(law.lr_eff, law.d, nu, A)))
    out["angle_eq"] = math.acos(min(1.0, float(sf.equilibrium_cos(law.d, A))))
    return out


def steps_to_equilibrium(law: Law, st: GroupStats, band: float) -> tuple[float, float] | None:
    """``(enter, settle)`` predicted from the first recorded state with the law held fixed, or None.

    The SGD family iterates :class:`dynamics.heavyball.HeavyBall` from the recorded momentum state; a fresh AdamW /
    Lion iterates its transient map (:func:`dynamics.adamw_window.adamw_transient`,
    :func:`dynamics.scalefree.lion_trajectory`); a resumed one, and Muon, the linear :math:`q^{2t}` approach."""
    pred = predict(law, st)
    norm = pred.get("norm_eq")
    if norm is None or not math.isfinite(norm):
        return None if norm is None else (math.inf, math.inf)
    x_star = norm * norm
    if law.kind == "heavyball":
        return law.rule.steps_to_equilibrium(st.x0, st.G2, band, st.y0, st.z0) if law.rule is not None else None
    if st.fresh and law.kind == "adamw":
        return aw.adamw_steps_to_equilibrium(st.x0, law.lr, law.wd, st.numel, law.betas, band)
    if st.fresh and law.kind == "lion":
        return sf.lion_steps_to_equilibrium(st.x0, law.lr, law.wd, st.numel, law.betas, band)
    if law.kind == "muon" and law.momentum > 0.0:
        # the build-up of Muon's momentum has no closed form (the q^(2t) approach said 72 steps where a float64
        # simulation took 116): no prediction rather than a wrong one; the measured norms are still logged
        return None
    t = sf.steps_to_equilibrium(st.x0, x_star, law.d, band)
    return t, t


def schedule_lag(prev: Law, now: Law, st: GroupStats, steps: int) -> float | None:
    r"""How far the norm trails a moving equilibrium: relaxation time times the relative change of :math:`x^*` per
    step caused by the hyperparameters alone (both laws fed the same statistics).  A first-order tracker of a
    target moving at relative rate :math:`r` trails it by :math:`\tau r`; above the monitor's band the norm cannot
    follow the schedule."""
    a, b = predict(prev, st).get("norm_eq"), predict(now, st)
    nb, relax = b.get("norm_eq"), b.get("relax_steps")
    if steps < 1 or not all(v is not None and math.isfinite(v) for v in (a, nb, relax)) or a <= 0:
        return None
    return relax * abs(2.0 * math.log(nb / a)) / steps
