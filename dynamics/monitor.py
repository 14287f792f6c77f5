r"""Equilibrium monitor: norms and per-step rotation angles of the gauge groups of any model and any optimizer.

Attach once; the user's loop is unchanged (it hooks ``optimizer.step`` through torch's step pre/post hooks)::

    from dynamics.monitor import EquilibriumMonitor
    mon = EquilibriumMonitor(model, opt, gauges=["blocks.0.attn.q_proj.weight"], log_path="eq.jsonl")
    for x, y in batches:
        loss = model(x, y)[1]; loss.backward(); opt.step(); opt.zero_grad()
    print(mon.table()); mon.plot("eq.png")

Per step and gauge group :math:`W_I` it records :math:`\lVert W_I\rVert`, the angle
:math:`\varphi_t = \angle(W_{I,t}, W_{I,t+1})`, the update read back from the two weights
(:math:`\nu = \lVert u\rVert^2`, :math:`u = (qW_t - W_{t+1})/\eta_{eff}`), and the predictions of the law
:func:`dynamics.optlaws.resolve` finds for the optimizer's *current* hyperparameters (read from its param group every
step, so schedules are followed): SGD, SGD with momentum, Nesterov and dampening (:mod:`dynamics.heavyball`),
AdamW, Lion and Muon (:mod:`dynamics.scalefree`), Adafactor with relative steps (no equilibrium: the angle bound),
Adam with L2 and unknown optimizers (no law: measured values only, and the reason), the :mod:`dynamics.rotational`
wrappers (their held angle and norm).

The SGD norm needs the gradient scale :math:`G^2 = \lVert g\rVert^2\lVert W\rVert^2` (scale-free for a gauge), and
Muon's its update size and correlation sum; each is the running mean over the recorded steps.  Relaxation time:
:func:`dynamics.laws.relaxation_steps` and its neighbours (exact within the random-walk model, momentum included).
Steps to equilibrium: predicted once, in :meth:`EquilibriumMonitor.summary`, by iterating the law's map from the
first recorded state (:func:`dynamics.optlaws.steps_to_equilibrium`), and measured as the first step with
:math:`|\lVert W\rVert^2/x^* - 1|` inside ``band``.

**Schedules.**  When the hyperparameters change between records, the monitor computes how far the norm trails the
moving equilibrium (:func:`dynamics.optlaws.schedule_lag`: relaxation time times the relative change of
:math:`x^*` per step) and records it as ``lag``; above ``band`` the norm cannot follow the schedule: the summary and
the table say so, and ``on_lag`` (e.g. ``lambda m: warnings.warn(m, EquilibriumLagWarning)``) is called once.

Laws: Kosson, Messmer & Jaggi, *Rotational Equilibrium*, arXiv:2305.17212; Wan et al., *Spherical Motion
Dynamics*, arXiv:2006.08419; exact forms in :mod:`dynamics.laws`.  Only torch, numpy, rmsgauge and ``dynamics``
modules are imported here, so any trainer (the project's ``lm`` included) can use it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
from torch import nn

import dynamics.laws as laws
import dynamics.optlaws as optlaws
from dynamics.optlaws import GroupStats, Law
from rmsgauge import json_safe

DEFAULT_BAND = 0.05  # "at equilibrium": squared norm within 5% of x* (the band is a reporting choice; a flag)
NO_LAW = ("none", "adam/l2", "adafactor/relative")  # labels whose note says why there is no prediction
TAIL_FRACTION = 0.25  # summary means over the last quarter of the recorded steps (the run's latest regime)


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


def optimizer_law(optimizer: torch.optim.Optimizer, group: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(law label, "", note)`` of a param group (kept for callers of the former API; see
    :func:`dynamics.optlaws.resolve`).  ``("none", "", why)`` when no law applies."""
    first = next(iter(group.get("params", [])), None)
    law = optlaws.resolve(optimizer, group, first if first is not None else torch.zeros(1, 1))
    return law.label, "", law.note


