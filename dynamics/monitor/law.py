"""The law the equilibrium monitor applies to a param group at a step, or a law that predicts nothing and why.

:func:`dynamics.optlaws.resolve` finds the law of an optimizer's hyperparameters; here the monitor's policy wraps it:
a diagnostic never raises into the training step it watches, so a learning rate that is not finite, negative or
zero, a law outside its domain and a decay that flips the weight each become a status that says why (the statuses
are listed in :mod:`dynamics.monitor.table`).  A law travels through a checkpoint as plain data
(:func:`law_to_dict`, :func:`law_from_dict`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

import dynamics.optlaws as optlaws
from dynamics.optlaws import Law

LAW_ERRORS = (ValueError, ArithmeticError)  # what a law raises outside its domain (LinAlgError is a ValueError)


def one_line(e: BaseException) -> str:
    """An exception's message on one line (its type's name when it has none)."""
    return " ".join(str(e).split()) or type(e).__name__


def _no_law(label: str, why: str, note: str, lr: float, wd: float) -> tuple[Law, str]:
    """A law that predicts nothing (``kind`` none, no update read back) and the status that says why."""
    return Law(label, "none", note, lr, wd, lr_eff=0.0), why


def _law_why(law: Law) -> str | None:
    """The status of a resolved law that gives no prediction (None when it predicts)."""
    if law.label == "adam/l2":
        return "no law (Adam with L2)"
    if law.label == "adafactor/relative":
        return "no equilibrium (relative step: the update scales with the weight)"
    if law.kind == "none":
        return f"no law ({law.note.split(':')[0]})"
    return None


def resolve_law(optimizer: torch.optim.Optimizer, p: torch.Tensor,
                pg: Mapping[str, Any] | None) -> tuple[Law, str | None]:
    """The law of one parameter now (``pg``: its param group, None when it is in none), or a law that predicts
    nothing and why: a diagnostic never raises into the training step it watches."""
    if pg is None:
        return _no_law("none", "not stepped (not in the optimizer)",
                       "the parameter is in none of the optimizer's param groups: it is not stepped", math.nan, 0.0)
    raw_lr, wd = pg.get("lr"), float(pg.get("weight_decay", 0.0) or 0.0)
    lr = float(raw_lr) if raw_lr is not None else math.nan
    label = type(optimizer).__name__.lower()
    if raw_lr is not None and not math.isfinite(lr):
        return _no_law(label, f"no law (lr {lr})", f"the learning rate is {lr}", lr, wd)
    if lr < 0:
        return _no_law(label, "no law (negative lr)", f"the learning rate {lr:g} is negative: no law applies",
                       lr, wd)
    if lr == 0:
        return _no_law(label, "no motion (lr 0)", "the learning rate is 0: the weights do not move", lr, wd)
    try:
        law = optlaws.resolve(optimizer, pg, p)
    except LAW_ERRORS as e:
        return _no_law(label, f"no law ({one_line(e)})", f"no law: {one_line(e)}", lr, wd)
    decays = law.kind in ("adamw", "lion", "muon") or (law.kind == "heavyball" and law.rule is not None)
    if decays and lr * wd >= 1.0:
        return _no_law(law.label, "no equilibrium (lr*wd >= 1)",
                       f"lr*wd = {lr * wd:g} >= 1: each step's decay flips or zeroes the weight, no equilibrium",
                       lr, wd)
    return law, _law_why(law)


def law_to_dict(law: Law) -> dict[str, Any]:
    """Plain data (a ``weights_only`` checkpoint holds it): the law's fields, its SGD-family rule nested."""
    d = dataclasses.asdict(law)
    d["betas"] = list(law.betas)
    return d


def law_from_dict(d: Mapping[str, Any]) -> Law:
    """The law :func:`law_to_dict` wrote."""
    from dynamics.heavyball import HeavyBall

    rule = d.get("rule")
    return Law(**{**d, "rule": HeavyBall(**rule) if rule else None, "betas": tuple(d["betas"])})
