r"""Equilibrium monitor: norms and per-step rotation angles of the gauge groups of any model and any optimizer.

Attach once; the user's loop is unchanged (it hooks ``optimizer.step`` through torch's step pre/post hooks)::

    from dynamics.monitor import EquilibriumMonitor
    mon = EquilibriumMonitor(model, opt, gauges=["blocks.0.attn.q_proj.weight"], log_path="eq.jsonl")
    for x, y in batches:
        loss = model(x, y)[1]; loss.backward(); opt.step(); opt.zero_grad()
    print(mon.table()); mon.plot("eq.png")

Per step and gauge group :math:`W_I` it records :math:`\lVert W_I\rVert`, the angle
:math:`\varphi_t = \angle(W_{I,t}, W_{I,t+1})`, and the predictions of :mod:`dynamics.laws` for the
optimizer's *current* hyperparameters (read from its param group every step, so schedules are followed):

* ``torch.optim.SGD`` (momentum :math:`\mu`, coupled L2): :math:`\cos\varphi^* = 1-\eta\lambda/(1+\mu)`,
  norm :func:`~dynamics.laws.fixed_point_l2`;
* ``torch.optim.AdamW`` (decoupled :math:`d = \eta\lambda`): :math:`\cos\varphi^* = (q+\beta_1)/(1+\beta_1 q)`,
  norm :func:`~dynamics.laws.adamw_equilibrium_norm`;
* ``torch.optim.Adam`` without decay: angle 0, the norm grows (no equilibrium);
* the :mod:`dynamics.rotational` wrappers: their held angle from step 1 and their held norm;
* anything else (Nesterov, dampening, Adam with L2, AMSGrad, other classes): "no prediction".

The SGD norm needs the gradient scale :math:`G^2 = \lVert g\rVert^2\lVert W\rVert^2` (scale-free for a gauge),
estimated as the running mean over the recorded steps.  Steps to equilibrium: predicted from the linearized norm
map (:func:`~dynamics.laws.steps_to_equilibrium`; e-fold time :func:`~dynamics.laws.relaxation_steps`) and
measured as the first step with :math:`|\lVert W\rVert^2/x^* - 1|` inside ``band``.

Laws: Kosson, Messmer & Jaggi, *Rotational Equilibrium*, arXiv:2305.17212 (AdamW, SGDM first-order forms);
Wan et al., *Spherical Motion Dynamics*, arXiv:2006.08419 (SGD+momentum with L2); exact forms in
:mod:`dynamics.laws`.  Only torch, numpy, rmsgauge and :mod:`dynamics.laws` are imported here, so any trainer
(the project's ``lm`` included) can use it.
"""

from __future__ import annotations

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
from rmsgauge import json_safe

DEFAULT_BAND = 0.05  # "at equilibrium": squared norm within 5% of x* (the band is a reporting choice; a flag)
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