class EquilibriumMonitor:
    """Norms, rotation angles and equilibrium predictions of gauge groups, recorded from optimizer step hooks."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, gauges: Any, *,
                 log_path: str | Path | None = None, interval: int = 1, band: float = DEFAULT_BAND,
                 per_block: bool = True, on_lag: Callable[[str], None] | None = None) -> None:
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
        self._last_law: dict[str, tuple[Law, int]] = {}  # the previous record's law and step (schedule lag)
        self._lag_max: dict[str, tuple[float, int] | None] = {g.name: None for g in self.groups}
        self._lag_said = False
        self._pgroup = {}  # parameter name -> its optimizer param group (re-read every step: schedules)
        ids = {id(p): n for n, p in self.params.items()}
        for pg in optimizer.param_groups:
            for p in pg["params"]:
                if id(p) in ids:
                    self._pgroup[ids[id(p)]] = pg
        missing = sorted({g.param for g in self.groups} - set(self._pgroup))
        if missing:
            raise ValueError(f"gauges not in the optimizer's param groups: {missing}")
        self._log = Path(log_path) if log_path is not None else None
        if self._log is not None:
            self._log.parent.mkdir(parents=True, exist_ok=True)
            self._log.write_text("")
        self._handles = [optimizer.register_step_pre_hook(self._before), optimizer.register_step_post_hook(self._after)]

    # ---------------------------------------------------------------------------------------------- hooks
    def _recording(self) -> bool:
        return (self.step + 1) % self.interval == 0 or self.step == 0

    def _before(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._recording():
            return
        with torch.no_grad():
            laws_of: dict[str, Law] = {}
            for g in self.groups:
                p = self.params[g.param]
                w = g.view(p.detach()).double()
                self._prev[g.name] = w.clone()
                gr = p.grad
                self._gw[g.name] = float(g.view(gr.detach()).double().norm() * w.norm()) if gr is not None else 0.0
                if g.param not in laws_of:
                    laws_of[g.param] = optlaws.resolve(self.optimizer, self._pgroup[g.param], p)
                self._laws[g.name] = laws_of[g.param]
                if g.name not in self._first:
                    self._first[g.name] = self._first_state(g, p, w)

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
            self.history.append(self._measure())
            self._prev = {}
            if self._log is not None:
                with self._log.open("a") as f:
                    f.write(json.dumps(json_safe(self.history[-1])) + "\n")  # strict JSON: inf -> 'inf'
        self.step += 1

    def _measure(self) -> dict[str, Any]:
        self._G2_n += 1
        rec: dict[str, Any] = {"event": "equilibrium", "step": self.step + 1, "groups": {}}
        with torch.no_grad():
            for g in self.groups:
                w1 = g.view(self.params[g.param].detach()).double()
                w0 = self._prev[g.name]
                law = self._laws[g.name]
                norm, norm0 = float(w1.norm()), float(w0.norm())
                self._G2_sum[g.name] += self._gw[g.name] ** 2
                self._x0.setdefault(g.name, norm0**2)
                u = (law.q * w0 - w1) / law.lr_eff if law.lr_eff > 0 else None
                nu = float((u * u).sum()) if u is not None else None
                if u is not None:
                    self._sums[g.name][0] += nu
                    self._sums[g.name][1] += float((u * w0).sum())
                r = {"norm": norm, "angle": laws.tensor_angle(w0.cpu().numpy(), w1.cpu().numpy()), "nu": nu}
                r.update(self._predict(g, law, w1, norm0))
                r["lag"] = self._lag(g, law)
                if r.get("norm_eq") is not None and math.isfinite(r["norm_eq"]) and self._reached[g.name] is None \
                        and abs(norm * norm / r["norm_eq"] ** 2 - 1.0) <= self.band:
                    self._reached[g.name] = self.step + 1
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

    def _predict(self, g: GaugeGroup, law: Law, w1: torch.Tensor, norm0: float) -> dict[str, Any]:
        out: dict[str, Any] = {"law": law.label, "note": law.note, "lr": law.lr, "wd": law.wd}
        if law.kind == "rotational":
            pg = self._pgroup[g.param]
            out.update(angle_eq=self.optimizer.rotational_angle(pg), relax_steps=0.0, angle_rw=None,
                       norm_eq=self.optimizer.held_norm(g.param, g.axis, g.start, g.stop))
            return out
        out.update(optlaws.predict(law, self.stats(g, norm0)))
        return out

    def _lag(self, g: GaugeGroup, law: Law) -> float | None:
        prev = self._last_law.get(g.name)
        self._last_law[g.name] = (law, self.step + 1)
        if prev is None or prev[0] == law or law.kind == "rotational":
            return None
        lag = optlaws.schedule_lag(prev[0], law, self.stats(g), self.step + 1 - prev[1])
        if lag is not None and (self._lag_max[g.name] is None or lag > self._lag_max[g.name][0]):
            self._lag_max[g.name] = (lag, self.step + 1)
        if lag is not None and lag > self.band and not self._lag_said:
            self._lag_said = True
            if self.on_lag is not None:
                self.on_lag(lag_message(g.name, lag, self.step + 1, self.band))
        return lag

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
        names = [g.name for g in self.groups]
        if list(state.get("groups", [])) != names:
            raise ValueError(f"the saved monitor state is for gauge groups {list(state.get('groups', []))}, this "
                             f"monitor has {names}")
        self.step, self.history = int(state["step"]), list(state["history"])
        self._G2_sum, self._G2_n = dict(state["G2_sum"]), int(state["G2_n"])
        self._x0, self._reached = dict(state["x0"]), dict(state["reached"])
        self._sums = {k: list(v) for k, v in state.get("sums", {n: [0.0, 0.0] for n in names}).items()}
        self._first = {k: dict(v) for k, v in state.get("first", {}).items()}
        lag_max = state.get("lag_max", dict.fromkeys(names))
        self._lag_max = {k: (tuple(v) if v else None) for k, v in lag_max.items()}
        self._lag_said = bool(state.get("lag_said", False))
        # the previous record's law: the first record after a resume measures the schedule lag against it
        self._last_law = {k: (_law_from_dict(d), int(step)) for k, (d, step) in state.get("last_law", {}).items()}

    # ---------------------------------------------------------------------------------------------- results
    def detach(self) -> None:
        """Remove the optimizer hooks (the history stays)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def series(self, group: str, key: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one recorded quantity (``norm``, ``angle``, ``angle_eq``, ``norm_eq``, ``nu``)."""
        steps, vals = [], []
        for h in self.history:
            v = h["groups"][group].get(key)
            if v is not None:
                steps.append(h["step"])
                vals.append(float(v))
        return steps, vals

    def summary(self, tail_fraction: float = TAIL_FRACTION) -> dict[str, Any]:
        """Per group: first/last norm, tail-mean angle against the prediction, steps to equilibrium, schedule lag."""
        if not self.history:
            return {"steps": 0, "groups": {}}
        k = max(1, math.ceil(len(self.history) * tail_fraction))
        tail = self.history[-k:]
        per = {g.name: self._group_summary(g, [h["groups"][g.name] for h in tail]) for g in self.groups}
        out = {"steps": self.history[-1]["step"], "tail_steps": [tail[0]["step"], tail[-1]["step"]], "groups": per}
        worst = max(((r["schedule_lag_max"], n) for n, r in per.items() if r["schedule_lag_max"] is not None),
                    default=None)
        if worst is not None and worst[0] > self.band:
            out["warning"] = lag_message(worst[1], worst[0], per[worst[1]]["schedule_lag_step"], self.band)
        return out

    def _group_summary(self, g: GaugeGroup, recs: list[dict[str, Any]]) -> dict[str, Any]:
        ang = sum(r["angle"] for r in recs) / len(recs)
        eqs = [r["angle_eq"] for r in recs if r["angle_eq"] is not None]
        eq = sum(eqs) / len(eqs) if eqs else None
        rws = [r.get("angle_rw") for r in recs if r.get("angle_rw") is not None]
        rw = sum(rws) / len(rws) if rws else None
        last, law = recs[-1], self._laws.get(g.name)
        pred = optlaws.steps_to_equilibrium(law, self.stats(g), self.band) \
            if law is not None and law.kind != "rotational" else ((0.0, 0.0) if law is not None else None)
        lag = self._lag_max[g.name]
        st = self.stats(g)
        return {
            "norm_first": self.history[0]["groups"][g.name]["norm"], "norm_last": last["norm"],
            "norm_eq": last["norm_eq"], "angle_tail_mean": ang, "angle_eq": eq,
            "angle_ratio": ang / eq if eq else None, "angle_rw": rw, "rw_ratio": ang / rw if rw else None,
            "law": last["law"], "note": last.get("note", ""), "relax_steps": last["relax_steps"],
            "steps_to_eq_predicted": pred[0] if pred else None,
            "steps_to_eq_settle_predicted": pred[1] if pred else None,
            "steps_to_eq_measured": self._reached[g.name], "nu_mean": st.nu if math.isfinite(st.nu) else None,
            "nu_nominal": last.get("nu_nominal"), "G2_mean": st.G2 if math.isfinite(st.G2) else None,
            "schedule_lag_max": lag[0] if lag else None, "schedule_lag_step": lag[1] if lag else None,
        }

    def table(self) -> str:
        s = self.summary()
        hdr = (f"{'gauge group':<40} {'law':<18} {'|W| first':>10} {'|W| last':>10} {'|W|* pred':>10} "
               f"{'angle':>9} {'angle*':>9} {'ratio':>6} {'e-fold':>7} {'to eq pred':>10} {'to eq meas':>10}")
        lines = [f"equilibrium monitor: {s['steps']} steps, angle = mean over steps {s.get('tail_steps')}", hdr,
                 "-" * len(hdr)]
        for n, r in s["groups"].items():
            lines.append(f"{n[:40]:<40} {r['law'][:18]:<18} {r['norm_first']:>10.4g} {r['norm_last']:>10.4g} "
                         f"{_f(r['norm_eq']):>10} {r['angle_tail_mean']:>9.3e} {_f(r['angle_eq'], '.3e'):>9} "
                         f"{_f(r['angle_ratio'], '.3f'):>6} {_f(r['relax_steps'], '.0f'):>7} "
                         f"{_f(r['steps_to_eq_predicted'], '.0f'):>10} {_f(r['steps_to_eq_measured'], 'd'):>10}")
        notes = sorted({r["note"] for r in s["groups"].values() if r["law"] in NO_LAW})
        lines += [f"note: {m}" for m in notes]
        if "warning" in s:
            lines.append(f"warning: {s['warning']}")
        return "\n".join(lines)

    def plot(self, path: str | Path) -> None:
        """Norm and angle against step per group, predictions dashed; many groups: ratios to the predictions,
        median and 10-90% band (PNG/SVG by suffix; :func:`dynamics.monitor_plot.plot_monitor`)."""
        from dynamics.monitor_plot import plot_monitor

        plot_monitor(self, path)


def _law_to_dict(law: Law) -> dict[str, Any]:
    """Plain data (a ``weights_only`` checkpoint holds it): the law's fields, its SGD-family rule nested."""
    d = dataclasses.asdict(law)
    d["betas"] = list(law.betas)
    return d


def _law_from_dict(d: Mapping[str, Any]) -> Law:
    from dynamics.heavyball import HeavyBall

    rule = d.get("rule")
    return Law(**{**d, "rule": HeavyBall(**rule) if rule else None, "betas": tuple(d["betas"])})


def lag_message(group: str, lag: float, step: int | None, band: float) -> str:
    """One line: the schedule moves the equilibrium faster than the norm can follow."""
    return (f"the learning-rate schedule moves the equilibrium norm faster than the norm can follow: group {group} "
            f"trails it by {lag:.0%} (relaxation time x relative change of the equilibrium per step) at step {step}, "
            f"beyond the band {band:.0%}; its norm and angle are not at the predicted equilibrium")


def _f(v: Any, fmt: str = ".4g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return "inf"
    return format(v, fmt)
