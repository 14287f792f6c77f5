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
* **block** -- one GRT block vs a dense pre-norm block as a training step: forward, backward, AdamW step;

  (these four at the text's widths as listed; ``--widths shipped``: d 128, 4 heads of 32, d_ff 512)
* **model** -- the trainer's real step (forward, cross-entropy, backward, ``clip_grad_norm_``, AdamW) of a whole
  GRT against the dense model matched in parameters, at compare's small preset and at the reference widths
  (d 256, 4 heads, d_ff 1024; 2 blocks, byte vocabulary, context 256), batch ``--tokens`` / context tokens;
* **sample** -- ``python -m lm.sample``'s generation of ``--sample-bytes`` bytes from ``"\n"`` at its default
  temperature and top-k, on the shipped GRT and dense models (context 64: the window fills and slides): the
  KV-cached sampler, the uncached one and Hugging Face ``generate`` on the same model, per byte.

Each cascade case runs the reference (explicit Givens and scale matrices; at ``--ref-tokens`` tokens, it is slow
by design), the eager backend, the fused backend, and the dense layer.  Times are medians over ``--repeats``
after ``--warmup`` untimed runs, reported per token.  "Saved" is the activation memory autograd holds between
forward and backward (unique tensor storages saved for backward, per token) -- what bounds training memory; for
the block, training memory adds parameters, gradients and the two AdamW moments.

FLOPs per token: 8 per pair per rotation stage (rotate and scale), plus for a coupled stage the features (10 per
pair) and the coupling product (:math:`2\cdot 4P\cdot P`); ``2 n_in n_out`` per dense matmul; backward = 2x
forward.  The roofline floor of a case is ``max(FLOPs / matmul rate, bytes / copy bandwidth)`` with the bytes an
implementation must move: the eager backend reads and writes every stage's activation, the fused kernels only
the cascade's input and output.

**trainer** (``--trainer``) -- whole training runs of ``python -m lm.train``, the GRT against its
parameter-matched dense model, at the shipped models' shape and at the source text's, at 1 and 2 threads
(``--trainer-parallel``: also two processes of one thread), tokens/s of the steady-state steps.

**profile** (``--profile``) -- where the trainer's step spends its time, GRT beside its dense twin, at the
``--trainer-shapes``: milliseconds per step by operator category, from ``torch.profiler``.  ``--only none`` skips
the component cases (and the roofline) to run only ``--trainer`` and/or ``--profile``.

The targets table lists every ratio with its target and its floor: the roofline's best value of the same
ratio (for a time ratio ``x dense`` the smallest it can be, for a throughput ratio the largest).  Every flag
and the ``--json`` path are checked before any work (one error line, exit 2).

Examples::

    python -m lm.bench --tokens 8192 --repeats 3 --threads 2 --json bench.json
    python -m lm.bench --trainer --trainer-parallel --only qkvo,mixer,ffn,block --tokens 8192 --repeats 3 \
        --threads 2 --json results/bench/bench.json      # the README's table (about 12 minutes on 2 idle cores)
    python -m lm.bench --profile --only none --threads 1 # where a training step's time goes (about 2 minutes)
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict

import torch

from lm.bench.cases import (
    CASES,
    WIDTHS,
    BenchConfig,
    Row,
    bench_block,
    bench_ffn,
    bench_mixer,
    bench_model,
    bench_qkvo,
    bench_sample,
    log,
    roofline,
)
from lm.bench.report import TARGETS, claims_and_floors, format_table, targets_table
from lm.bench.step_profile import format_profiles, profile_shape
from lm.bench.trainer import PARALLEL, SHAPES, SINGLE, TrainerConfig, TrainerRow, format_trainer, ratios, run_trainer
from lm.runlog import machine_description
from rmsgauge import check_output_file, claims_table, parse_dtype, write_claims_json
from rmsgauge.cli import check_choice, make_parser, run_main


def run(cfg: BenchConfig, trainer: TrainerConfig | None = None
        ) -> tuple[list[Row], dict[str, float], list[TrainerRow]]:
    """The trainer case first when ``trainer`` is given (its runs are separate processes, with their own thread
    settings), then the selected cases (``cfg.only``) in this process at ``cfg.threads``."""
    trows = run_trainer(trainer, log=log) if trainer is not None else []
    torch.set_num_threads(cfg.threads)
    rows: list[Row] = []
    if not cfg.only:  # --only none: the trainer and/or the profile alone
        return rows, {}, trows
    log("roofline: copy bandwidth and matmul rate ...")
    roof = roofline(cfg)  # every case's floor reads against it, so it is always measured
    for case, fn in (("qkvo", bench_qkvo), ("mixer", bench_mixer), ("ffn", bench_ffn), ("block", bench_block),
                     ("model", bench_model), ("sample", bench_sample)):
        if case in cfg.only:
            rows += fn(cfg, roof)
    return rows, roof, trows


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
                    "model with python -m lm.train at 1 and 2 threads (tokens/s against dense; a few minutes)")
    ap.add_argument("--trainer-parallel", action="store_true", help="with --trainer: also two processes of one "
                    "thread each (torchrun data parallel, and two independent runs at once)")
    ap.add_argument("--profile", action="store_true", help="also profile one training step of the GRT and its "
                    "dense twin at the --trainer-shapes, by operator category (lm.bench.step_profile; about 2 minutes)")
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
    log(f"{machine}; {cfg.threads} threads, {cfg.dtype}, {cfg.tokens} tokens, {cfg.repeats} repeats; load average "
         f"{os.getloadavg()[0]:.2f}")
    rows, roof, trows = run(cfg, trainer)
    profiles = []
    if args.profile:
        for shape in args.trainer_shapes_checked:
            profiles += profile_shape(shape, steps=args.profile_steps, threads=cfg.threads, log=log)
    claims, floors = claims_and_floors(rows, cfg.dtype, trows)
    if rows:
        print(format_table(rows, roof, cfg, machine))
    if profiles:
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
        log(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, work, check=check)


if __name__ == "__main__":
    sys.exit(main())