def optimizer_law(optimizer: torch.optim.Optimizer, group: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(optimizer, decay, note)`` in :mod:`dynamics.laws`' names, or ``("none", "", why)`` when no law applies."""
    if hasattr(optimizer, "rotational_angle"):
        return "rotational", "", "angle held by the rotational wrapper"
    wd = float(group.get("weight_decay", 0.0) or 0.0)
    if type(optimizer) is torch.optim.SGD:
        if group.get("nesterov") or float(group.get("dampening", 0.0)) != 0.0:
            return "none", "", "SGD with Nesterov or dampening: no closed law here"
        return ("sgdm" if float(group.get("momentum", 0.0)) > 0 else "sgd"), "l2", "torch.optim.SGD (coupled L2)"
    if type(optimizer) is torch.optim.AdamW or (type(optimizer) is torch.optim.Adam
                                                and group.get("decoupled_weight_decay", False)):
        if group.get("amsgrad"):
            return "none", "", "AMSGrad: no closed law here"
        return "adamw", "torch", "AdamW (decoupled decay lr*wd)"
    if type(optimizer) is torch.optim.Adam and wd == 0.0 and not group.get("amsgrad"):
        return "adamw", "torch", "Adam without decay: no equilibrium, the norm grows"
    return "none", "", f"{type(optimizer).__name__}: no prediction (SGD, SGD+momentum, AdamW only)"


class EquilibriumMonitor:
    """Norms, rotation angles and equilibrium predictions of gauge groups, recorded from optimizer step hooks."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, gauges: Any, *,
                 log_path: str | Path | None = None, interval: int = 1, band: float = DEFAULT_BAND,
                 per_block: bool = True) -> None:
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"interval must be an integer in [1, inf), got {interval!r}")
        if not 0.0 < band < 1.0:
            raise ValueError(f"band must be in (0, 1), got {band!r}")
        self.model, self.optimizer = model, optimizer
        self.groups = gauge_groups(model, gauges, per_block=per_block)
        self.params = dict(model.named_parameters())
        self.interval, self.band = interval, band
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self._prev: dict[str, torch.Tensor] = {}
        self._gw: dict[str, float] = {}
        self._G2_sum: dict[str, float] = {g.name: 0.0 for g in self.groups}
        self._G2_n = 0
        self._x0: dict[str, float] = {}
        self._reached: dict[str, int | None] = {g.name: None for g in self.groups}
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
            for g in self.groups:
                p = self.params[g.param]
                w = g.view(p.detach()).double()
                self._prev[g.name] = w.clone()
                gr = p.grad
                self._gw[g.name] = float(g.view(gr.detach()).double().norm() * w.norm()) if gr is not None else 0.0

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
                norm = float(w1.norm())
                self._G2_sum[g.name] += self._gw[g.name] ** 2
                self._x0.setdefault(g.name, float(w0.norm()) ** 2)
                r = {"norm": norm, "angle": laws.tensor_angle(w0.cpu().numpy(), w1.cpu().numpy())}
                r.update(self._predict(g, w1.numel(), self._G2_sum[g.name] / self._G2_n, float(w0.norm())))
                if r.get("norm_eq") is not None and math.isfinite(r["norm_eq"]) and self._reached[g.name] is None \
                        and abs(norm * norm / r["norm_eq"] ** 2 - 1.0) <= self.band:
                    self._reached[g.name] = self.step + 1
                rec["groups"][g.name] = r
        return rec

    def _predict(self, g: GaugeGroup, numel: int, G2: float, norm0: float) -> dict[str, Any]:
        pg = self._pgroup[g.param]
        kind, decay, note = optimizer_law(self.optimizer, pg)
        lr, wd = float(pg["lr"]), float(pg.get("weight_decay", 0.0) or 0.0)
        out: dict[str, Any] = {"law": kind if kind == "none" else f"{kind}/{decay}" if decay else kind,
                               "note": note, "lr": lr, "wd": wd}
        if kind == "none":
            out.update(angle_eq=None, norm_eq=None, relax_steps=None, steps_to_eq=None, angle_rw=None)
            return out
        if kind == "rotational":
            angle, norm = self.optimizer.rotational_angle(pg), self.optimizer.held_norm(g.param, g.axis, g.start)
            out.update(angle_eq=angle, norm_eq=norm, relax_steps=0.0, steps_to_eq=0.0, angle_rw=None)
            return out
        mom, betas = float(pg.get("momentum", 0.0) or 0.0), tuple(pg.get("betas", (0.9, 0.999)))
        angle = laws.equilibrium_angle(kind, decay, lr, wd, momentum=mom, betas=betas)
        norm = laws.equilibrium_norm(kind, decay, lr, wd, numel=numel, G2=G2, momentum=mom, betas=betas)
        relax = laws.relaxation_steps(kind, decay, lr, wd)
        d = lr * wd if decay == "l2" else laws.decoupled_decay(lr, wd, decay)
        factor = laws.relaxation_factor(d, "adamw" if kind == "adamw" else "sgd")
        to_eq = laws.steps_to_equilibrium(self._x0[g.name], norm * norm, factor, self.band) \
            if math.isfinite(norm) else math.inf
        # AdamW's random-walk angle at the norm the step started from: the prediction for the transient too
        # (equilibrium takes ~1/(2 lr wd) steps per e-fold, longer than short runs), None for the others
        rw = laws.random_walk_angle(lr, norm0, numel, betas[0], d) if kind == "adamw" and lr > 0 and norm0 > 0 \
            else None
        out.update(angle_eq=angle, norm_eq=norm, relax_steps=relax, steps_to_eq=to_eq, angle_rw=rw)
        return out

    # ---------------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """Everything the next records depend on (plain data: a ``weights_only`` checkpoint holds it), so a run
        resumed from a checkpoint records what the uninterrupted run would have, and its summary covers both parts."""
        return {"groups": [g.name for g in self.groups], "step": self.step, "history": list(self.history),
                "G2_sum": dict(self._G2_sum), "G2_n": self._G2_n, "x0": dict(self._x0), "reached": dict(self._reached)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        names = [g.name for g in self.groups]
        if list(state.get("groups", [])) != names:
            raise ValueError(f"the saved monitor state is for gauge groups {list(state.get('groups', []))}, this "
                             f"monitor has {names}")
        self.step, self.history = int(state["step"]), list(state["history"])
        self._G2_sum, self._G2_n = dict(state["G2_sum"]), int(state["G2_n"])
        self._x0, self._reached = dict(state["x0"]), dict(state["reached"])

    # ---------------------------------------------------------------------------------------------- results
    def detach(self) -> None:
        """Remove the optimizer hooks (the history stays)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def series(self, group: str, key: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one recorded quantity (``norm``, ``angle``, ``angle_eq``, ``norm_eq``)."""
        steps, vals = [], []
        for h in self.history:
            v = h["groups"][group].get(key)
            if v is not None:
                steps.append(h["step"])
                vals.append(float(v))
        return steps, vals

    def summary(self, tail_fraction: float = TAIL_FRACTION) -> dict[str, Any]:
        """Per group: first/last norm, tail-mean angle against the prediction, steps to equilibrium."""
        if not self.history:
            return {"steps": 0, "groups": {}}
        k = max(1, math.ceil(len(self.history) * tail_fraction))
        tail = self.history[-k:]
        per = {}
        for g in self.groups:
            recs = [h["groups"][g.name] for h in tail]
            ang = sum(r["angle"] for r in recs) / len(recs)
            eqs = [r["angle_eq"] for r in recs if r["angle_eq"] is not None]
            eq = sum(eqs) / len(eqs) if eqs else None
            rws = [r.get("angle_rw") for r in recs if r.get("angle_rw") is not None]
            rw = sum(rws) / len(rws) if rws else None
            last = recs[-1]
            per[g.name] = {
                "norm_first": self.history[0]["groups"][g.name]["norm"], "norm_last": last["norm"],
                "norm_eq": last["norm_eq"], "angle_tail_mean": ang, "angle_eq": eq,
                "angle_ratio": ang / eq if eq else None, "angle_rw": rw, "rw_ratio": ang / rw if rw else None,
                "law": last["law"], "relax_steps": last["relax_steps"],
                "steps_to_eq_predicted": last["steps_to_eq"], "steps_to_eq_measured": self._reached[g.name],
            }
        return {"steps": self.history[-1]["step"], "tail_steps": [tail[0]["step"], tail[-1]["step"]], "groups": per}

    def table(self) -> str:
        s = self.summary()
        hdr = (f"{'gauge group':<44} {'law':<12} {'|W| first':>10} {'|W| last':>10} {'|W|* pred':>10} "
               f"{'angle':>9} {'angle*':>9} {'ratio':>6} {'e-fold':>7} {'to eq pred':>10} {'to eq meas':>10}")
        lines = [f"equilibrium monitor: {s['steps']} steps, angle = mean over steps {s.get('tail_steps')}", hdr,
                 "-" * len(hdr)]
        for n, r in s["groups"].items():
            lines.append(f"{n[:44]:<44} {r['law']:<12} {r['norm_first']:>10.4g} {r['norm_last']:>10.4g} "
                         f"{_f(r['norm_eq']):>10} {r['angle_tail_mean']:>9.3e} {_f(r['angle_eq'], '.3e'):>9} "
                         f"{_f(r['angle_ratio'], '.3f'):>6} {_f(r['relax_steps'], '.0f'):>7} "
                         f"{_f(r['steps_to_eq_predicted'], '.0f'):>10} {_f(r['steps_to_eq_measured'], 'd'):>10}")
        return "\n".join(lines)

    def plot(self, path: str | Path) -> None:
        """Norm and angle against step per group, with the predictions dashed (PNG/SVG by suffix)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.0, 4.0))
        for i, g in enumerate(self.groups):
            col = f"C{i % 10}"
            a1.plot(*self.series(g.name, "norm"), color=col, lw=1, label=g.name if i < 8 else None)
            a1.plot(*self.series(g.name, "norm_eq"), color=col, lw=1, ls="--")
            a2.plot(*self.series(g.name, "angle"), color=col, lw=0.8)
            a2.plot(*self.series(g.name, "angle_eq"), color=col, lw=1, ls="--")
        a1.set(xlabel="step", ylabel="||W_I||", title="norm (dashed: predicted equilibrium)")
        a2.set(xlabel="step", ylabel="angle per step (rad)", yscale="log", title="rotation (dashed: predicted)")
        a1.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(str(path))
        plt.close(fig)

    def as_train_hook(self) -> TrainHook:
        """An adapter for trainers that call ``on_start``, ``after_step(step)`` and ``on_end`` hooks."""
        return TrainHook(monitor=self)


