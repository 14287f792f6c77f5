r"""Equilibrium monitor: the effective (angular) learning rate and the norm of every gauge group, against the laws.

Attach once; the user's loop is unchanged (it hooks ``optimizer.step`` through torch's step pre/post hooks)::

    from dynamics.monitor import EquilibriumMonitor
    mon = EquilibriumMonitor(model, opt, gauges=["blocks.0.attn.q_proj.weight"], log_path="eq.jsonl")
    for x, y in batches:
        loss = model(x, y)[1]; loss.backward(); opt.step(); opt.zero_grad()
    print(mon.table()); mon.plot("eq.png")

A scale gauge :math:`W_I` (a weight the loss sees only up to its scale) moves on a sphere: what training does to it
per step is a rotation by :math:`\varphi_t = \angle(W_{I,t}, W_{I,t+1})`, its **effective (angular) learning rate**.
Weight decay and the update balance at an equilibrium norm :math:`\lVert W\rVert^*` where the rate settles at
:math:`\varphi^*` (Kosson, Messmer & Jaggi, *Rotational Equilibrium*, arXiv:2305.17212; Wan et al., *Spherical
Motion Dynamics*, arXiv:2006.08419; exact forms in :mod:`dynamics.laws`).  Per recorded step and group the monitor
keeps :math:`\lVert W_I\rVert`, :math:`\varphi_t`, the update read back from the two weights (:math:`\nu =
\lVert u\rVert^2`, :math:`u = (qW_t - W_{t+1})/\eta_{eff}`) and the predictions of the law
:func:`dynamics.optlaws.resolve` finds for the hyperparameters of that step: SGD, SGD with momentum, Nesterov and
dampening (:mod:`dynamics.heavyball`), AdamW, Lion and Muon (:mod:`dynamics.scalefree`), Adafactor with relative
steps (no equilibrium: the angle bound), Adam with L2 and unknown optimizers (no law: measured values only, and the
reason), the :mod:`dynamics.rotational` wrappers (their held angle and norm).  The param groups are read from the
optimizer at every record, so a schedule, ``add_param_group`` or a group removed are followed.

**Schedules.**  The equilibrium moves with the learning rate: :math:`\lVert W\rVert^*(\eta_t)` is each step's own
(``norm_eq``), and the norm relaxes towards it one e-fold of :math:`\lVert W\rVert^2 - \lVert W\rVert^{*2}` per
``relax_steps`` (:func:`dynamics.laws.relaxation_steps`).  ``norm_track`` is the norm the laws predict for the run as
it went: their map stepped with each record's hyperparameters from the first recorded state, the SGD family's
second-moment map (:meth:`dynamics.heavyball.HeavyBall.moment_step`, nonlinear far from :math:`x^*`), the
scale-free laws' :math:`x' = x^* + q^2(x - x^*)` (AdamW, Lion, Muon; a fresh optimizer's first steps, while its
momentum fills, are not in it).  ``lag`` (:func:`dynamics.optlaws.schedule_lag`) is the schedule's speed, the
relaxation time times the relative change of :math:`x^*` per step; above ``band`` the norm cannot follow the
schedule, the summary and the table say so and ``on_lag`` (e.g. ``lambda m: warnings.warn(m,
EquilibriumLagWarning)``) is called once.

**Status** of a group over the tail records (the same ones the effective learning rate is averaged over):
``at equilibrium`` (the mean of :math:`\lVert W\rVert^2/\lVert W\rVert^{*2}` within ``band`` of 1, the
hyperparameters held), ``tracking the schedule`` (inside the band while they move slowly enough to follow),
``approaching`` (outside the band, the schedule slow enough, and the law's own prediction along the schedule still
outside too: the norm is relaxing towards :math:`\lVert W\rVert^*`), ``off equilibrium (the law puts it inside the
band)`` (the prediction along the schedule is inside, the measured norm is not: the law does not describe this
group), ``lagging the schedule`` (at the last record the schedule moves :math:`\lVert W\rVert^*` faster than the
norm relaxes), or why there is no prediction: ``no law (negative lr)``, ``no equilibrium (lr*wd >= 1)``, ``no
equilibrium (no weight decay)``, ``no motion (lr 0)``, ``not stepped (not in the optimizer)``, ...  A law that
cannot be evaluated never stops the training: the group records its measured values and the reason.

**The table** (:meth:`EquilibriumMonitor.table`; :data:`COLUMNS` explains each column, printed under it): a header
with the step, the band and the learning-rate range; a roll-up over the model (status counts, the median group, the
group farthest from its equilibrium); then one row per group, its name without the prefix all names share.

=================  =================================================================================================
``group``          the gauge group: a whole parameter, or its ``[rows a:b]`` / ``[cols a:b]`` block
``law``            the law that predicts it (:mod:`dynamics.optlaws`: optimizer family / decay coupling)
``eff lr``         the effective (angular) learning rate: measured rotation per step (rad), tail mean
``eff lr*``        its predicted equilibrium at each step's hyperparameters, same tail mean
``ratio``          ``eff lr / eff lr*``
``|W| first``      the group's norm before the first recorded step
``|W|``            its norm at the last record
``|W|*(lr)``       the equilibrium norm at the last record's hyperparameters (moves with the schedule)
``gap``            ``|W|`` against ``|W|*(lr)``: ``+12%``, ``-8%``, ``x6.0 above``, ``x3.1 below``
``|W| pred``       the norm the laws predict at the last record along the run's own schedule (``norm_track``)
``e-fold``         relaxation time at the last hyperparameters: steps per e-fold of the ``|W|^2`` gap
``to eq pred``     predicted step at which ``|W|^2`` enters the band around ``|W|*^2``: with constant
                   hyperparameters the law's own map from the first state
                   (:func:`dynamics.optlaws.steps_to_equilibrium`); under a schedule the step ``|W| pred`` enters
                   it, or beyond the run at the last hyperparameters
``to eq meas``     the first recorded step at which the measured ``|W|^2`` was inside that band
``status``         see above
=================  =================================================================================================

**Logs.**  ``log_path``: one strict-JSON line per record (:func:`read_records` reads them back).  A log that exists is
never truncated: a monitor resumed the documented way (a new monitor on the same path, then :meth:`load_state_dict`)
appends after a ``{"event": "resume", "step": N}`` line (where a step appears twice, the later record holds); a file
that is not a log of these gauge groups is refused when the monitor is built, and one of these groups that the
monitor does not resume is left as it is (:class:`EquilibriumLogWarning` at the first record; the records stay in
memory).  ``tensorboard``: a folder (the ``tensorboard`` package, ``pip install 'rmsgauge[monitor]'``) or a writer
with ``add_scalar``; the scalars :func:`record_scalars` names (no spaces or brackets).

Only torch, numpy, rmsgauge and ``dynamics`` modules are imported here, so any trainer (the project's ``lm``
included) can use it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import statistics
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import dynamics.laws as laws
import dynamics.optlaws as optlaws
from dynamics.optlaws import GroupStats, Law
from rmsgauge import json_safe

DEFAULT_BAND = 0.05  # "at equilibrium": squared norm within 5% of x* (the band is a reporting choice; a flag)
NO_LAW = ("none", "adam/l2", "adafactor/relative")  # labels whose note says why there is no prediction
TAIL_FRACTION = 0.25  # summary means over the last quarter of the recorded steps (the run's latest regime)
AT_EQUILIBRIUM, TRACKING, APPROACHING, LAGGING, OFF_LAW = (
    "at equilibrium", "tracking the schedule", "approaching", "lagging the schedule",
    "off equilibrium (the law puts it inside the band)")
LAW_ERRORS = (ValueError, ArithmeticError)  # what a law raises outside its domain (LinAlgError is a ValueError)
STATE_KEYS = ("groups", "step", "history", "G2_sum", "G2_n", "x0", "reached", "sums", "first", "lag_max",
              "lag_said", "last_law")
COLUMNS = (
    ("group", "the gauge group (a whole parameter or its [rows a:b] / [cols a:b] block), shared prefix dropped"),
    ("law", "the law that predicts it (optimizer family / decay coupling, dynamics.optlaws)"),
    ("eff lr", "effective (angular) learning rate: measured rotation of the group per step (rad), tail mean"),
    ("eff lr*", "its predicted equilibrium at each step's hyperparameters (same tail mean)"),
    ("ratio", "eff lr / eff lr*"),
    ("|W| first", "the group's norm before the first recorded step"),
    ("|W|", "its norm at the last record"),
    ("|W|*(lr)", "equilibrium norm at the last record's hyperparameters (it moves with the learning rate)"),
    ("gap", "|W| against |W|*(lr): +12%, -8%, x6.0 above, x3.1 below"),
    ("|W| pred", "the norm the laws predict at the last record along the run's own schedule, from |W| first"),
    ("e-fold", "relaxation time at the last hyperparameters: steps per e-fold of the |W|^2 gap"),
    ("to eq pred", "predicted step |W|^2 enters the band around |W|*^2 (constant hyperparameters: the law's map; "
                   "a schedule: when |W| pred does, or beyond the run at the last lr)"),
    ("to eq meas", "the first recorded step the measured |W|^2 was inside that band"),
    ("status", "over the tail: at equilibrium | tracking the schedule | approaching | lagging the schedule | off "
               "equilibrium (the law puts it inside the band) | why there is no prediction"),
)


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
        if all(b[0] is None for b in blocks) or (not per_block and _covers(blocks, params[n].shape)):
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


def _covers(blocks: list[tuple[int | None, int, int]], shape: torch.Size) -> bool:
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


class EquilibriumLagWarning(UserWarning):
    """The learning-rate schedule moves the equilibrium faster than the norm can follow."""


class EquilibriumLogWarning(UserWarning):
    """The monitor's log exists and this monitor did not resume it: the file is left as it is."""


