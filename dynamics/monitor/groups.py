"""Gauge groups: the scale-invariant weights the equilibrium monitor watches and the rotational optimizers hold.

A group is a whole parameter or one ``[rows a:b]`` / ``[cols a:b]`` block of it, named so a person can find it;
:func:`gauge_groups` reads every spec the monitor takes (names, a mapping of blocks, a census), :func:`group_spec`
and :func:`spec_groups` carry one through a checkpoint as plain data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class GaugeGroup:
    """One scale-invariant group: a whole parameter (``axis`` None) or the block ``[start, stop)`` on ``axis``."""

    name: str
    param: str
    axis: int | None = None
    start: int = 0
    stop: int = 0

    def view(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.axis is None else t.narrow(self.axis, self.start, self.stop - self.start)


def gauge_groups(model: nn.Module, gauges: Any, *, per_block: bool = True) -> list[GaugeGroup]:
    """Normalize a gauge spec into groups.

    ``gauges``: parameter names; a mapping name -> ``[(axis, start, stop), ...]``; or a census result (anything
    with ``.tensors`` whose items have ``.name`` and ``.blocks`` with ``axis/start/stop``, e.g.
    :func:`gauge.census.census`'s).  ``per_block=False`` merges each tensor's blocks into one group
    (a union of gauges is a gauge).
    """
    params = dict(model.named_parameters())
    spec: dict[str, list[tuple[int | None, int, int]]] = {}
    if hasattr(gauges, "tensors"):
        for t in gauges.tensors:
            if t.blocks:
                spec[t.name] = [(b.axis, b.start, b.stop) for b in t.blocks]
    elif isinstance(gauges, Mapping):
        spec = {k: [tuple(b) for b in v] for k, v in gauges.items()}
    elif isinstance(gauges, Iterable) and not isinstance(gauges, str):
        spec = {n: [(None, 0, 0)] for n in gauges}
    else:
        raise ValueError("gauges must be parameter names, a mapping name -> [(axis, start, stop)], or a census")
    out = []
    for n, blocks in spec.items():
        if n not in params:
            raise ValueError(f"gauges: no parameter named {n!r} in the model")
        if all(b[0] is None for b in blocks) or (not per_block and covers(blocks, params[n].shape)):
            out.append(GaugeGroup(n, n))
            continue
        for axis, start, stop in blocks:
            word = "rows" if axis == 0 else "cols"
            out.append(GaugeGroup(f"{n}[{word} {start}:{stop}]", n, axis, start, stop))
    if not out:
        raise ValueError("gauges is empty: nothing to monitor")
    return out


def group_spec(groups: Iterable[GaugeGroup]) -> list[list[Any]]:
    """``[param, axis, start, stop]`` per group, in order (plain data a checkpoint holds, whatever it does to a
    mapping's key order); :func:`spec_groups` turns it back into the spec :func:`gauge_groups` takes."""
    return [[g.param, g.axis, g.start, g.stop] for g in groups]


def spec_groups(rows: Iterable[Iterable[Any]]) -> dict[str, list[tuple[int | None, int, int]]]:
    """The ``name -> [(axis, start, stop)]`` spec of :func:`group_spec`'s rows, in their order."""
    spec: dict[str, list[tuple[int | None, int, int]]] = {}
    for param, axis, start, stop in rows:
        spec.setdefault(param, []).append((axis, start, stop))
    return spec


def covers(blocks: list[tuple[int | None, int, int]], shape: torch.Size) -> bool:
    """Whether the blocks tile the whole tensor along one axis.  Only then is their union the whole tensor;
    merging the gauge rows of a partial gauge with its other rows would monitor a group that is no gauge."""
    axes = {b[0] for b in blocks}
    if len(axes) != 1 or None in axes:
        return False
    axis = axes.pop()
    spans = sorted((b[1], b[2]) for b in blocks)
    return spans[0][0] == 0 and spans[-1][1] == shape[axis] and all(a[1] == b[0] for a, b in pairwise(spans))


def is_empty(gauges: Any) -> bool:
    """No gauge at all in a spec :func:`gauge_groups` accepts (a census that found none, an empty list)."""
    if hasattr(gauges, "tensors"):
        return not any(t.blocks for t in gauges.tensors)
    return len(gauges) == 0 if isinstance(gauges, (Mapping, list, tuple, set)) else False


def describe_gauges(gauges: Any) -> dict[str, Any]:
    """A small JSON-ready record of where the monitored gauges came from (a census's verdicts, or given names)."""
    if not hasattr(gauges, "tensors"):
        names = list(gauges) if isinstance(gauges, (Mapping, list, tuple, set)) else []
        return {"source": "given", "gauges": [str(n) for n in names]}
    return {"source": "census",
            "gauges": [t.name for t in gauges.tensors if t.blocks and t.status == "gauge"],
            "partial": {t.name: t.partition for t in gauges.tensors if t.blocks and t.status != "gauge"},
            "partitions": {t.name: t.partition for t in gauges.tensors if t.blocks},
            "unused": [t.name for t in gauges.tensors if t.status == "unused"],
            "tolerance_float64": float(getattr(gauges, "tolerance", math.nan)),
            "loss": float(getattr(gauges, "loss", math.nan)),
            "scales": list(getattr(gauges, "scales", ()))}
