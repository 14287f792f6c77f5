"""The report of ``python -m lm.bench``: each measured ratio against its target as a claim record (``bench.*``,
``stated`` = the target), with its floor (the roofline's best value of the same ratio), and the tables."""

from __future__ import annotations

import math
from typing import Any

from lm.bench.cases import BenchConfig, Row
from lm.bench.trainer import TrainerRow, ratios
from rmsgauge import Claim


def _ratio(rows: list[Row], case: str, num: str, den: str, attr: str = "step_us") -> float:
    r = {x.impl: x for x in rows if x.case == case}
    if num not in r or den not in r:
        return math.nan
    return getattr(r[num], attr) / getattr(r[den], attr)


TARGETS = {  # claim id -> (target, "le": at most | "ge": at least)
    "bench.fused_vs_reference": (20.0, "ge"),
    "bench.qkvo_vs_dense": (3.5, "le"),
    "bench.mixer_vs_dense": (2.0, "le"),
    "bench.ffn_vs_dense": (0.5, "le"),
    "bench.block_step_vs_dense": (0.6, "ge"),
    "bench.model_step_vs_dense": (0.6, "ge"),
    "bench.peak_memory_vs_dense": (1.5, "le"),
    "bench.trainer_shipped_vs_dense": (0.6, "ge"),
    "bench.trainer_text_vs_dense": (0.6, "ge"),
    "bench.sample_vs_hf": (1.5, "le"),
}


def _best(rows: list[Row], case: str, impls: tuple[str, ...] = ("fused", "eager")) -> str:
    """The implementation ``"auto"`` would pick for a case: the faster of the fused and eager rows."""
    r = {x.impl: x for x in rows if x.case == case and x.impl in impls and math.isfinite(x.step_us)}
    return min(r, key=lambda k: r[k].step_us) if r else impls[0]


class _Claims:
    """Collects the target claims and, apart (``floors``: claim id -> value), the roofline's best value of each
    claim's ratio."""

    def __init__(self, dtype: str) -> None:
        self.dtype, self.out, self.floors = dtype, [], {}

    def add(self, cid: str, statement: str, measured: float, details: dict[str, Any], floor: float = math.nan
            ) -> None:
        if not math.isfinite(measured):
            return  # the case was not run (--only) or could not be (see the table's notes)
        target, sense = TARGETS[cid]
        holds = measured <= target if sense == "le" else measured >= target
        details = {k: v for k, v in details.items() if not isinstance(v, float) or math.isfinite(v)}
        self.floors[cid] = floor
        self.out.append(Claim(id=cid, statement=statement, stated=target, measured=measured, tolerance=None,
                              holds=holds, dtype=self.dtype, source_status="not_a_source_claim", details=details))


def _component_claims(c: _Claims, rows: list[Row]) -> None:
    ref_speedups = {k: _ratio(rows, k, "reference", "fused") for k in ("qkvo", "mixer")}
    finite = [v for v in ref_speedups.values() if math.isfinite(v)]
    c.add("bench.fused_vs_reference", "fused coupled cascade forward+backward at least 20x faster than the "
          "explicit-matrix reference", min(finite) if finite else math.nan, ref_speedups)
    c.add("bench.qkvo_vs_dense", "one Q/K/V/O projection (n_heads x 11 coupled stages at d_head) forward+backward "
          "at most 3.5x nn.Linear(d, d)", _ratio(rows, "qkvo", "fused", "dense"),
          {"eager": _ratio(rows, "qkvo", "eager", "dense"), "fwd": _ratio(rows, "qkvo", "fused", "dense", "fwd_us")},
          _ratio(rows, "qkvo", "fused", "dense", "floor_us"))
    mix = _best(rows, "mixer")
    c.add("bench.mixer_vs_dense", "the mixer (1 coupled stage at d) forward+backward at most 2x nn.Linear(d, d) "
          "(the faster backend)", _ratio(rows, "mixer", mix, "dense"),
          {"backend": mix, "fused": _ratio(rows, "mixer", "fused", "dense"),
           "eager": _ratio(rows, "mixer", "eager", "dense")}, _ratio(rows, "mixer", mix, "dense", "floor_us"))
    c.add("bench.ffn_vs_dense", "FFN (expand 21 + RadialGELU + contract 21 at d_ff) forward+backward at most 0.5x "
          "the dense FFN", _ratio(rows, "ffn", "fused", "dense"),
          {"fwd": _ratio(rows, "ffn", "fused", "dense", "fwd_us"), "eager": _ratio(rows, "ffn", "eager", "dense")},
          _ratio(rows, "ffn", "fused", "dense", "floor_us"))
    blk = {x.impl: x for x in rows if x.case == "block"}
    if {"grt", "dense"} <= blk.keys():
        c.add("bench.block_step_vs_dense", "GRT block training step at least 0.6x the dense block's tokens per "
              "second", blk["dense"].step_us / blk["grt"].step_us,
              {"grt_us_per_token": blk["grt"].step_us, "dense_us_per_token": blk["dense"].step_us},
              blk["dense"].floor_us / blk["grt"].floor_us)
        c.add("bench.peak_memory_vs_dense", "GRT block peak training memory per token (saved activations + params, "
              "grads, AdamW moments) at most 1.5x the dense block's", blk["grt"].saved_bytes / blk["dense"].saved_bytes,
              {"grt_bytes_per_token": blk["grt"].saved_bytes, "dense_bytes_per_token": blk["dense"].saved_bytes})
    tps, floors = {}, {}
    for case in sorted({x.case for x in rows if x.case.startswith("model-")}):
        m = {x.impl: x for x in rows if x.case == case}
        if {"grt", "dense"} <= m.keys():
            tps[case] = m["dense"].step_us / m["grt"].step_us
            floors[case] = m["dense"].floor_us / m["grt"].floor_us
    if tps:
        worst = min(tps, key=tps.get)
        c.add("bench.model_step_vs_dense", "whole-model training step (forward, backward, grad clip, AdamW) of the "
              "GRT at least 0.6x the tokens per second of the dense model matched in parameters (worst preset)",
              tps[worst], tps, floors[worst])


