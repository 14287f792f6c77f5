r"""Equilibrium monitor: the effective (angular) learning rate and the norm of every gauge group, against the laws
(usage in the README: ``EquilibriumMonitor(model, opt, gauges, log_path=...)``, then ``table()`` and ``plot()``).

It hooks ``optimizer.step`` (torch's step pre/post hooks), so the user's loop is unchanged.  Per recorded step and
group it keeps :math:`\lVert W_I\rVert`, the rotation :math:`\varphi_t = \angle(W_{I,t}, W_{I,t+1})` (the effective
learning rate, which settles at :math:`\varphi^*` where decay and update balance at :math:`\lVert W\rVert^*`; Kosson,
Messmer & Jaggi, arXiv:2305.17212; Wan et al., arXiv:2006.08419), the update read back from the two weights
(:math:`\nu = \lVert u\rVert^2`, :math:`u = (qW_t - W_{t+1})/\eta_{eff}`) and the predictions of the law
:func:`dynamics.optlaws.resolve` finds for that step's hyperparameters (read at every record: schedules,
``add_param_group`` and removed groups are followed).

**Schedules.**  ``norm_eq`` is each step's own equilibrium; ``norm_track`` the norm the laws predict along the run,
their map stepped with each record's hyperparameters from the first recorded state (the SGD family's second-moment
map, :meth:`dynamics.heavyball.HeavyBall.moment_step`; the scale-free :math:`x' = x^* + q^2(x - x^*)`).  ``lag``
(:func:`dynamics.optlaws.schedule_lag`) above ``band`` means the norm cannot follow the schedule: the summary and
table say so and ``on_lag`` (e.g. ``lambda m: warnings.warn(m, EquilibriumLagWarning)``) is called once.

Statuses and the table: :mod:`dynamics.monitor.table`; a law that cannot be evaluated never stops the training
(:mod:`dynamics.monitor.law`); logs (``log_path``, ``tensorboard``): :mod:`dynamics.monitor.log`; ``gauges``:
:func:`dynamics.monitor.groups.gauge_groups`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import dynamics.laws as laws
import dynamics.optlaws as optlaws
from dynamics.monitor.groups import GaugeGroup, gauge_groups
from dynamics.monitor.law import LAW_ERRORS, law_from_dict, law_to_dict, one_line, resolve_law
from dynamics.monitor.log import MonitorLog, record_scalars, tensorboard_writer
from dynamics.monitor.table import (
    DEFAULT_BAND,
    LAGGING,
    brief_names,
    finite_number,
    lag_message,
    positive_ratio,
    render_table,
    rollup,
    short_names,
    tail_status,
)
from dynamics.optlaws import GroupStats, Law

TAIL_FRACTION = 0.25  # summary means over the last quarter of the recorded steps (the run's latest regime)
STATE_KEYS = ("groups", "step", "history", "G2_sum", "G2_n", "x0", "reached", "sums", "first", "lag_max",
              "lag_said", "last_law")


class EquilibriumLagWarning(UserWarning):
    """The learning-rate schedule moves the equilibrium faster than the norm can follow."""


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
        self._log = MonitorLog(Path(log_path), [g.name for g in self.groups]) if log_path is not None else None
        self.writer = tensorboard_writer(tensorboard)
        self._own_writer = self.writer is not None and self.writer is not tensorboard
        self._handles = [optimizer.register_step_pre_hook(self._before), optimizer.register_step_post_hook(self._after)]

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
                    resolved[g.param] = resolve_law(self.optimizer, p, self._pg[g.param])
                self._laws[g.name], self._why[g.name] = resolved[g.param]
                if g.name not in self._first or self._track[g.name] is None:  # where the prediction (re)starts
                    self._start[g.name] = self._first_state(g, p, w)
                    self._first.setdefault(g.name, self._start[g.name])

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
        if self._log is not None:
            self._log.append(rec)
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
                pred, why = self._predict(g, law, norm0, why)
                r = {"norm": norm, "angle": laws.tensor_angle(w0.cpu().numpy(), w1.cpu().numpy()), "nu": nu, **pred,
                     "why": why}
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
            return {**out, "note": f"no law: {one_line(e)}"}, f"no law ({one_line(e)})"
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
                                        gap=positive_ratio(norm, pred["norm_eq"])))
        return lag

    def _follow(self, g: GaugeGroup, law: Law, r: dict[str, Any], step: int, norm0: float) -> None:
        r"""``r["track"]``: the laws' second moments :math:`(X, Y, Z)` along the run's own hyperparameters, advanced
        from the previous record (or from this step's measured start where no prediction ran before it), and
        ``r["norm_track"]`` :math:`= \sqrt X`.  The SGD family iterates its own map
        (:meth:`dynamics.heavyball.HeavyBall.moment_step`, nonlinear far from :math:`X^*`); the scale-free laws'
        map is linear, :math:`X' = X^* + q^2 (X - X^*)`; a rotational wrapper holds its norm."""
        name = g.name
        self._note_hparams(name, r)
        r["track"] = r["norm_track"] = None
        ne, tau = r.get("norm_eq"), r.get("relax_steps")
        if r.get("why") or not (finite_number(ne) and ne > 0 and finite_number(tau) and tau >= 0):
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
        if not (finite_number(X) and X > 0):
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
        self._hparams: dict[str, tuple[Any, Any]] = {}  # the previous record's (lr, wd) per group
        for h in self.history:
            for g in self.groups:
                r = h["groups"][g.name]
                self._note_hparams(g.name, r)
                track, ne = r.get("track"), r.get("norm_eq")
                self._track[g.name] = (list(track), h["step"]) if track else None
                if track and self._track_reached[g.name] is None and finite_number(ne) and ne > 0 \
                        and abs(track[0] / ne**2 - 1.0) <= self.band:
                    self._track_reached[g.name] = h["step"]

    def _note_hparams(self, name: str, r: Mapping[str, Any]) -> None:
        """A record whose lr or wd differs from the group's previous one marks the group as scheduled."""
        hp = (r.get("lr"), r.get("wd"))
        if self._hparams.setdefault(name, hp) != hp:
            self._scheduled[name] = True
        self._hparams[name] = hp

    def state_dict(self) -> dict[str, Any]:
        """Everything the next records depend on (plain data: a ``weights_only`` checkpoint holds it), so a run
        resumed from a checkpoint records what the uninterrupted run would have, and its summary covers both parts."""
        return {"groups": [g.name for g in self.groups], "step": self.step, "history": list(self.history),
                "G2_sum": dict(self._G2_sum), "G2_n": self._G2_n, "x0": dict(self._x0), "reached": dict(self._reached),
                "sums": {k: list(v) for k, v in self._sums.items()},
                "first": {k: dict(v) for k, v in self._first.items()},
                "lag_max": {k: (list(v) if v else None) for k, v in self._lag_max.items()}, "lag_said": self._lag_said,
                "last_law": {k: [law_to_dict(law), step] for k, (law, step) in self._last_law.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`; a log that exists is this run's (it holds the state's last record):
        the records that follow are appended after a ``resume`` line."""
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise ValueError(f"monitor state: missing key {missing[0]!r} (EquilibriumMonitor.state_dict() writes "
                             f"{', '.join(STATE_KEYS)})")
        names = [g.name for g in self.groups]
        if list(state["groups"]) != names:
            raise ValueError(f"the saved monitor state is for gauge groups {brief_names(list(state['groups']))}, this "
                             f"monitor has {brief_names(names)}")
        history = list(state["history"])
        if self._log is not None:
            self._log.check_resume(history)
        self.step, self.history = int(state["step"]), history
        self._G2_sum, self._G2_n = dict(state["G2_sum"]), int(state["G2_n"])
        self._x0, self._reached = dict(state["x0"]), dict(state["reached"])
        self._sums = {k: list(v) for k, v in state["sums"].items()}
        self._first = {k: dict(v) for k, v in state["first"].items()}
        self._lag_max = {k: (tuple(v) if v else None) for k, v in state["lag_max"].items()}
        self._lag_said = bool(state["lag_said"])
        # the previous record's law: the first record after a resume measures the schedule lag against it
        self._last_law = {k: (law_from_dict(d), int(step)) for k, (d, step) in state["last_law"].items()}
        self._replay()
        if self._log is not None:
            self._log.resume(self.step)

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
        recorded = [h for h in self.history if h["groups"][group].get(key) is not None]
        return [h["step"] for h in recorded], [float(h["groups"][group][key]) for h in recorded]

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
               "model": rollup(per)}
        worst = max(((r["schedule_lag_max"], n) for n, r in per.items() if r["schedule_lag_max"] is not None),
                    default=None)
        if worst is not None and worst[0] > self.band:
            at = per[worst[1]]["schedule_lag_step"]
            r = next((h["groups"][worst[1]] for h in reversed(self.history) if h["step"] == at), {})
            out["warning"] = lag_message(worst[1], worst[0], at, self.band, relax=r.get("relax_steps"),
                                         gap=positive_ratio(r.get("norm"), r.get("norm_eq")))
        return out

    def _group_summary(self, g: GaugeGroup, recs: list[dict[str, Any]]) -> dict[str, Any]:
        ang = sum(r["angle"] for r in recs) / len(recs)
        eqs = [r["angle_eq"] for r in recs if r["angle_eq"] is not None]
        eq = sum(eqs) / len(eqs) if eqs else None
        rws = [r.get("angle_rw") for r in recs if r.get("angle_rw") is not None]
        rw = sum(rws) / len(rws) if rws else None
        last, law = recs[-1], self._laws.get(g.name)
        st = self.stats(g)
        status = tail_status(recs, self.band)
        scheduled = self._scheduled[g.name]
        pred = self._steps_predicted(g, law, st, last, status) if law is not None else None
        lag = self._lag_max[g.name]
        return {
            "norm_first": math.sqrt(self._x0[g.name]), "norm_last": last["norm"],
            "norm_eq": last["norm_eq"], "norm_track": last.get("norm_track"),
            "norm_gap": positive_ratio(last["norm"], last["norm_eq"]),
            "track_gap": positive_ratio(last["norm"], last.get("norm_track")),
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
        if track is None or status == LAGGING or not finite_number(last.get("relax_steps")):
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
        meanings (``legend``; :data:`dynamics.monitor.table.COLUMNS`)."""
        return render_table(self.summary(), self.interval, legend)

    def group_labels(self) -> tuple[str, list[str]]:
        """``(prefix, names)``: the groups' names without the dotted prefix they all share (:func:`short_names`)."""
        return short_names([g.name for g in self.groups])

    def plot(self, path: str | Path) -> None:
        """Norm and angle against step per group, predictions dashed; many groups: ratios to the predictions,
        median and 10-90% band (PNG/SVG by suffix; :func:`dynamics.monitor.plot.plot_monitor`)."""
        from dynamics.monitor.plot import plot_monitor

        plot_monitor(self, path)