def optimizer_law(optimizer: torch.optim.Optimizer, group: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(law label, "", note)`` of a param group (kept for callers of the former API; see
    :func:`dynamics.optlaws.resolve`).  ``("none", "", why)`` when no law applies."""
    first = next(iter(group.get("params", [])), None)
    law = optlaws.resolve(optimizer, group, first if first is not None else torch.zeros(1, 1))
    return law.label, "", law.note


# ------------------------------------------------------------------------------------------------ logs
def tensorboard_writer(tb: Any) -> Any:
    """``tb`` itself when it is a writer (anything with ``add_scalar``) or None; a folder: a ``SummaryWriter``."""
    if tb is None or hasattr(tb, "add_scalar"):
        return tb
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ValueError("tensorboard: the tensorboard package is not installed (pip install 'rmsgauge[monitor]'); "
                         "pass tensorboard=None to write JSON lines and CSV only") from None
    return SummaryWriter(log_dir=str(tb))


def scalar_name(group: str) -> str:
    """A group's name as a scalar name with no spaces, brackets or colons (TensorBoard, W&B and MLflow take it):
    ``model.layers.0.q_proj.weight[rows 0:8]`` -> ``model.layers.0.q_proj.weight/rows_0-8``."""
    s = group.replace("[", "/").replace("]", "").replace(":", "-").replace(" ", "_")
    return re.sub(r"[^A-Za-z0-9_./-]", "_", s)


def _ratio(a: Any, b: Any) -> float | None:
    """``a / b`` of two positive finite numbers, else None (a ratio that has a logarithm)."""
    ok = all(_finite(v) and v > 0 for v in (a, b))
    return float(a) / float(b) if ok else None


def record_scalars(rec: Mapping[str, Any], band: float = DEFAULT_BAND, *, groups: bool = True) -> dict[str, float]:
    """One record as named scalars: per group ``equilibrium/<group>/{norm, eff_lr, norm_over_eq, eff_lr_over_eq,
    norm_over_pred}`` (``groups=False`` leaves them out), and over all groups ``equilibrium/all/{eff_lr_median,
    eff_lr_over_eq_median, norm_over_eq_median, norm_over_eq_worst, at_equilibrium}`` (the worst is the group
    farthest from 1, the last the fraction of groups inside the band)."""
    out: dict[str, float] = {}
    over_eq, eff_over, eff, inside = [], [], [], []
    for name, r in rec["groups"].items():
        base = f"equilibrium/{scalar_name(name)}"
        vals = {"norm": r["norm"], "eff_lr": r["angle"], "norm_over_eq": _ratio(r["norm"], r.get("norm_eq")),
                "eff_lr_over_eq": _ratio(r["angle"], r.get("angle_eq")),
                "norm_over_pred": _ratio(r["norm"], r.get("norm_track"))}
        eff.append(r["angle"])
        if vals["norm_over_eq"] is not None:
            over_eq.append(vals["norm_over_eq"])
            inside.append(abs(vals["norm_over_eq"] ** 2 - 1.0) <= band)
        if vals["eff_lr_over_eq"] is not None:
            eff_over.append(vals["eff_lr_over_eq"])
        if groups:
            out.update({f"{base}/{k}": float(v) for k, v in vals.items() if v is not None})
    out["equilibrium/all/eff_lr_median"] = float(statistics.median(eff))
    if eff_over:
        out["equilibrium/all/eff_lr_over_eq_median"] = float(statistics.median(eff_over))
    if over_eq:
        out["equilibrium/all/norm_over_eq_median"] = float(statistics.median(over_eq))
        out["equilibrium/all/norm_over_eq_worst"] = float(max(over_eq, key=lambda v: abs(math.log(v))))
        out["equilibrium/all/at_equilibrium"] = sum(inside) / len(inside)
    return out


def _floats(x: Any) -> Any:
    """Undo :func:`rmsgauge.json_safe`'s non-finite floats (``'inf'``, ``'-inf'``, ``'nan'``)."""
    if isinstance(x, dict):
        return {k: _floats(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_floats(v) for v in x]
    return float(x) if x in ("inf", "-inf", "nan") else x


def read_records(path: str | Path, *, up_to: int | None = None) -> list[dict[str, Any]]:
    """The ``equilibrium`` records of a JSON-lines log in step order, one per step (where a resumed run recorded
    a step again, its later record), up to step ``up_to``; a line cut short by a killed writer is skipped."""
    by_step: dict[int, dict[str, Any]] = {}
    with Path(path).open() as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("event") == "equilibrium" and (up_to is None or rec["step"] <= up_to):
                by_step[int(rec["step"])] = _floats(rec)
    return [by_step[s] for s in sorted(by_step)]


def append_lines(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Append strict-JSON lines (non-finite floats as text); a file whose last line a kill cut short gets its
    newline first, so the next record is not glued to it."""
    text = "".join(json.dumps(json_safe(dict(r))) + "\n" for r in records)
    if not text:
        return
    with path.open("ab") as f:
        if f.tell() > 0:
            with path.open("rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    text = "\n" + text
        f.write(text.encode())


def _holds_data(path: Path | None) -> bool:
    return path is not None and path.exists() and path.stat().st_size > 0


# ------------------------------------------------------------------------------------------------ words
def short_names(names: list[str]) -> tuple[str, list[str]]:
    """``(prefix, names without it)``: the dotted prefix every name shares (up to its last ``.``), so what tells
    the groups apart (``[rows 0:34]`` and ``[rows 34:68]``) is never what a narrow column cuts."""
    if len(names) < 2:
        return "", list(names)
    lo, hi = min(names), max(names)  # every name shares what the first and last in sort order share
    shared = next((i for i, (a, b) in enumerate(zip(lo, hi)) if a != b), min(len(lo), len(hi)))
    cut = lo[:shared].rfind(".") + 1
    return names[0][:cut], [n[cut:] for n in names]


def gap_words(ratio: float | None) -> str:
    """A measured/predicted ratio as a person reads it: ``+12%``, ``-8%`` close to 1; ``x6.0 above``, ``x3.1
    below`` beyond a factor 1.5."""
    if ratio is None or not math.isfinite(ratio) or ratio <= 0:
        return "-"
    if 1 / 1.5 <= ratio <= 1.5:
        return f"{ratio - 1:+.0%}"
    return f"x{ratio:.1f} above" if ratio > 1 else f"x{1 / ratio:.1f} below"


def gap_phrase(ratio: float | None, ref: str) -> str:
    """``x6.0 above |W|*(lr)`` / ``+12% vs |W|*(lr)``."""
    words = gap_words(ratio)
    return f"{words} {ref}" if words.startswith("x") else f"{words} vs {ref}"


def _steps(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return "never"
    return f"{v:,.0f}"


def _f(v: Any, fmt: str = ".4g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return "inf"
    return format(v, fmt)


def _one_line(e: BaseException) -> str:
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


# ------------------------------------------------------------------------------------------------ monitor
class EquilibriumMonitor:
    """Effective learning rate, norm and equilibrium predictions of gauge groups, recorded from optimizer step hooks
    (see the module docstring: statuses, schedules, logs, the table's columns)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, gauges: Any, *,
                 log_path: str | Path | None = None, tensorboard: Any = None, interval: int = 1,
                 band: float = DEFAULT_BAND, per_block: bool = True,
                 on_lag: Callable[[str], None] | None = None) -> None:
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"interval must be an integer in [1, inf), got {interval!r}")
        if not 0.0 < band < 1.0:
            raise ValueError(f"band must be in (0, 1), got {band!r}")
        self.model, self.optimizer = model, optimizer
        self.groups = gauge_groups(model, gauges, per_block=per_block)
        self.params = dict(model.named_parameters())
        self.interval, self.band, self.on_lag = interval, band, on_lag
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self._prev: dict[str, torch.Tensor] = {}
        self._gw: dict[str, float] = {}
        self._G2_sum: dict[str, float] = {g.name: 0.0 for g in self.groups}
        self._G2_n = 0
        self._sums: dict[str, list[float]] = {g.name: [0.0, 0.0] for g in self.groups}  # sum nu, sum <u, W>
        self._x0: dict[str, float] = {}
        self._first: dict[str, dict[str, Any]] = {}  # fresh optimizer state?, momentum moments at the first record
        self._reached: dict[str, int | None] = {g.name: None for g in self.groups}
        self._laws: dict[str, Law] = {}  # this step's law per group
        self._why: dict[str, str | None] = {}  # this step's reason for no prediction per group
        self._pg: dict[str, Mapping[str, Any] | None] = {}  # this step's param group per parameter
        self._start: dict[str, dict[str, Any]] = {}  # this step's momentum moments (the prediction's restart)
        self._last_law: dict[str, tuple[Law, int]] = {}  # the previous record's law and step (schedule lag)
        self._lag_max: dict[str, tuple[float, int] | None] = {g.name: None for g in self.groups}
        self._lag_said = False
        self._replay()
        groups_of = {id(p) for pg in optimizer.param_groups for p in pg["params"]}
        missing = sorted({g.param for g in self.groups if id(self.params[g.param]) not in groups_of})
        if missing:
            raise ValueError(f"gauges not in the optimizer's param groups: {missing}")
        self._log = Path(log_path) if log_path is not None else None
        # new | pending (the file holds a run of these groups: load_state_dict resumes it, else it is left alone)
        # | appending | refused
        self._log_state = "new"
        if _holds_data(self._log):
            found = _last_groups(self._log)
            names = [g.name for g in self.groups]
            if found != names:
                held = "no equilibrium record" if found is None else f"the records of {_brief(found)}"
                raise ValueError(f"log_path: {self._log} exists and holds {held}, not this monitor's "
                                 f"{_brief(names)}; pass a new path (an existing log is never truncated)")
            self._log_state = "pending"
        elif self._log is not None:
            self._log.parent.mkdir(parents=True, exist_ok=True)
        self.writer = tensorboard_writer(tensorboard)
        self._own_writer = self.writer is not None and self.writer is not tensorboard
        self._handles = [optimizer.register_step_pre_hook(self._before), optimizer.register_step_post_hook(self._after)]

    # ---------------------------------------------------------------------------------------------- hooks
    def _recording(self) -> bool:
        """Every ``interval``-th step, and the first step this monitor sees (its first state, ``x0``)."""
        return (self.step + 1) % self.interval == 0 or self.step == 0 or not self.history

    def _before(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._recording():
            return
        pg_of = {id(p): pg for pg in self.optimizer.param_groups for p in pg["params"]}
        with torch.no_grad():
            resolved: dict[str, tuple[Law, str | None]] = {}
            for g in self.groups:
                p = self.params[g.param]
                w = g.view(p.detach()).double()
                self._prev[g.name] = w.clone()
                gr = p.grad
                self._gw[g.name] = float(g.view(gr.detach()).double().norm() * w.norm()) if gr is not None else 0.0
                if g.param not in resolved:
                    self._pg[g.param] = pg_of.get(id(p))
                    resolved[g.param] = self._resolve(p, self._pg[g.param])
                self._laws[g.name], self._why[g.name] = resolved[g.param]
                if g.name not in self._first or self._track[g.name] is None:  # where the prediction (re)starts
                    self._start[g.name] = self._first_state(g, p, w)
                    self._first.setdefault(g.name, self._start[g.name])

    def _resolve(self, p: torch.Tensor, pg: Mapping[str, Any] | None) -> tuple[Law, str | None]:
        """The law of one parameter now, or a law that predicts nothing and why: a diagnostic never raises into
        the training step it watches."""
        if pg is None:
            return _no_law("none", "not stepped (not in the optimizer)",
                           "the parameter is in none of the optimizer's param groups: it is not stepped", math.nan, 0.0)
        raw_lr, wd = pg.get("lr"), float(pg.get("weight_decay", 0.0) or 0.0)
        lr = float(raw_lr) if raw_lr is not None else math.nan
        label = type(self.optimizer).__name__.lower()
        if raw_lr is not None and not math.isfinite(lr):
            return _no_law(label, f"no law (lr {lr})", f"the learning rate is {lr}", lr, wd)
        if lr < 0:
            return _no_law(label, "no law (negative lr)", f"the learning rate {lr:g} is negative: no law applies",
                           lr, wd)
        if lr == 0:
            return _no_law(label, "no motion (lr 0)", "the learning rate is 0: the weights do not move", lr, wd)
        try:
            law = optlaws.resolve(self.optimizer, pg, p)
        except LAW_ERRORS as e:
            return _no_law(label, f"no law ({_one_line(e)})", f"no law: {_one_line(e)}", lr, wd)
        decays = law.kind in ("adamw", "lion", "muon") or (law.kind == "heavyball" and law.rule is not None)
        if decays and lr * wd >= 1.0:
            return _no_law(law.label, "no equilibrium (lr*wd >= 1)",
                           f"lr*wd = {lr * wd:g} >= 1: each step's decay flips or zeroes the weight, no equilibrium",
                           lr, wd)
        return law, _law_why(law)

    def _first_state(self, g: GaugeGroup, p: torch.Tensor, w: torch.Tensor) -> dict[str, Any]:
        state = self.optimizer.state.get(p, {})
        buf = state.get("momentum_buffer") if isinstance(state, Mapping) else None
        out: dict[str, Any] = {"fresh": not state, "y0": 0.0, "z0": 0.0}
        if buf is not None:
            b = g.view(buf.detach()).double()
            out.update(y0=float((w * b).sum()), z0=float((b * b).sum()))
        return out

    def _after(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._prev:
            rec = self._measure()
            self.history.append(rec)
            self._prev = {}
            self._write(rec)
        self.step += 1

    def _write(self, rec: dict[str, Any]) -> None:
        if self._log is not None and self._log_state == "pending":
            self._log_state = "refused"
            warnings.warn(f"log_path: {self._log} holds an earlier run of these gauge groups and this monitor did not "
                          "resume it (load_state_dict): the file is left as it is and the records stay in memory; "
                          "pass a new log_path", EquilibriumLogWarning, stacklevel=3)
        if self._log is not None and self._log_state in ("new", "appending"):
            self._log_state = "appending"
            append_lines(self._log, [rec])
        if self.writer is not None:
            for tag, v in record_scalars(rec, self.band).items():
                self.writer.add_scalar(tag, v, rec["step"])

    def _measure(self) -> dict[str, Any]:
        self._G2_n += 1
        step = self.step + 1
        rec: dict[str, Any] = {"event": "equilibrium", "step": step, "groups": {}}
        with torch.no_grad():
            for g in self.groups:
                w1 = g.view(self.params[g.param].detach()).double()
                w0 = self._prev[g.name]
                law, why = self._laws[g.name], self._why[g.name]
                norm, norm0 = float(w1.norm()), float(w0.norm())
                self._G2_sum[g.name] += self._gw[g.name] ** 2
                self._x0.setdefault(g.name, norm0**2)
                u = (law.q * w0 - w1) / law.lr_eff if law.lr_eff > 0 else None
                nu = float((u * u).sum()) if u is not None else None
                if u is not None:
                    self._sums[g.name][0] += nu
                    self._sums[g.name][1] += float((u * w0).sum())
                r = {"norm": norm, "angle": laws.tensor_angle(w0.cpu().numpy(), w1.cpu().numpy()), "nu": nu}
                pred, why = self._predict(g, law, norm0, why)
                r.update(pred)
                r["why"] = why
                r["lag"] = self._lag(g, law, norm) if why is None else self._forget_law(g)
                self._follow(g, law, r, step, norm0)
                if r.get("norm_eq") is not None and math.isfinite(r["norm_eq"]) and self._reached[g.name] is None \
                        and abs(norm * norm / r["norm_eq"] ** 2 - 1.0) <= self.band:
                    self._reached[g.name] = step
                rec["groups"][g.name] = r
        return rec

    def stats(self, g: GaugeGroup, norm0: float = math.nan) -> GroupStats:
        """The measured statistics of one group so far (running means over the recorded steps)."""
        p = self.params[g.param]
        view = g.view(p.detach())
        n = max(self._G2_n, 1)
        first = self._first.get(g.name, {})
        return GroupStats(numel=view.numel(), rows=view.shape[0] if view.dim() else 1, shape=tuple(p.shape),
                          x0=self._x0.get(g.name, math.nan), norm0=norm0, G2=self._G2_sum[g.name] / n,
                          nu=self._sums[g.name][0] / n, uw=self._sums[g.name][1] / n,
                          fresh=bool(first.get("fresh", True)), y0=first.get("y0", 0.0), z0=first.get("z0", 0.0))

    def _predict(self, g: GaugeGroup, law: Law, norm0: float, why: str | None) -> tuple[dict[str, Any], str | None]:
        out: dict[str, Any] = {"law": law.label, "note": law.note, "lr": law.lr, "wd": law.wd, "angle_eq": None,
                               "norm_eq": None, "relax_steps": None, "angle_rw": None}
        if why is not None and law.kind == "none":
            return out, why
        try:
            with np.errstate(all="ignore"):
                if law.kind == "rotational":
                    pg = self._pg[g.param]
                    out.update(angle_eq=self.optimizer.rotational_angle(pg), relax_steps=0.0,
                               norm_eq=self.optimizer.held_norm(g.param, g.axis, g.start, g.stop))
                else:
                    out.update(optlaws.predict(law, self.stats(g, norm0)))
        except LAW_ERRORS as e:
            return {**out, "note": f"no law: {_one_line(e)}"}, f"no law ({_one_line(e)})"
        for k in ("angle_eq", "norm_eq", "relax_steps", "angle_rw"):
            v = out.get(k)
            out[k] = None if v is None or math.isnan(float(v)) else float(v)
        if why is None and out["norm_eq"] is not None and math.isinf(out["norm_eq"]):
            why = "no equilibrium (no weight decay)"
        return out, why

    def _forget_law(self, g: GaugeGroup) -> None:
        """A step without a law: the schedule's speed is measured again from the next step with one."""
        self._last_law.pop(g.name, None)

    def _lag(self, g: GaugeGroup, law: Law, norm: float) -> float | None:
        prev = self._last_law.get(g.name)
        step = self.step + 1
        self._last_law[g.name] = (law, step)
        if prev is None or prev[0] == law or law.kind == "rotational":
            return None
        try:
            with np.errstate(all="ignore"):
                lag = optlaws.schedule_lag(prev[0], law, self.stats(g), step - prev[1])
        except LAW_ERRORS:
            return None
        if lag is None or not math.isfinite(lag):
            return None
        if self._lag_max[g.name] is None or lag > self._lag_max[g.name][0]:
            self._lag_max[g.name] = (lag, step)
        if lag > self.band and not self._lag_said:
            self._lag_said = True
            if self.on_lag is not None:
                pred = self._predict(g, law, norm, None)[0]
                self.on_lag(lag_message(g.name, lag, step, self.band, relax=pred["relax_steps"],
                                        gap=_ratio(norm, pred["norm_eq"])))
        return lag

    # ------------------------------------------------------------------------------------------ schedule
    def _follow(self, g: GaugeGroup, law: Law, r: dict[str, Any], step: int, norm0: float) -> None:
        r"""``r["track"]``: the laws' second moments :math:`(X, Y, Z)` along the run's own hyperparameters, advanced
        from the previous record (or from this step's measured start where no prediction ran before it), and
        ``r["norm_track"]`` :math:`= \sqrt X`.  The SGD family iterates its own map
        (:meth:`dynamics.heavyball.HeavyBall.moment_step`, nonlinear far from :math:`X^*`); the scale-free laws'
        map is linear, :math:`X' = X^* + q^2 (X - X^*)`; a rotational wrapper holds its norm."""
        name = g.name
        prev = self._last_rec.get(name)
        self._last_rec[name] = (r, step)
        if prev is not None and (prev[0].get("lr"), prev[0].get("wd")) != (r.get("lr"), r.get("wd")):
            self._scheduled[name] = True
        r["track"] = r["norm_track"] = None
        ne, tau = r.get("norm_eq"), r.get("relax_steps")
        if r.get("why") or not (_finite(ne) and ne > 0 and _finite(tau) and tau >= 0):
            self._track[name] = None
            return
        if self._track[name] is None:
            st = self._start[name]
            self._track[name] = ([norm0 * norm0, st["y0"], st["z0"]], step - 1)
        (X, Y, Z), at = self._track[name]
        x_star = ne * ne
        if law.kind == "heavyball" and law.rule is not None:
            G2 = self.stats(g).G2
            with np.errstate(all="ignore"):
                for _ in range(step - at):
                    X, Y, Z = law.rule.moment_step(X, Y, Z, G2 / X) if X > 0 else (math.nan, Y, Z)
        else:
            X, Y, Z = x_star + (math.exp(-(step - at) / tau) if tau > 0 else 0.0) * (X - x_star), 0.0, 0.0
        if not (_finite(X) and X > 0):
            self._track[name] = None
            return
        self._track[name] = ([float(X), float(Y), float(Z)], step)
        r["track"], r["norm_track"] = [float(X), float(Y), float(Z)], math.sqrt(X)
        if self._track_reached[name] is None and abs(X / x_star - 1.0) <= self.band:
            self._track_reached[name] = step

    def _replay(self) -> None:
        """What the records hold about the schedule-following prediction, per group: its latest state, the step it
        first entered the band, whether the hyperparameters moved between records."""
        self._track: dict[str, tuple[list[float], int] | None] = {g.name: None for g in self.groups}
        self._track_reached: dict[str, int | None] = {g.name: None for g in self.groups}
        self._scheduled: dict[str, bool] = {g.name: False for g in self.groups}
        self._last_rec: dict[str, tuple[Mapping[str, Any], int]] = {}
        for h in self.history:
            for g in self.groups:
                r, prev = h["groups"][g.name], self._last_rec.get(g.name)
                if prev is not None and (prev[0].get("lr"), prev[0].get("wd")) != (r.get("lr"), r.get("wd")):
                    self._scheduled[g.name] = True
                self._last_rec[g.name] = (r, h["step"])
                track, ne = r.get("track"), r.get("norm_eq")
                self._track[g.name] = (list(track), h["step"]) if track else None
                if track and self._track_reached[g.name] is None and _finite(ne) and ne > 0 \
                        and abs(track[0] / ne**2 - 1.0) <= self.band:
                    self._track_reached[g.name] = h["step"]

    # ---------------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """Everything the next records depend on (plain data: a ``weights_only`` checkpoint holds it), so a run
        resumed from a checkpoint records what the uninterrupted run would have, and its summary covers both parts."""
        return {"groups": [g.name for g in self.groups], "step": self.step, "history": list(self.history),
                "G2_sum": dict(self._G2_sum), "G2_n": self._G2_n, "x0": dict(self._x0), "reached": dict(self._reached),
                "sums": {k: list(v) for k, v in self._sums.items()},
                "first": {k: dict(v) for k, v in self._first.items()},
                "lag_max": {k: (list(v) if v else None) for k, v in self._lag_max.items()}, "lag_said": self._lag_said,
                "last_law": {k: [_law_to_dict(law), step] for k, (law, step) in self._last_law.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`; a log that exists is this run's (it holds the state's last record):
        the records that follow are appended after a ``resume`` line."""
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise ValueError(f"monitor state: missing key {missing[0]!r} (EquilibriumMonitor.state_dict() writes "
                             f"{', '.join(STATE_KEYS)})")
        names = [g.name for g in self.groups]
        if list(state["groups"]) != names:
            raise ValueError(f"the saved monitor state is for gauge groups {_brief(list(state['groups']))}, this "
                             f"monitor has {_brief(names)}")
        history = list(state["history"])
        if self._log_state == "pending" and history:
            last = int(history[-1]["step"])
            if last not in {r["step"] for r in read_records(self._log, up_to=last)}:
                raise ValueError(f"log_path: {self._log} holds no record of step {last}, this state's last: it is not "
                                 "this run's log; pass the run's own log or a new path")
        self.step, self.history = int(state["step"]), history
        self._G2_sum, self._G2_n = dict(state["G2_sum"]), int(state["G2_n"])
        self._x0, self._reached = dict(state["x0"]), dict(state["reached"])
        self._sums = {k: list(v) for k, v in state["sums"].items()}
        self._first = {k: dict(v) for k, v in state["first"].items()}
        self._lag_max = {k: (tuple(v) if v else None) for k, v in state["lag_max"].items()}
        self._lag_said = bool(state["lag_said"])
        # the previous record's law: the first record after a resume measures the schedule lag against it
        self._last_law = {k: (_law_from_dict(d), int(step)) for k, (d, step) in state["last_law"].items()}
        self._replay()
        if self._log is not None and self._log_state in ("pending", "new") and _holds_data(self._log):
            append_lines(self._log, [{"event": "resume", "step": self.step}])
            self._log_state = "appending"

    # ---------------------------------------------------------------------------------------------- results
    def detach(self) -> None:
        """Remove the optimizer hooks (the history stays); flush the TensorBoard writer (close one made here)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self.writer is not None and hasattr(self.writer, "flush"):
            self.writer.flush()
        if self._own_writer and hasattr(self.writer, "close"):
            self.writer.close()
            self.writer, self._own_writer = None, False

    def series(self, group: str, key: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one recorded quantity (``norm``, ``angle``, ``angle_eq``, ``norm_eq``,
        ``norm_track``, ``nu``, ``lag``)."""
        steps, vals = [], []
        for h in self.history:
            v = h["groups"][group].get(key)
            if v is not None:
                steps.append(h["step"])
                vals.append(float(v))
        return steps, vals

    def summary(self, tail_fraction: float = TAIL_FRACTION) -> dict[str, Any]:
        """Per group: first/last norm, tail-mean effective learning rate against the prediction, the equilibrium
        norm, the norm predicted along the schedule, steps to equilibrium, schedule lag, status; over the model:
        status counts, the median group and the group farthest from its equilibrium (``model``)."""
        if not self.history:
            return {"steps": 0, "groups": {}}
        k = max(1, math.ceil(len(self.history) * tail_fraction))
        tail = self.history[-k:]
        per = {g.name: self._group_summary(g, [h["groups"][g.name] for h in tail]) for g in self.groups}
        out = {"steps": self.history[-1]["step"], "records": len(self.history),
               "tail_steps": [tail[0]["step"], tail[-1]["step"]], "band": self.band, "groups": per,
               "model": _rollup(per)}
        worst = max(((r["schedule_lag_max"], n) for n, r in per.items() if r["schedule_lag_max"] is not None),
                    default=None)
        if worst is not None and worst[0] > self.band:
            at = per[worst[1]]["schedule_lag_step"]
            r = next((h["groups"][worst[1]] for h in reversed(self.history) if h["step"] == at), {})
            out["warning"] = lag_message(worst[1], worst[0], at, self.band, relax=r.get("relax_steps"),
                                         gap=_ratio(r.get("norm"), r.get("norm_eq")))
        return out

    def _group_summary(self, g: GaugeGroup, recs: list[dict[str, Any]]) -> dict[str, Any]:
        ang = sum(r["angle"] for r in recs) / len(recs)
        eqs = [r["angle_eq"] for r in recs if r["angle_eq"] is not None]
        eq = sum(eqs) / len(eqs) if eqs else None
        rws = [r.get("angle_rw") for r in recs if r.get("angle_rw") is not None]
        rw = sum(rws) / len(rws) if rws else None
        last, law = recs[-1], self._laws.get(g.name)
        st = self.stats(g)
        status = self._status(recs)
        scheduled = self._scheduled[g.name]
        pred = self._steps_predicted(g, law, st, last, status) if law is not None else None
        lag = self._lag_max[g.name]
        return {
            "norm_first": math.sqrt(self._x0[g.name]), "norm_last": last["norm"],
            "norm_eq": last["norm_eq"], "norm_track": last.get("norm_track"),
            "norm_gap": _ratio(last["norm"], last["norm_eq"]),
            "track_gap": _ratio(last["norm"], last.get("norm_track")),
            "angle_tail_mean": ang, "angle_eq": eq, "angle_ratio": ang / eq if eq else None, "angle_rw": rw,
            "rw_ratio": ang / rw if rw else None, "law": last["law"], "note": last.get("note", ""),
            "lr_first": self.history[0]["groups"][g.name].get("lr"), "lr_last": last.get("lr"),
            "scheduled": scheduled, "status": status, "why": last.get("why"), "relax_steps": last["relax_steps"],
            "steps_to_eq_predicted": pred[0] if pred else None,
            "steps_to_eq_settle_predicted": pred[1] if pred else None,
            "steps_to_eq_measured": self._reached[g.name], "nu_mean": st.nu if math.isfinite(st.nu) else None,
            "nu_nominal": last.get("nu_nominal"), "G2_mean": st.G2 if math.isfinite(st.G2) else None,
            "lag_last": last.get("lag"),
            "schedule_lag_max": lag[0] if lag else None, "schedule_lag_step": lag[1] if lag else None,
        }

    def _status(self, recs: list[Mapping[str, Any]]) -> str:
        """The group's state over the tail records (their mean squared norm against the equilibrium: one noisy
        record does not decide it), with the schedule's speed and the law's own prediction at the last one."""
        last = recs[-1]
        if last.get("why"):
            return str(last["why"])
        ne = last.get("norm_eq")
        if not _finite(ne) or ne <= 0:
            return "no norm prediction"
        lag = last.get("lag")
        if lag is not None and lag > self.band:
            return LAGGING
        ratios = [r["norm"] ** 2 / r["norm_eq"] ** 2 for r in recs
                  if not r.get("why") and _finite(r.get("norm_eq")) and r["norm_eq"] > 0]
        if abs(sum(ratios) / len(ratios) - 1.0) <= self.band:
            return TRACKING if lag is not None else AT_EQUILIBRIUM
        track = last.get("norm_track")
        if track is None or abs(track * track / (ne * ne) - 1.0) > self.band:
            return APPROACHING
        return OFF_LAW

    def _steps_predicted(self, g: GaugeGroup, law: Law, st: GroupStats, last: Mapping[str, Any],
                         status: str) -> tuple[float, float | None] | None:
        """Constant hyperparameters: the law's own map from the first state.  A schedule: the step the
        schedule-following prediction entered the band, else beyond the run at the last hyperparameters (none while
        the norm lags the schedule: it is not heading for this equilibrium)."""
        if not self._scheduled[g.name]:
            if law.kind == "rotational":
                return 0.0, 0.0
            if law.kind == "none":
                return None
            try:
                with np.errstate(all="ignore"):
                    return optlaws.steps_to_equilibrium(law, st, self.band)
            except LAW_ERRORS:
                return None
        if self._track_reached[g.name] is not None:
            return float(self._track_reached[g.name]), None
        track = self._track[g.name]
        if track is None or status == LAGGING or not _finite(last.get("relax_steps")):
            return None
        (X, Y, Z), at = track
        try:
            with np.errstate(all="ignore"):
                if law.kind == "heavyball" and law.rule is not None:
                    rest = law.rule.steps_to_equilibrium(X, st.G2, self.band, Y, Z)[0]
                else:
                    rest = laws.steps_to_equilibrium(X, last["norm_eq"] ** 2, math.exp(-1.0 / last["relax_steps"]),
                                                     self.band)
        except LAW_ERRORS:
            return None
        return (at + math.ceil(rest) if math.isfinite(rest) else math.inf), None

    def table(self, legend: bool = True) -> str:
        """The summary as text: header, the model's roll-up, one row per group, notes, warning, the columns'
        meanings (``legend``; :data:`COLUMNS`)."""
        s = self.summary()
        if not s["groups"]:
            return "equilibrium monitor: no step recorded yet"
        prefix, shown = short_names(list(s["groups"]))
        width = max(len("group"), *map(len, shown))
        lines = [f"equilibrium monitor at step {s['steps']:,} ({s['records']:,} records, every {self.interval} "
                 f"step{'s' if self.interval > 1 else ''}): eff lr = rotation per step, mean over steps "
                 f"{s['tail_steps'][0]:,}-{s['tail_steps'][1]:,}; band: |W|^2 within {self.band:.0%} of |W|*^2",
                 _schedule_line(s["groups"]), *_rollup_lines(s["model"], prefix)]
        if prefix:
            lines.append(f"shared prefix of every group name, dropped below: {prefix!r}")
        hdr = (f"{'group':<{width}} {'law':<18} {'eff lr':>9} {'eff lr*':>9} {'ratio':>6} {'|W| first':>9} "
               f"{'|W|':>9} {'|W|*(lr)':>9} {'gap':>11} {'|W| pred':>9} {'e-fold':>9} {'to eq pred':>10} "
               f"{'to eq meas':>10}  status")
        lines += [hdr, "-" * len(hdr)]
        for name, r in zip(shown, s["groups"].values()):
            lines.append(f"{name:<{width}} {r['law'][:18]:<18} {r['angle_tail_mean']:>9.3e} "
                         f"{_f(r['angle_eq'], '.3e'):>9} {_f(r['angle_ratio'], '.3f'):>6} {_f(r['norm_first']):>9} "
                         f"{r['norm_last']:>9.4g} {_f(r['norm_eq']):>9} {gap_words(r['norm_gap']):>11} "
                         f"{_f(r['norm_track']):>9} {_steps(r['relax_steps']):>9} "
                         f"{_steps(r['steps_to_eq_predicted']):>10} {_steps(r['steps_to_eq_measured']):>10}  "
                         f"{r['status']}")
        notes = sorted({r["note"] for r in s["groups"].values() if r["law"] in NO_LAW or r["why"]})
        lines += [f"note: {m}" for m in notes]
        if "warning" in s:
            lines.append(f"warning: {s['warning']}")
        if legend:
            lines.append("columns:")
            lines += [f"  {head:<11} {what}" for head, what in COLUMNS]
        return "\n".join(lines)

    def group_labels(self) -> tuple[str, list[str]]:
        """``(prefix, names)``: the groups' names without the dotted prefix they all share (:func:`short_names`)."""
        return short_names([g.name for g in self.groups])

    def plot(self, path: str | Path) -> None:
        """Norm and angle against step per group, predictions dashed; many groups: ratios to the predictions,
        median and 10-90% band (PNG/SVG by suffix; :func:`dynamics.monitor_plot.plot_monitor`)."""
        from dynamics.monitor_plot import plot_monitor

        plot_monitor(self, path)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _brief(names: list[str]) -> str:
    return f"{len(names)} groups {[*names[:3], '...'] if len(names) > 3 else names}"


def _last_groups(path: Path) -> list[str] | None:
    """The group names of a log's last ``equilibrium`` record (None when it holds none)."""
    last = None
    with path.open() as f:
        for line in f:
            if '"equilibrium"' not in line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("event") == "equilibrium":
                last = list(rec.get("groups", {}))
    return last


def _rollup(per: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Status counts, the median group (effective learning rate against its prediction, norm against its
    equilibrium) and the group farthest from its equilibrium norm."""
    counts = Counter(r["status"] for r in per.values())
    gaps = {n: r["norm_gap"] for n, r in per.items() if r["norm_gap"] is not None}
    ratios = [r["angle_ratio"] for r in per.values() if r["angle_ratio"] is not None]
    out: dict[str, Any] = {"groups": len(per), "status_counts": dict(counts.most_common()),
                           "median": {"eff_lr_ratio": statistics.median(ratios) if ratios else None,
                                      "norm_gap": statistics.median(gaps.values()) if gaps else None},
                           "worst": None}
    if gaps:
        name = max(gaps, key=lambda n: abs(math.log(gaps[n])))
        out["worst"] = {"group": name, "norm_gap": gaps[name], "status": per[name]["status"]}
    return out


def _rollup_lines(model: Mapping[str, Any], prefix: str) -> list[str]:
    counts = ", ".join(f"{k} {v}" for k, v in model["status_counts"].items())
    med, worst = model["median"], model["worst"]
    lines = [f"model, {model['groups']} groups: {counts}"]
    if med["eff_lr_ratio"] is not None or med["norm_gap"] is not None:
        lines.append(f"  median group: eff lr {gap_phrase(med['eff_lr_ratio'], 'eff lr*')}, "
                     f"|W| {gap_phrase(med['norm_gap'], '|W|*(lr)')}")
    if worst is not None:
        lines.append(f"  worst group:  {worst['group'][len(prefix):]}: |W| {gap_phrase(worst['norm_gap'], '|W|*(lr)')}"
                     f", {worst['status']}")
    return lines


def _schedule_line(per: Mapping[str, Mapping[str, Any]]) -> str:
    first = [r["lr_first"] for r in per.values() if _finite(r["lr_first"])]
    last = [r["lr_last"] for r in per.values() if _finite(r["lr_last"])]
    if not first or not last:
        return "lr: not read from the optimizer (no law reads one)"

    def span(v: list[float]) -> str:
        return f"{min(v):.3g}" if min(v) == max(v) else f"{min(v):.3g}..{max(v):.3g}"

    if not any(r["scheduled"] for r in per.values()):
        return f"lr {span(last)}, constant over the records"
    return (f"schedule: lr {span(first)} at the first record -> {span(last)} at the last; |W|*(lr) is each step's own "
            "equilibrium, |W| pred follows the lr the run had")


def _law_to_dict(law: Law) -> dict[str, Any]:
    """Plain data (a ``weights_only`` checkpoint holds it): the law's fields, its SGD-family rule nested."""
    d = dataclasses.asdict(law)
    d["betas"] = list(law.betas)
    return d


def _law_from_dict(d: Mapping[str, Any]) -> Law:
    from dynamics.heavyball import HeavyBall

    rule = d.get("rule")
    return Law(**{**d, "rule": HeavyBall(**rule) if rule else None, "betas": tuple(d["betas"])})


def lag_message(group: str, lag: float, step: int | None, band: float, *, relax: float | None = None,
                gap: float | None = None) -> str:
    """One line: the schedule moves the equilibrium faster than the norm can follow, in figures a person reads."""
    speed = ""
    if _finite(relax) and relax > 0:
        speed = (f"|W|*^2 moves {lag / relax:.2%} per step while the norm relaxes one e-fold per {relax:,.0f} steps "
                 f"(their product {lag:.3g} is above the band {band:g})")
    else:
        speed = f"relaxation time x relative change of |W|*^2 per step = {lag:.3g}, above the band {band:g}"
    where = f"; |W| is {gap_phrase(gap, '|W|*(lr)')}" if gap is not None else ""
    return (f"the learning-rate schedule moves the equilibrium norm faster than the norm can follow: group {group} "
            f"at step {step}: {speed}{where}; its norm and angle are not at the equilibrium of that step's lr")
