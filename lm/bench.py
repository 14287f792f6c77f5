r"""``python -m lm.bench``: the rotation cascade against the slow reference and against dense layers.

One run measures, on the same inputs and in the same process (ratios, not absolute times, are what
compare across runs on a shared machine):

* **roofline** (always) -- the machine's streaming copy bandwidth (a 64 MB ``Tensor.copy_``, bytes read +
  written), the same for 512 KB arrays that stay in L2 (what the fused kernels' tiles stream through),
  and its dense matmul rate (``1024 x 1024`` ``mm``);
* **qkvo** -- one head-stacked Q/K/V/O projection (4 heads x 11 stages at width 64, coupling on) vs
  ``nn.Linear(256, 256)``;
* **mixer** -- the mixer (1 stage at 256, coupling on) vs ``nn.Linear(256, 256)``;
* **ffn** -- the FFN (zero pad 256 -> 1024, 21 stages, RadialGELU, 21 stages, keep 256; coupling off) vs the
  dense ``256 -> 1024 -> 256`` FFN with GELU;
* **block** -- one GRT block (:class:`grt_model.model.GRTBlock`, the reference widths) vs a dense pre-norm
  block (:class:`lm.dense.DenseBlock`) as a training step: forward, backward, AdamW step;

  (these four at the text's widths as listed; ``--widths shipped``: d 128, 4 heads of 32, d_ff 512)
* **model** -- the trainer's real step (forward, cross-entropy, backward, ``clip_grad_norm_``, AdamW) of a whole
  GRT against the dense model matched in parameters (:func:`lm.sizing.param_matched_width`), at compare's
  small preset (:func:`lm.sizing.grt_config`) and at the reference widths (d 256, 4 heads, d_ff 1024; 2 blocks,
  byte vocabulary, context 256), batch ``--tokens`` / context tokens;
* **sample** -- ``python -m lm.sample``'s generation of ``--sample-bytes`` bytes (300, its default) from ``"\n"`` at
  its default temperature and top-k, on the shipped GRT and dense models (context 64: the window fills and slides):
  the KV-cached sampler, the uncached one (every byte re-reads the window) and Hugging Face ``generate`` on the
  same model, per byte; the target compares the cached sampler with ``generate`` on the same bytes.

Each cascade case runs the reference (explicit Givens and scale matrices, :func:`reference_cascade`;
at ``--ref-tokens`` tokens, it is slow by design), the eager backend, the fused backend, and the dense
layer.  Times are medians over ``--repeats`` after ``--warmup`` untimed runs, reported per token.
"Saved" is the activation memory autograd holds between forward and backward (unique tensor storages
saved for backward, per token) -- what bounds training memory; for the block, training memory adds
parameters, gradients and the two AdamW moments.

FLOPs per token are counted as the issue counts them: 8 per pair per rotation stage (rotate and scale),
plus for a coupled stage the features (10 per pair) and the coupling product (:math:`2\cdot 4P\cdot P`);
``2 n_in n_out`` per dense matmul; backward = 2x forward.  The roofline floor of a case is
``max(FLOPs / matmul rate, bytes / copy bandwidth)`` with the bytes an implementation must move: the
eager backend reads and writes every stage's activation (``2 W`` numbers per stage per token, forward;
twice that backward), the fused kernels only the cascade's input and output.

**trainer** (``--trainer``, :mod:`lm.bench_trainer`) -- whole training runs of ``python -m lm.train``, the GRT
against its parameter-matched dense model, at the shipped models' shape and at the source text's, at 1 and 2
threads (``--trainer-parallel``: also two processes of one thread), tokens/s of the steady-state steps.

**profile** (``--profile``, :mod:`lm.bench_profile`) -- where the trainer's step spends its time, GRT beside its
dense twin, at the ``--trainer-shapes``: milliseconds per step by operator category (fused cascades forward and
backward, fused FFN, dense GEMMs, attention, optimizer, elementwise glue, autograd), from ``torch.profiler``.
``--only none`` skips the component cases (and the roofline) to run only ``--trainer`` and/or ``--profile``.

The targets table lists every ratio with its target and its floor: the roofline's best value of the same
ratio (for a time ratio ``x dense`` the smallest it can be, for a throughput ratio the largest).  The cases
live in :mod:`lm.bench_cases` and :mod:`lm.bench_trainer`; this module is the command and its report.
Every flag and the ``--json`` path are checked before any work (one error line, exit 2).

Examples::

    python -m lm.bench --tokens 8192 --repeats 3 --threads 2 --json bench.json
    python -m lm.bench --trainer --trainer-parallel --only qkvo,mixer,ffn,block --tokens 8192 --repeats 3 \
        --threads 2 --json results/bench/bench.json      # the README's table (about 12 minutes on 2 idle cores)
    python -m lm.bench --profile --only none --threads 1 # where a training step's time goes (about 2 minutes)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import asdict
from typing import Any

import torch

from lm.bench_cases import (  # re-exported: the cases' building blocks are part of this command's interface
    CASES,
    IMPLS,
    WIDTHS,
    BenchConfig,
    Row,
    _log,
    bench_block,
    bench_ffn,
    bench_mixer,
    bench_model,
    bench_qkvo,
    bench_sample,
    cascade_flops,
    roofline,
    saved_bytes,
)
from lm.bench_trainer import PARALLEL, SHAPES, SINGLE, TrainerConfig, TrainerRow, format_trainer, ratios, run_trainer
from rmsgauge import Claim, check_output_file, claims_table, parse_dtype, write_claims_json
from rmsgauge.cli import check_choice, make_parser, run_main

__all__ = ["CASES", "IMPLS", "TARGETS", "WIDTHS", "BenchConfig", "Row", "bench_block", "bench_ffn", "bench_mixer",
           "bench_model", "bench_qkvo", "bench_sample", "cascade_flops", "claims_and_floors", "claims_from",
           "format_table", "main", "roofline", "run", "saved_bytes", "targets_table"]

# ---------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------


def _ratio(rows: list[Row], case: str, num: str, den: str, attr: str = "step_us") -> float:
    r = {x.impl: x for x in rows if x.case == case}
    if num not in r or den not in r:
        return math.nan
    return getattr(r[num], attr) / getattr(r[den], attr)


TARGETS = {  # the issues' targets (11, 21): id -> (target, "le" | "ge")
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
    """The issues' targets as claim records (``stated`` = the target, ``measured`` = this run's ratio,
    ``holds`` = the target met) and each one's floor (the roofline's best value of the ratio; nan: none)."""
    c = _Claims(dtype)
    _component_claims(c, rows)
    _sample_claims(c, rows)
    _trainer_claims(c, trainer or [])
    return c.out, c.floors


def claims_from(rows: list[Row], dtype: str, trainer: list[TrainerRow] | None = None) -> list[Claim]:
    return claims_and_floors(rows, dtype, trainer)[0]


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


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}"


def run(cfg: BenchConfig, trainer: TrainerConfig | None = None
        ) -> tuple[list[Row], dict[str, float], list[TrainerRow]]:
    """The trainer case first when ``trainer`` is given (its runs are separate processes, with their own thread
    settings), then the selected cases (``cfg.only``) in this process at ``cfg.threads``."""
    trows = run_trainer(trainer, log=_log) if trainer is not None else []
    torch.set_num_threads(cfg.threads)
    rows: list[Row] = []
    if not cfg.only:  # --only none: the trainer and/or the profile alone
        return rows, {}, trows
    _log("roofline: copy bandwidth and matmul rate ...")
    roof = roofline(cfg)  # every case's floor reads against it, so it is always measured
    for case, fn in (("qkvo", bench_qkvo), ("mixer", bench_mixer), ("ffn", bench_ffn), ("block", bench_block),
                     ("model", bench_model), ("sample", bench_sample)):
        if case in cfg.only:
            rows += fn(cfg, roof)
    return rows, roof, trows


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python -m lm.bench", __doc__)
    ap.add_argument("--tokens", type=int, default=BenchConfig.tokens, help="tokens per timed call, in [1, 2^20]")
    ap.add_argument("--ref-tokens", type=int, default=BenchConfig.ref_tokens,
                    help="tokens for the (slow) reference cascade, in [1, 256]")
    ap.add_argument("--repeats", type=int, default=BenchConfig.repeats, help="timed repetitions (median), in [1, 100]")
    ap.add_argument("--warmup", type=int, default=BenchConfig.warmup, help="untimed runs first, in [0, 10]")
    ap.add_argument("--threads", type=int, default=0, help="torch (and kernel) threads; 0: torch's default")
    ap.add_argument("--only", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}, or "
                    "none (only --trainer / --profile)")
    ap.add_argument("--widths", default="reference", help=f"widths of the cascade and block cases: "
                    f"{' or '.join(WIDTHS)} (default reference: the text's, d 256)")
    ap.add_argument("--dtype", type=parse_dtype, default="float32", help="float32 (default; how the model trains) "
                    "or float64")
    ap.add_argument("--block-seq", type=int, default=BenchConfig.block_seq, help="block benchmark sequence length")
    ap.add_argument("--sample-bytes", type=int, default=BenchConfig.sample_bytes,
                    help=f"bytes the sample case generates, in [1, 100000] (default {BenchConfig.sample_bytes})")
    ap.add_argument("--seed", type=int, default=0, help="seed of the inputs and parameters")
    ap.add_argument("--trainer", action="store_true", help="also train the GRT and its parameter-matched dense "
                    "model with python -m lm.train at 1 and 2 threads (the issue-21 targets; a few minutes)")
    ap.add_argument("--trainer-parallel", action="store_true", help="with --trainer: also two processes of one "
                    "thread each (torchrun data parallel, and two independent runs at once)")
    ap.add_argument("--profile", action="store_true", help="also profile one training step of the GRT and its "
                    "dense twin at the --trainer-shapes, by operator category (lm.bench_profile; about 2 minutes)")
    ap.add_argument("--profile-steps", type=int, default=0, help="with --profile: profiled steps per model, in "
                    "[0, 100] (default 0: the shape's trainer steps)")
    ap.add_argument("--trainer-shapes", default="shipped,text", help="with --trainer / --profile: comma-separated "
                    f"subset of {','.join(s for s in SHAPES if s != 'tiny')}")
    ap.add_argument("--trainer-steps", type=int, default=0, help="with --trainer: steady-state steps per run, in "
                    "[1, 1000] (default 0: 25 at the shipped shape, 6 at the text's)")
    ap.add_argument("--json", metavar="PATH", help="write the table, the roofline and the target claims as JSON")
    return ap


def _check_trainer(a: argparse.Namespace) -> TrainerConfig | None:
    shapes = tuple(s.strip() for s in a.trainer_shapes.split(",") if s.strip())
    if not shapes or any(s not in SHAPES for s in shapes):
        raise ValueError(f"--trainer-shapes must be a comma-separated subset of {','.join(SHAPES)}, "
                         f"got {a.trainer_shapes!r}")
    if not 0 <= a.trainer_steps <= 1000:
        raise ValueError(f"--trainer-steps must be in [0, 1000], got {a.trainer_steps}")
    a.trainer_shapes_checked = shapes
    if not a.trainer:
        if a.trainer_parallel:
            raise ValueError("--trainer-parallel needs --trainer")
        return None
    steps = {s: a.trainer_steps for s in shapes} if a.trainer_steps else {}
    return TrainerConfig(shapes, SINGLE + (PARALLEL if a.trainer_parallel else ()), steps)


def check(a: argparse.Namespace) -> tuple[BenchConfig, TrainerConfig | None]:
    """Every flag and the output path, before any work (a ``ValueError`` here: one error line, exit 2)."""
    for flag, v, lo, hi in (("--tokens", a.tokens, 1, 1 << 20), ("--ref-tokens", a.ref_tokens, 1, 256),
                            ("--repeats", a.repeats, 1, 100), ("--warmup", a.warmup, 0, 10),
                            ("--threads", a.threads, 0, 1024), ("--block-seq", a.block_seq, 1, 4096),
                            ("--sample-bytes", a.sample_bytes, 1, 100_000)):
        if not lo <= v <= hi:  # integers: the bounds printed as integers
            raise ValueError(f"{flag} must be in [{lo}, {hi}], got {v}")
    only = () if a.only.strip() == "none" else tuple(s.strip() for s in a.only.split(",") if s.strip())
    bad = [s for s in only if s not in CASES]
    if bad or (not only and a.only.strip() != "none"):
        raise ValueError(f"--only must be a comma-separated subset of {','.join(CASES)}, got {a.only!r}")
    check_choice("--widths", a.widths, WIDTHS)
    trainer = _check_trainer(a)
    if not 0 <= a.profile_steps <= 100:
        raise ValueError(f"--profile-steps must be in [0, 100], got {a.profile_steps}")
    if a.profile_steps and not a.profile:
        raise ValueError("--profile-steps needs --profile")
    if not only and trainer is None and not a.profile:
        raise ValueError("--only none leaves nothing to run: add --trainer and/or --profile")
    check_output_file("--json", a.json)
    threads = a.threads or torch.get_num_threads()
    cfg = BenchConfig(a.tokens, a.ref_tokens, a.repeats, a.warmup, threads, only, a.dtype, a.seed, a.block_seq,
                      a.widths, a.sample_bytes)
    return cfg, trainer


def work(args: argparse.Namespace, checked: tuple[BenchConfig, TrainerConfig | None]) -> int:
    cfg, trainer = checked
    machine = machine_description()
    _log(f"{machine}; {cfg.threads} threads, {cfg.dtype}, {cfg.tokens} tokens, {cfg.repeats} repeats; load average "
         f"{os.getloadavg()[0]:.2f}")
    rows, roof, trows = run(cfg, trainer)
    profiles = []
    if args.profile:
        from lm.bench_profile import profile_shape

        for shape in args.trainer_shapes_checked:
            profiles += profile_shape(shape, steps=args.profile_steps, threads=cfg.threads, log=_log)
    claims, floors = claims_and_floors(rows, cfg.dtype, trows)
    if rows:
        print(format_table(rows, roof, cfg, machine))
    if profiles:
        from lm.bench_profile import format_profiles

        print()
        print(format_profiles(profiles))
    if trows:
        print()
        print(format_trainer(trows, TARGETS["bench.trainer_shipped_vs_dense"][0]))
    if claims:
        print()
        print(targets_table(claims, floors))
        print()
        print(claims_table(claims))
    else:
        print("\nno targets measured (the step profile alone: it times, it does not judge)")
    if args.json:
        write_claims_json(args.json, claims, tool="lm.bench", machine=machine, config=asdict(cfg),
                          roofline=roof, rows=[asdict(r) for r in rows], trainer=[asdict(r) for r in trows],
                          trainer_ratios=ratios(trows), floors=floors, load_average=os.getloadavg(),
                          step_profiles=[asdict(p) for p in profiles])
        _log(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, work, check=check)


if __name__ == "__main__":
    sys.exit(main())