def _sample_claims(c: _Claims, rows: list[Row]) -> None:
    ratios, uncached = {}, {}
    for case in sorted({x.case for x in rows if x.case.startswith("sample-")}):
        r = {x.impl: x for x in rows if x.case == case}
        if {"cached", "hf"} <= r.keys() and r["hf"].extra.get("same_bytes"):
            ratios[case] = r["cached"].step_us / r["hf"].step_us
            uncached[f"{case} uncached"] = _ratio(rows, case, "uncached", "hf")
    if ratios:
        worst = max(ratios, key=ratios.get)
        c.add("bench.sample_vs_hf", "python -m lm.sample (KV cache) generates its 300 bytes, the context window "
              "filled and sliding, in at most 1.5x the time Hugging Face generate takes for the same bytes (worst "
              "model)", ratios[worst], ratios | uncached)


def _trainer_claims(c: _Claims, trainer: list[TrainerRow]) -> None:
    for shape, what in (("shipped", "the shipped shape (width 128, 4 heads, 2 blocks, d_ff 512, context 64)"),
                        ("text", "the text's shape (width 256, 4 heads, 12 blocks, d_ff 1024, context 64)")):
        qs = [q for q in ratios(trainer) if q["shape"] == shape and math.isfinite(q["ratio"])]
        single = [q for q in qs if "thread" in q["setting"]] or qs
        if not single:
            continue
        worst = min(single, key=lambda q: q["ratio"])
        c.add(f"bench.trainer_{shape}_vs_dense", f"python -m lm.train at {what}: the GRT at least 0.6x the "
              f"tokens per second of its parameter-matched dense model, at every thread count measured (worst)",
              worst["ratio"], {q["setting"]: q["ratio"] for q in qs} | {"grt_tok_s": worst["grt_tok_s"],
                                                                        "dense_tok_s": worst["dense_tok_s"]},
              worst["floor"])


def claims_and_floors(rows: list[Row], dtype: str, trainer: list[TrainerRow] | None = None
                      ) -> tuple[list[Claim], dict[str, float]]:
    """The targets as claim records (``stated`` = the target, ``measured`` = this run's ratio, ``holds`` = the
    target met) and each one's floor (the roofline's best value of the ratio; nan: none)."""
    c = _Claims(dtype)
    _component_claims(c, rows)
    _sample_claims(c, rows)
    _trainer_claims(c, trainer or [])
    return c.out, c.floors


def targets_table(claims: list[Claim], floors: dict[str, float]) -> str:
    """Every target with its measured value and its floor, the way the README's table shows them."""
    hdr = f"{'target':<34}{'goal':>9}{'measured':>10}{'floor':>8}  verdict"
    lines = [hdr, "-" * len(hdr)]
    for c in claims:
        sense = "<=" if TARGETS[c.id][1] == "le" else ">="
        fl = floors.get(c.id, math.nan)
        fl_s = f"{fl:7.2f}x" if isinstance(fl, float) and math.isfinite(fl) else f"{'-':>8}"
        lines.append(f"{c.id.removeprefix('bench.'):<34}{sense + format(c.stated, 'g') + 'x':>9}{c.measured:>9.2f}x"
                     f"{fl_s}  {'met' if c.holds else 'not met'}")
    lines.append("floor: the roofline's best value of the ratio (time ratios: lowest; throughput ratios: highest)")
    return "\n".join(lines)


def format_table(rows: list[Row], roof: dict[str, float], cfg: BenchConfig, machine: str) -> str:
    lines = [f"rotation cascade benchmark ({cfg.dtype}, {cfg.threads} threads, {cfg.widths} widths, {machine})",
             f"roofline: copy {roof.get('copy_GBps', math.nan):.1f} GB/s (DRAM), "
             f"{roof.get('l2_copy_GBps', math.nan):.1f} GB/s (L2-resident), matmul "
             f"{roof.get('matmul_GFLOPs', math.nan):.1f} GFLOP/s  (measured in this run)", ""]
    hdr = (f"{'case':<13}{'impl':<9}{'tokens':>7}{'fwd us/tok':>12}{'f+b us/tok':>12}{'x dense':>9}{'x ref':>9}"
           f"{'saved KB/tok':>13}{'fwd FLOP/tok':>14}{'floor us':>10}")
    lines += [hdr, "-" * len(hdr)]
    for r in rows:
        dense = next((x for x in rows if x.case == r.case and x.impl == "dense"), None)
        ref = next((x for x in rows if x.case == r.case and x.impl == "reference"), None)
        xd = r.step_us / dense.step_us if dense else math.nan
        xr = ref.step_us / r.step_us if ref and r.impl != "reference" else math.nan
        lines.append(f"{r.case:<13}{r.impl:<9}{r.tokens:>7}{r.fwd_us:>12.2f}{r.step_us:>12.2f}{xd:>9.2f}{xr:>9.1f}"
                     f"{r.saved_bytes / 1024:>13.2f}{r.flops:>14.3g}{r.floor_us:>10.2f}"
                     + (f"  {r.notes}" if r.notes else ""))
    lines.append("x dense: forward+backward time over the dense layer's; x ref: the reference's time over this "
                 "one's; floor: roofline floor of forward+backward")
    return "\n".join(lines)
