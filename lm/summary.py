"""A finished run's summary as claim records and as text: the gauge census and the equilibrium it measured."""

from __future__ import annotations

import math
import statistics
from typing import Any

from lm.trainconfig import EQUILIBRIUM_FACTOR
from rmsgauge import Claim


def expected_gauges(kind: str, model_config: dict[str, Any]) -> list[str] | None:
    """The gauges the theory predicts at eps = 0: with QK-norm each dense layer's ``q_proj`` and ``k_proj`` (their
    outputs feed an RMSNorm; every other weight reaches the loss through a sum, a nonlinearity or the logits, which
    see its scale), without it none; for the GRT None (no closed prediction: the census decides)."""
    if kind != "dense":
        return None
    if not model_config.get("qk_norm", False):
        return []
    return [f"blocks.{i}.attn.{w}_proj.weight" for i in range(int(model_config["n_layers"])) for w in ("q", "k")]


def equilibrium_medians(summary: dict[str, Any]) -> dict[str, float]:
    """Medians over the monitored gauge groups of the tail-mean angle against the equilibrium prediction and
    against AdamW's random-walk angle at the current norm (nan where no group has the prediction)."""
    groups = ((summary.get("equilibrium") or {}).get("groups") or {}).values()

    def median(key: str) -> float:
        xs = [g[key] for g in groups if g.get(key) is not None]
        return statistics.median(xs) if xs else math.nan

    return {"ratio_to_eq": median("angle_ratio"), "ratio_to_rw": median("rw_ratio"), "angle_eq": median("angle_eq")}


def summary_claims(summary: dict[str, Any]) -> list[Claim]:
    """The run's two checkable statements as claim records (for ``--json``)."""
    claims = []
    found = summary.get("gauge_census") or {}
    if found.get("source") == "census":
        exp = expected_gauges(summary["model"], summary["model_config"])
        measured = sorted([*found["gauges"], *found.get("partial", {})])
        claims.append(Claim(
            id="lm.gauge_census",
            statement="The scale of a weight that feeds an RMSNorm is a gauge the loss cannot see (QK-norm: W_q, "
                      "W_k).",
            stated=exp, measured=measured, tolerance=found["tolerance_float64"],
            holds=sorted(exp) == measured if exp is not None else True,
            dtype="float64", source_status="exact" if exp is not None else "not_a_source_claim",
            exact_law=f"L(cW) = L(W) for c in {found.get('scales')} to float64 round-off at eps = 0 "
                      f"(gauge.census), and a non-radial move is visible",
            details={"partitions": found.get("partitions"), "unused": found.get("unused"),
                     "probe_loss": found.get("loss")}))
    eq = summary.get("equilibrium") or {}
    if eq.get("groups"):
        med = equilibrium_medians(summary)
        rw = med["ratio_to_rw"]
        relax = next(iter(eq["groups"].values())).get("relax_steps")
        claims.append(Claim(
            id="lm.rotational_equilibrium_angle",
            statement="A gauge weight under AdamW rotates per step by the equilibrium angle, cos phi = (q+b1)/(1+b1 q) "
                      "with q = 1 - lr wd (first order sqrt(2 lr wd (1-b1)/(1+b1)), Kosson et al. arXiv:2305.17212); "
                      "at its current norm the random-walk model predicts atan(lr sqrt(C (1-b1)/(1+b1)) / (q ||W||)).",
            stated={"angle_eq_median_over_groups": med["angle_eq"]},
            measured={"median_ratio_to_random_walk": rw, "median_ratio_to_equilibrium": med["ratio_to_eq"]},
            tolerance=EQUILIBRIUM_FACTOR,
            holds=bool(math.isfinite(rw) and 1 / EQUILIBRIUM_FACTOR <= rw <= EQUILIBRIUM_FACTOR),
            dtype=summary["dtype"], source_status="approximate",
            exact_law="random-walk model (statistical); equilibrium needs about "
                      f"{_fmt_steps(relax)} steps per e-fold of the norm at the last recorded lr "
                      f"(dynamics.laws.relaxation_steps), the run had {summary['steps']}",
            details={"tail_steps": eq.get("tail_steps"), "n_groups": len(eq["groups"])}))
    return claims


def _fmt_steps(v: Any) -> str:
    return f"{v:.0f}" if isinstance(v, (int, float)) and math.isfinite(v) else "infinitely many"


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"{s['model']} ({s['dtype']}, {s['device']}, world {s['world_size']}): step {s['steps']}/"
             f"{s['total_steps']}, {s['tokens_seen']:,} tokens, {s['tokens_per_s']:.0f} tok/s, "
             f"train {s['train_time_s']:.1f}s, wall {s['wall_time_s']:.1f}s",
             "  params: " + ", ".join(f"{k} {v:,}" for k, v in s["params"].items())]
    at = s.get("final_val_step")
    val = f"{s['final_val_loss']:.4f} nats/byte = {s['final_val_bpb']:.4f} bits/byte"
    if at is None:
        lines.append("  no validation loss measured")
    elif at == s["steps"]:
        lines.append(f"  final val loss {val}")
    else:
        lines.append(f"  val loss at step {at} (the latest evaluation; the run stopped at step {s['steps']} "
                     f"before the next one): {val}")
    found = s.get("gauge_census") or {}
    if found.get("source") == "census":
        names = [*found["gauges"], *found.get("partial", {})]
        exp = expected_gauges(s["model"], s["model_config"])
        agrees = "no prediction" if exp is None else sorted(exp) == sorted(names)
        lines.append(f"  gauge census: {len(names)} gauge tensor(s)"
                     + ("" if names else ", nothing monitored") + f"; theory agrees: {agrees}")
    eq = s.get("equilibrium") or {}
    if eq.get("groups"):
        med = equilibrium_medians(s)
        lo, hi = eq["tail_steps"]
        lines.append(f"  gauge rotation (steps {lo}-{hi}): measured/equilibrium {med['ratio_to_eq']:.3f}, "
                     f"measured/random-walk-at-current-norm {med['ratio_to_rw']:.3f} (median over "
                     f"{len(eq['groups'])} tensors)")
        for n, r in list(eq["groups"].items())[:4]:
            lines.append(f"    {n}: |W| {r['norm_first']:.3f} -> {r['norm_last']:.3f} "
                         f"(eq {_num(r['norm_eq'], '.3f')}), angle {r['angle_tail_mean']:.2e} "
                         f"(eq {_num(r['angle_eq'], '.2e')}, rw {_num(r.get('angle_rw'), '.2e')})")
    return "\n".join(lines)


def _num(v: Any, fmt: str) -> str:
    """A number for the summary, ``-`` where there is no prediction (a summary read back from JSON may hold
    ``"inf"`` as text: shown as it is)."""
    if v is None:
        return "-"
    return format(v, fmt) if isinstance(v, (int, float)) else str(v)
