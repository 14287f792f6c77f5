r"""The census at the model's own eps: measured deviations beside the exact eps law of :mod:`gauge.laws`.

For a normalized set :math:`z` (a row of :func:`gauge.census.norms.rows`) with :math:`m` its mean square (RMSNorm)
or variance (centring families),
:math:`\operatorname{Norm}_\epsilon(cz) - \beta = r(c)\,(\operatorname{Norm}_\epsilon(z) - \beta)` with
:math:`r(c) = c\sqrt{m+\epsilon}/\sqrt{c^2m+\epsilon}`, monotone on each side of 1: the largest deviation over the
``scales`` is at the smallest or the largest :math:`c`, and both are measured.  The loss change is
:math:`|\langle \partial L/\partial y, y_c - y\rangle|` (one backward for every norm), first order in
:math:`y_c - y`, whose relative size is :math:`\approx \epsilon/m` (used where the output moves by at most
:data:`FIRST_ORDER_REL` of its largest entry); elsewhere the loss is measured at both ends.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gauge.census.engine import Engine
from gauge.census.norms import NormInfo, minus_bias, rows
from gauge.census.records import Block, EpsReport, layer_of
from gauge.laws import break_scales, eps_ratio_minus_one
from rmsgauge import tolerance

# the loss change at the model's eps is taken to first order in the norm's measured output change y_c - y only where
# that change is at most 1% of the output's largest entry: the neglected second-order term is then about 1% of it
FIRST_ORDER_REL = 0.01
LAYER_GROUP = 8  # tensors whose own-eps loss deviations share one vmapped call at most


class _Stop(Exception):
    """Raised by the hook once the norm has run: the rest of the forward is not needed."""


@dataclass
class Probe:
    """What the own-eps report needs of one tensor: the module holding it, its captured call, and its reader."""

    param: str  # full parameter name
    local: str  # the parameter's name inside its module
    module: nn.Module
    call: tuple[tuple, dict, Any] | None  # (args, kwargs, output) of the module's first call at the model's eps
    norm: nn.Module | None
    info: NormInfo | None
    io: tuple[torch.Tensor, torch.Tensor] | None  # the norm's first (input, output) at the model's eps
    grad: torch.Tensor | None  # dL/dy at that output (one backward at the model's eps for every norm)


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def _norm_io_forward(eng: Engine, norm: nn.Module, swaps: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The norm's first input and output with the named parameters replaced (the forward stops at the norm)."""
    got: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def hook(mod: nn.Module, inp: tuple, out: Any) -> None:
        got["zy"] = (inp[0].detach(), _first(out).detach())
        raise _Stop

    h = norm.register_forward_hook(hook)
    try:
        with torch.no_grad(), contextlib.suppress(_Stop):
            eng.call(swaps)
    finally:
        h.remove()
    return got["zy"]