class TrainHook:
    """Trainer adapter in the loop's hook protocol (``lm.hooks.StepHook``: ``on_start(model, optimizer, info)``,
    ``after_step(step, lr)``, ``on_end(summary)``, and ``state_dict`` / ``load_state_dict`` for checkpoints).

    Built on an existing monitor (:meth:`EquilibriumMonitor.as_train_hook`), or lazily with
    :meth:`TrainHook.lazy` where the gauges come from the model at start (e.g. a census on the probe batch,
    passed in by the command-line entry, so the loop itself imports nothing above it).  The monitor records from
    optimizer hooks; ``after_step`` returns the step's record or None (and appends it to ``info.log`` when the
    loop gives one), ``on_end`` adds ``summary["equilibrium"]`` (and ``summary["gauge_census"]``, where the
    gauges came from, for a lazy hook).

    A lazy hook attaches nothing where there is nothing to watch: a model with no gauges (the census found none;
    recorded, not an error) or a process that does not log (``info.is_main`` false: DDP ranks other than 0).
    """

    name = "equilibrium_monitor"

    def __init__(self, monitor: EquilibriumMonitor | None = None,
                 gauges_of: Callable[[nn.Module, Any], Any] | None = None, **monitor_kw: Any) -> None:
        self.monitor, self._gauges_of, self._kw = monitor, gauges_of, monitor_kw
        self.found: dict[str, Any] | None = None  # describe_gauges() of what gauges_of returned (lazy hooks)
        self._returned = 0
        self._log: Callable[[dict], None] | None = None
        self._pending: dict[str, Any] | None = None  # state loaded before on_start built the monitor

    @classmethod
    def lazy(cls, gauges_of: Callable[[nn.Module, Any], Any], **monitor_kw: Any) -> TrainHook:
        """A hook that builds ``EquilibriumMonitor(model, optimizer, gauges_of(model, info), **monitor_kw)``."""
        return cls(gauges_of=gauges_of, **monitor_kw)

    def on_start(self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 info: Any = None, **ctx: Any) -> dict[str, Any]:
        log = getattr(info, "log", None)
        self._log = log if callable(log) else None
        if self.monitor is None and self._gauges_of is not None:
            if model is None or optimizer is None:
                raise ValueError("TrainHook.on_start needs model and optimizer when built with TrainHook.lazy")
            if not getattr(info, "is_main", True):
                return {}  # only the logging process watches: the others would compute what nobody writes
            spec = self._gauges_of(model, info)
            self.found = describe_gauges(spec)
            if not is_empty(spec):
                self.monitor = EquilibriumMonitor(model, optimizer, spec, **self._kw)
            self._say(info)
        elif self.monitor is None:
            raise ValueError("TrainHook needs a monitor or gauges_of (use TrainHook.lazy)")
        if self._pending is not None:
            self.load_state_dict(self._pending)
        self._returned = len(self.monitor.history) if self.monitor is not None else 0
        out: dict[str, Any] = {"equilibrium_groups": [g.name for g in self.monitor.groups] if self.monitor else []}
        if self.found is not None:
            out["gauge_census"] = self.found
        return out

    def _say(self, info: Any) -> None:
        message = getattr(info, "message", None)
        if not callable(message) or self.found is None:
            return
        names = self.found["gauges"] + list(self.found.get("partial", {}))
        if not names:
            message("gauge census: no gauge tensors, nothing to monitor")
            return
        shown = names if len(names) <= 4 else [*names[:4], "..."]
        tol = self.found.get("tolerance_float64")
        message(f"gauge census: {len(names)} gauge tensor(s) {shown}"
                + (f"; float64 tolerance {tol:.2e}" if isinstance(tol, float) and math.isfinite(tol) else ""))

    def after_step(self, step: int, lr: float | None = None, **ctx: Any) -> dict[str, Any] | None:
        if self.monitor is None:
            return None
        h = self.monitor.history
        new, self._returned = h[self._returned:], len(h)
        if self._log is not None:
            for rec in new:
                self._log(rec)
        return new[-1] if new else None

    def on_end(self, summary: dict[str, Any] | None = None, **ctx: Any) -> dict[str, Any]:
        if self.monitor is not None:
            self.monitor.detach()
        s = self.monitor.summary() if self.monitor is not None else {"steps": 0, "groups": {}}
        if summary is not None:
            summary["equilibrium"] = s
            if self.found is not None:
                summary["gauge_census"] = self.found
        return s

    def state_dict(self) -> dict[str, Any]:
        if self.monitor is not None:
            return self.monitor.state_dict()
        return dict(self._pending) if self._pending is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the monitor's state; before ``on_start`` (the loop restores hooks first) it waits for the monitor."""
        if not state:
            return
        if self.monitor is None:
            self._pending = dict(state)
            return
        self.monitor.load_state_dict(state)
        self._pending = None
        self._returned = len(self.monitor.history)


def _f(v: Any, fmt: str = ".4g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return "inf"
    return format(v, fmt)
