r"""The normalization families the census recognises: what each normalizes over, and the reason text.

A normalization divides a set :math:`S` of values by a statistic of that same set, so scaling every value of
:math:`S` by :math:`c > 0` leaves its output unchanged (at :math:`\epsilon = 0`); a weight block whose outputs are
exactly the sets :math:`S` is a scale gauge (van Laarhoven 2017; Hoffer et al. 2018; Li & Arora 2019; Wan et al.
2021).  The sets, for an input of shape :math:`(N, C, *\text{positions})` (or :math:`(\dots, n)`):

=================================  ===========================================  =================================
family                             one normalized set                           the weight block it makes a gauge
=================================  ===========================================  =================================
RMSNorm (:math:`z/\sqrt{m}`)       the last dim(s) of one token                 the rows producing that dim
LayerNorm (centred)                the last dim(s) of one token                 the same (the bias: jointly only)
GroupNorm(G, C)                    C/G channels × positions of one sample       the C/G rows (filters) of a group
BatchNorm, training mode           one channel over batch × positions           each row (filter) alone
BatchNorm, eval mode               none: running statistics, an affine map      none
InstanceNorm                       one sample's channel over positions          each row (filter) alone
weight normalization               :math:`v/\lVert v\rVert` per slice of ``dim``  each slice of :math:`v`
=================================  ===========================================  =================================

Centring families (LayerNorm, GroupNorm, BatchNorm, InstanceNorm) subtract the set's mean: a bias added before
them is removed where it is constant over the set (BatchNorm, InstanceNorm: unused) and otherwise shifts the set,
so the weight alone is no gauge and the weight and its bias are one only jointly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")  # where torch and Hugging Face norms keep their epsilon


@dataclass(frozen=True)
class NormInfo:
    """One normalization module: its family, whether it centres, and whether it normalizes by batch statistics."""

    family: str  # "rms", "layer", "group", "batch", "instance", "other"
    cls: str
    centred: bool
    batch_stats: bool  # False: BatchNorm/InstanceNorm on running statistics (an affine map of its input)


def is_norm_module(m: nn.Module) -> bool:
    """Normalization-like: torch's norms or any class whose name contains ``Norm`` or ``RMS`` (RMSNorm, PearlNorm,
    a user's ``RMS``...); norms of other names and functional ones are found in the forward
    (:mod:`gauge.census.sites`)."""
    name = type(m).__name__
    return isinstance(m, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, _BatchNorm, _InstanceNorm)) or "Norm" in name or \
        "RMS" in name


def norm_info(m: nn.Module) -> NormInfo:
    name = type(m).__name__
    if isinstance(m, _BatchNorm):
        return NormInfo("batch", name, True, m.training or (m.running_mean is None and m.running_var is None))
    if isinstance(m, _InstanceNorm):
        return NormInfo("instance", name, True, m.training or not m.track_running_stats)
    if isinstance(m, nn.GroupNorm):
        return NormInfo("group", name, True, True)
    if isinstance(m, nn.RMSNorm) or "RMS" in name:
        return NormInfo("rms", name, False, True)
    if isinstance(m, nn.LayerNorm) or "LayerNorm" in name:
        return NormInfo("layer", name, True, True)
    return NormInfo("other", name, False, True)


def eps_attr(m: nn.Module) -> str | None:
    return next((a for a in EPS_ATTRS if hasattr(m, a) and (isinstance(getattr(m, a), float)
                                                           or (a == "eps" and isinstance(m, nn.RMSNorm)))), None)


def _last_dims(m: nn.Module) -> int:
    shape = getattr(m, "normalized_shape", None)
    return len(shape) if isinstance(shape, (tuple, list)) and len(shape) > 0 else 1


def rows(info: NormInfo, m: nn.Module, t: torch.Tensor) -> torch.Tensor:
    """``(R, n)``: one row per normalized set of ``t`` (the norm's input or output), ``n`` values each."""
    if info.family == "group":
        return t.reshape(t.shape[0] * m.num_groups, -1)
    if info.family == "batch":
        return t.movedim(1, 0).reshape(t.shape[1], -1)
    if info.family == "instance":
        return t.reshape(-1, math.prod(t.shape[2:]) if t.dim() >= 3 else t.shape[-1])
    return t.reshape(-1, math.prod(t.shape[t.dim() - _last_dims(m):]))


def minus_bias(info: NormInfo, m: nn.Module, y: torch.Tensor) -> torch.Tensor:
    """``y - beta`` (the gain stays: ``y = gamma * normalized``), the bias broadcast on its channel or last dims."""
    b = getattr(m, "bias", None)
    if not info.centred or not isinstance(b, torch.Tensor):
        return y
    if info.family in ("group", "batch", "instance"):
        ch = 1 if y.dim() >= 2 and not (info.family == "instance" and y.dim() == 2) else 0
        return y - b.detach().reshape([b.numel() if d == ch else 1 for d in range(y.dim())])
    return y - b.detach()


def describe(info: NormInfo, m: nn.Module, shape: torch.Size, name: str, eps: str) -> str:
    """``name (Class over n values: the set, eps=...)``, or why a norm on running statistics makes no gauge."""
    if not info.batch_stats:
        return (f"{name} ({info.cls} in eval mode: normalizes by its running statistics, an affine map that does not "
                f"move with the weight)")
    pos = math.prod(shape[2:]) if len(shape) >= 3 else 1
    where = f" × {pos} positions" if pos > 1 else ""
    if info.family == "group":
        per = int(shape[1]) // m.num_groups
        what = f"{per} channel{'s' * (per > 1)}{where} per group ({m.num_groups} groups per sample)"
        n = per * pos
    elif info.family == "batch":
        what = f"each channel over {int(shape[0])} samples{where}, training mode: batch statistics"
        n = int(shape[0]) * pos
    elif info.family == "instance":
        n = pos if len(shape) >= 3 else int(shape[-1])
        what = f"each sample's channel over its {n} positions"
    else:
        k = _last_dims(m)
        n = math.prod(shape[len(shape) - k:])
        what = "the last dim" if k == 1 else f"the last {k} dims"
        if info.family == "layer":
            b = getattr(m, "bias", None)
            what += ", centred" + ("" if isinstance(b, torch.Tensor) else ", no bias")
    return f"{name} ({info.cls} over {n} values: {what}, eps={eps})"


def weight_norm_reasons(model: nn.Module) -> dict[str, str]:
    """Parameter name -> reason, for the direction ``v`` of every weight-normalized tensor (Salimans & Kingma 2016):
    ``w = g * v / ||v||`` with ``||v||`` over every slice along ``dim`` (the whole tensor for ``dim = -1``)."""
    out: dict[str, str] = {}
    for mname, m in model.named_modules():
        pre = f"{mname}." if mname else ""
        pz = getattr(m, "parametrizations", None)
        if isinstance(pz, nn.ModuleDict):
            for tname, plist in pz.items():
                for p in plist:
                    if type(p).__name__ == "_WeightNorm":
                        v = f"{pre}parametrizations.{tname}.original1"
                        out[v] = _wn_reason("parametrizations.weight_norm", tname, plist.original1.shape, p.dim)
        for hook in m._forward_pre_hooks.values():
            if type(hook).__name__ == "WeightNorm" and hasattr(hook, "name"):
                v = getattr(m, f"{hook.name}_v", None)
                if isinstance(v, torch.Tensor):
                    out[f"{pre}{hook.name}_v"] = _wn_reason("legacy utils.weight_norm hook", hook.name, v.shape,
                                                            hook.dim)
    return out


def _wn_reason(how: str, tname: str, shape: torch.Size, dim: int) -> str:
    head = f"weight normalization ({how}): {tname} = g · v/‖v‖, ‖v‖ over"
    if dim is None or dim == -1 or len(shape) == 0:
        return f"{head} the whole tensor ({math.prod(shape)} values)"
    d = dim % len(shape)
    return f"{head} each of the {int(shape[d])} slices along dim {d} ({math.prod(shape) // int(shape[d])} values each)"