def _norm_io_local(pr: Probe, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The norm's input and output from the module's own call at weight ``w`` (None: the layout does not match)."""
    args, kwargs, out0 = pr.call
    out0, z0 = _first(out0), pr.io[0]
    with torch.no_grad():
        out = _first(torch.func.functional_call(pr.module, {pr.local: w}, args, kwargs))
    if not isinstance(out, torch.Tensor) or out.shape != out0.shape or out.stride() != out0.stride():
        return None
    z = out.as_strided(z0.size(), z0.stride(), out.storage_offset() + z0.storage_offset() - out0.storage_offset())
    with torch.no_grad():
        return z, _first(pr.norm(z))


def norm_deviation(eng: Engine, pr: Probe, w: torch.Tensor, ends: torch.Tensor, blk: Block,
                   eps: float) -> tuple[float, float, float, tuple[float, float], float, float]:
    """At the two extreme scales of ``blk``: the measured and the law deviation of the norm's output, the loss
    change to first order in the measured output change (``<dL/dy, y_c - y>``), the break scales, the output
    tolerance and the largest ``|y - beta|``."""
    info, m = pr.info, pr.norm
    z0, y0 = rows(info, m, pr.io[0]), rows(info, m, minus_bias(info, m, pr.io[1]))
    local = pr.call is not None and _same(_norm_io_local(pr, w), pr.io)
    meas, law, dl1 = 0.0, 0.0, 0.0
    for c in ends:
        wc = _scale(w, blk, c)
        zc_raw, yc_raw = _norm_io_local(pr, wc) if local else _norm_io_forward(eng, m, {pr.param: wc})
        if pr.grad is not None:
            dl1 = max(dl1, abs(float((pr.grad * (yc_raw - pr.io[1])).sum())))
        zc, yc = rows(info, m, zc_raw), rows(info, m, minus_bias(info, m, yc_raw))
        hit = (zc != z0).any(-1)  # the normalized sets this block feeds
        if bool(hit.any()):
            z = z0[hit] - z0[hit].mean(-1, keepdim=True) if info.centred else z0[hit]
            meas = max(meas, float((yc[hit] - y0[hit]).abs().max()))
            law = max(law, float((eps_ratio_minus_one(c, z.pow(2).mean(-1, keepdim=True), eps).abs()
                                  * y0[hit].abs()).max()))
    ymax = float(y0.abs().max())
    out_tol = tolerance("float64", size=int(z0.shape[-1]), scale=ymax).bound(ymax)
    zr = z0 - z0.mean(-1, keepdim=True) if info.centred else z0
    return meas, law, dl1, break_scales(zr, y0, eps, out_tol), out_tol, ymax


def _same(a: tuple[torch.Tensor, torch.Tensor] | None, b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return a is not None and all(x.shape == y.shape and bool(torch.equal(x, y)) for x, y in zip(a, b))


def _scale(w: torch.Tensor, blk: Block, c: torch.Tensor) -> torch.Tensor:
    if blk.axis is None:
        return w * c
    f = torch.ones(w.shape[blk.axis], dtype=w.dtype)
    f[blk.start:blk.stop] = c
    return w * f.reshape([-1 if d == blk.axis else 1 for d in range(w.dim())])


def eps_report(eng: Engine, pr: Probe, blk: Block, eps: float | None, cs: torch.Tensor,
               measure: bool = False) -> tuple[EpsReport, list[torch.Tensor]]:
    """The report of ``blk`` at the model's eps, and the scaled values whose loss must still be measured (none where
    a norm reads the block, unless ``measure``: its loss change is first order in the measured output change)."""
    ends = torch.stack([cs.min(), cs.max()])
    w = eng.params[pr.param].detach()
    if pr.norm is None or pr.io is None or pr.info.family not in ("rms", "layer", "group", "batch", "instance"):
        return EpsReport(eps=eps, loss_change=math.nan, output_change=None, output_law=None, law_agreement=None,
                         break_scales=None, loss_first_order=False), [_scale(w, blk, c) for c in ends]
    e = float(eps) if eps is not None else float(torch.finfo(torch.float64).eps)
    meas, law, dl1, bs, out_tol, ymax = norm_deviation(eng, pr, w, ends, blk, e)
    agree = abs(meas - law) / law if law > 0 else (0.0 if meas <= out_tol else math.inf)
    first = not measure and pr.grad is not None and meas <= FIRST_ORDER_REL * ymax
    return EpsReport(eps=e, loss_change=dl1, output_change=meas, output_law=law, law_agreement=agree,
                     break_scales=bs, loss_first_order=first), [] if first else [_scale(w, blk, c) for c in ends]


def eps_losses(eng: Engine, items: list[tuple[str, list[torch.Tensor]]], loss_own: float, bound: float,
               tick: Callable[[int, str], None]) -> list[float]:
    """``max |L - L(W)|`` at the model's eps for each ``(param, [scaled values])``; the items of one layer (up to
    :data:`LAYER_GROUP`) in one vmapped call, each candidate swapping one tensor."""
    out: list[float] = []
    runs = [list(run) for _, run in itertools.groupby(items, key=lambda it: layer_of(it[0], it[0]))]
    for group in (run[i:i + LAYER_GROUP] for run in runs for i in range(0, len(run), LAYER_GROUP)):
        names = list(dict.fromkeys(n for n, _ in group))
        owner = [k for k, (_, vs) in enumerate(group) for _ in vs]  # candidate -> item
        flat = [v for _, vs in group for v in vs]

        def make(lo: int, hi: int, names=names, group=group, owner=owner, flat=flat) -> list[torch.Tensor]:
            return [torch.stack([flat[k] if group[owner[k]][0] == n else eng.params[n].detach() for k in range(lo, hi)])
                    for n in names]

        dl = (eng.losses(names, make, len(flat), bound) - loss_own).abs()
        for k in range(len(group)):
            out.append(float(dl[torch.tensor([o == k for o in owner])].max()))
        tick(len(group), group[-1][0])
    return out
