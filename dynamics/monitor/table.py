r"""The equilibrium monitor's words: a group's status, the roll-up over the model, the gap wording, the table text.

**Status** of a group over the tail records (the same ones the effective learning rate is averaged over):
``at equilibrium`` (the mean of :math:`\lVert W\rVert^2/\lVert W\rVert^{*2}` within ``band`` of 1, the
hyperparameters held), ``tracking the schedule`` (inside the band while they move slowly enough to follow),
``approaching`` (outside the band, the schedule slow enough, and the law's own prediction along the schedule still
outside too: the norm is relaxing towards :math:`\lVert W\rVert^*`), ``off equilibrium (the law puts it inside the
band)`` (the prediction along the schedule is inside, the measured norm is not: the law does not describe this
group), ``lagging the schedule`` (at the last record the schedule moves :math:`\lVert W\rVert^*` faster than the
norm relaxes), or why there is no prediction: ``no law (negative lr)``, ``no equilibrium (lr*wd >= 1)``, ``no
equilibrium (no weight decay)``, ``no motion (lr 0)``, ``not stepped (not in the optimizer)``, ...

**The table** (:func:`render_table` of :meth:`dynamics.monitor.EquilibriumMonitor.summary`): a header with the
step, the band and the learning-rate range; a roll-up over the model (status counts, the median group, the group
farthest from its equilibrium); one row per group, its name without the prefix all names share; then each column's
meaning (:data:`COLUMNS`).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping
from typing import Any

DEFAULT_BAND = 0.05  # "at equilibrium": squared norm within 5% of x* (the band is a reporting choice; a flag)
NO_LAW = ("none", "adam/l2", "adafactor/relative")  # labels whose note says why there is no prediction
AT_EQUILIBRIUM, TRACKING, APPROACHING, LAGGING, OFF_LAW = (
    "at equilibrium", "tracking the schedule", "approaching", "lagging the schedule",
    "off equilibrium (the law puts it inside the band)")
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


def finite_number(v: Any) -> bool:
    """A finite int or float (a bool, None or text is not)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def positive_ratio(a: Any, b: Any) -> float | None:
    """``a / b`` of two positive finite numbers, else None (a ratio that has a logarithm)."""
    ok = all(finite_number(v) and v > 0 for v in (a, b))
    return float(a) / float(b) if ok else None


def brief_names(names: list[str]) -> str:
    """``N groups [first three, '...']``: a list of group names short enough for a one-line error."""
    return f"{len(names)} groups {[*names[:3], '...'] if len(names) > 3 else names}"


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


def _f(v: Any, fmt: str = ".4g", inf: str = "inf") -> str:
    if v is None:
        return "-"
    return inf if isinstance(v, float) and not math.isfinite(v) else format(v, fmt)


def _steps(v: Any) -> str:
    return _f(v, ",.0f", "never")


def lag_message(group: str, lag: float, step: int | None, band: float, *, relax: float | None = None,
                gap: float | None = None) -> str:
    """One line: the schedule moves the equilibrium faster than the norm can follow, in figures a person reads."""
    if finite_number(relax) and relax > 0:
        speed = (f"|W|*^2 moves {lag / relax:.2%} per step while the norm relaxes one e-fold per {relax:,.0f} steps "
                 f"(their product {lag:.3g} is above the band {band:g})")
    else:
        speed = f"relaxation time x relative change of |W|*^2 per step = {lag:.3g}, above the band {band:g}"
    where = f"; |W| is {gap_phrase(gap, '|W|*(lr)')}" if gap is not None else ""
    return (f"the learning-rate schedule moves the equilibrium norm faster than the norm can follow: group {group} "
            f"at step {step}: {speed}{where}; its norm and angle are not at the equilibrium of that step's lr")


def tail_status(recs: list[Mapping[str, Any]], band: float) -> str:
    """The group's state over the tail records (their mean squared norm against the equilibrium: one noisy
    record does not decide it), with the schedule's speed and the law's own prediction at the last one."""
    last = recs[-1]
    if last.get("why"):
        return str(last["why"])
    ne = last.get("norm_eq")
    if not finite_number(ne) or ne <= 0:
        return "no norm prediction"
    lag = last.get("lag")
    if lag is not None and lag > band:
        return LAGGING
    ratios = [r["norm"] ** 2 / r["norm_eq"] ** 2 for r in recs
              if not r.get("why") and finite_number(r.get("norm_eq")) and r["norm_eq"] > 0]
    if abs(sum(ratios) / len(ratios) - 1.0) <= band:
        return TRACKING if lag is not None else AT_EQUILIBRIUM
    track = last.get("norm_track")
    if track is None or abs(track * track / (ne * ne) - 1.0) > band:
        return APPROACHING
    return OFF_LAW


def rollup(per: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
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


def render_table(s: Mapping[str, Any], interval: int, legend: bool = True) -> str:
    """A monitor's summary ``s`` as text: header, the model's roll-up, one row per group, notes, warning, the
    columns' meanings (``legend``; :data:`COLUMNS`); ``interval`` is the monitor's steps per record."""
    if not s["groups"]:
        return "equilibrium monitor: no step recorded yet"
    prefix, shown = short_names(list(s["groups"]))
    width = max(len("group"), *map(len, shown))
    lines = [f"equilibrium monitor at step {s['steps']:,} ({s['records']:,} records, every {interval} "
             f"step{'s' if interval > 1 else ''}): eff lr = rotation per step, mean over steps "
             f"{s['tail_steps'][0]:,}-{s['tail_steps'][1]:,}; band: |W|^2 within {s['band']:.0%} of |W|*^2",
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
    first = [r["lr_first"] for r in per.values() if finite_number(r["lr_first"])]
    last = [r["lr_last"] for r in per.values() if finite_number(r["lr_last"])]
    if not first or not last:
        return "lr: not read from the optimizer (no law reads one)"

    def span(v: list[float]) -> str:
        return f"{min(v):.3g}" if min(v) == max(v) else f"{min(v):.3g}..{max(v):.3g}"

    if not any(r["scheduled"] for r in per.values()):
        return f"lr {span(last)}, constant over the records"
    return (f"schedule: lr {span(first)} at the first record -> {span(last)} at the last; |W|*(lr) is each step's own "
            "equilibrium, |W| pred follows the lr the run had")
