"""python gauge.py: verify the RMSNorm scale gauge on a real model and real data.

Builds a small dense pre-norm transformer with per-head QK-norm (eps = 0), trains it a
few AdamW steps in float32 on the bundled Shakespeare corpus, copies it to float64, and
measures on a held-out batch, for W = blocks[LAYER].attn.q_proj.weight:

  gauge.forward_invariance     max |RMSNorm(x(cW)) - RMSNorm(xW)| over c in [c-min, c-max] (and in ulps)
  gauge.euler_radial_gradient  <grad_W L, W>, its size relative to ||g|| ||W||, ||g||, and ||g(cW)|| = ||g||/c
  gauge.jacobian_null_space    ||J(z) z|| (autograd and closed form): the backward pass kills the scale
  gauge.epsilon_breaking       eps > 0: predicted vs measured deviation, break scales, the eps radial law
  gauge.per_row_scaling        one neuron is not a gauge; one head's row block is
  gauge.census                 which parameter tensors are gauges, with and without QK-norm

Prints one row per claim (both precisions side by side) and the verdict last; --verbose adds each
claim's source, law and measurements, --census the per-tensor census. Exit status 0 when every claim
holds, 1 when one fails, 2 for a usage error (reported in one line before any work: the corpus is read and
its size checked, and --json may not be the corpus), 130 interrupted; --debug shows a traceback instead.
The census of any PyTorch model is the subcommand ``python -m gauge census`` (see its --help).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from gauge.checks import CLAIMS
from gauge.model import TORCH_EPS, GaugeConfig
from gauge.scope import is_power_of_two
from rmsgauge import (
    check_output_file,
    check_range,
    claims_table,
    parse_dtype,
    parse_float_list,
    run_claims,
    write_claims_json,
)
from rmsgauge.claims import Claim, verdict_line
from rmsgauge.cli import (
    add_subcommand,
    add_subcommands,
    check_outputs_against_inputs,
    make_parser,
    run_main,
    seconds_since_process_start,
)

C_LIMITS = (1e-8, 1e8)  # float32 squares of c * z stay normal numbers far inside this range


def _dtype_choice(value: str) -> str:
    if value == "both":
        return value
    try:
        return parse_dtype(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"unknown dtype {value!r}; allowed: float32, float64, both") from None


def _eps_list(value: str) -> list[float | str]:
    out: list[float | str] = []
    for item in (v.strip() for v in value.split(",")):
        if not item:
            continue
        if item == TORCH_EPS:
            out.append(TORCH_EPS)
            continue
        try:
            out.append(float(item))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected numbers or '{TORCH_EPS}', got {item!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one eps")
    return out


def build_parser() -> argparse.ArgumentParser:
    d = GaugeConfig()
    ap = make_parser("python gauge.py", __doc__, usage="%(prog)s [options] | %(prog)s census [census options]")
    subs = add_subcommands(ap, required=False)
    add_subcommand(subs, "census", "which weights of any PyTorch model are scale gauges (python -m gauge census "
                   "--help)", forward=True)
    ap.add_argument("--dtype", type=_dtype_choice, default="both",
                    help="float64, float32 or both (default: both; the model trains in float32 either way)")
    m = ap.add_argument_group("model and data")
    m.add_argument("--d-model", type=int, default=d.d_model, help=f"model width (default {d.d_model})")
    m.add_argument("--n-heads", type=int, default=d.n_heads,
                   help=f"attention heads; d-model/n-heads must be even (default {d.n_heads})")
    m.add_argument("--n-layers", type=int, default=d.n_layers, help=f"blocks (default {d.n_layers})")
    m.add_argument("--layer", type=int, default=d.layer, help=f"which block's q_proj is W (default {d.layer})")
    m.add_argument("--batch-size", type=int, default=d.batch, help=f"sequences per batch (default {d.batch})")
    m.add_argument("--seq-len", type=int, default=d.block, help=f"tokens per sequence (default {d.block})")
    m.add_argument("--train-steps", type=int, default=d.train_steps,
                   help=f"float32 AdamW steps before measuring; 0 = the initialization (default {d.train_steps})")
    m.add_argument("--lr", type=float, default=d.lr, help=f"AdamW learning rate for those steps (default {d.lr:g})")
    m.add_argument("--data", metavar="PATH", default=None,
                   help="a text file or folder, read as bytes (default: the bundled Shakespeare plays)")
    m.add_argument("--seed", type=int, default=d.seed, help=f"seed for weights and batches (default {d.seed})")
    g = ap.add_argument_group("scales and eps")
    g.add_argument("--c-min", type=float, default=d.c_min, help=f"smallest scale c (default {d.c_min:g})")
    g.add_argument("--c-max", type=float, default=d.c_max, help=f"largest scale c (default {d.c_max:g})")
    g.add_argument("--c-points", type=int, default=d.c_points,
                   help=f"log-spaced scales in [c-min, c-max] (default {d.c_points}; the source asks >= 100)")
    g.add_argument("--eps", type=_eps_list, default=list(d.eps),
                   help="comma-separated eps >= 0 for the eps-breaking study; 'torch' = torch.nn.RMSNorm's default "
                        "torch.finfo(dtype).eps (default: 1e-6,1e-5,torch)")
    g.add_argument("--census-c", type=parse_float_list, default=list(d.census_c),
                   help="scales applied to each tensor in the census and per-row checks; not 1 and not powers of "
                        "two, which scale floats exactly and would prove nothing (default: 10,0.1)")
    o = ap.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", help="also write the claim records as JSON (atomic)")
    o.add_argument("--verbose", action="store_true",
                   help="add each claim's source, law and measurements, and the census (wrapped at 100 columns)")
    o.add_argument("--census", action="store_true", help="add the per-tensor census table")
    o.add_argument("--quiet", action="store_true", help="no progress on stderr; one line per claim")
    o.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: machines are shared)")
    return ap


def config_from_args(args: argparse.Namespace) -> GaugeConfig:
    """Validate every flag and the corpus (before any work) and build the config; a ``ValueError`` names the flag
    and its range."""
    checks: list[tuple[str, float, float | None, float | None]] = [
        ("--d-model", args.d_model, 2, 4096),
        ("--n-heads", args.n_heads, 1, args.d_model),
        ("--n-layers", args.n_layers, 1, 64),
        ("--layer", args.layer, 0, args.n_layers - 1),
        ("--batch-size", args.batch_size, 1, 4096),
        ("--seq-len", args.seq_len, 2, 8192),
        ("--train-steps", args.train_steps, 0, 100_000),
        ("--seed", args.seed, 0, 2**32 - 1),
        ("--c-min", args.c_min, *C_LIMITS),
        ("--c-max", args.c_max, *C_LIMITS),
        ("--c-points", args.c_points, 2, 100_000),
        ("--threads", args.threads, 1, 256),
    ]
    for name, value, lo, hi in checks:
        check_range(name, value, lo, hi)
    check_range("--lr", args.lr, 0.0, 1.0, lo_open=True)
    if not args.c_min < args.c_max:
        raise ValueError(f"--c-max must be greater than --c-min ({args.c_min:g}), got {args.c_max:g}")
    for e in args.eps:
        if e != TORCH_EPS:
            check_range("--eps", e, 0.0, 1.0)
    for c in args.census_c:
        check_range("--census-c", c, *C_LIMITS)
        if c == 1.0:
            raise ValueError("--census-c must not contain 1 (it changes nothing), got 1")
        if is_power_of_two(c):
            raise ValueError(f"--census-c must not be a power of two (2^k scales floats exactly and proves "
                             f"nothing; e.g. 10 or 0.1), got {c:g}")
    check_output_file("--json", args.json)
    cfg = GaugeConfig(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads, batch=args.batch_size,
                      block=args.seq_len, seed=args.seed, train_steps=args.train_steps, lr=args.lr,
                      layer=args.layer, c_min=args.c_min, c_max=args.c_max, c_points=args.c_points,
                      eps=tuple(args.eps), census_c=tuple(args.census_c), corpus=args.data)
    try:
        cfg.dense_config()  # the model's own validation (divisibility, even head dim)
    except ValueError as e:
        msg = str(e)
        raise ValueError(f"--d-model/--n-heads: {msg}" if msg.startswith("DenseConfig") else msg) from None
    _check_data(args)
    return cfg


def _check_data(args: argparse.Namespace) -> None:
    """The corpus is read (as the run will read it) and both splits hold a batch window; --json is not an input."""
    from rmsgauge.corpus import ByteCorpus, corpus_files

    if args.data is None:
        return
    if args.data == "" or not Path(args.data).exists():
        raise ValueError(f"--data must be an existing text file or folder, got {args.data!r}")
    files = corpus_files(args.data)
    check_outputs_against_inputs({"--data": [args.data, *files]}, {"--json": args.json})
    try:
        corpus = ByteCorpus.load(args.data)
    except (ValueError, OSError) as e:
        raise ValueError(f"--data {args.data}: {e}") from None
    need = args.seq_len + 2
    short = [(n, len(corpus.split(n))) for n in ("train", "val") if len(corpus.split(n)) < need]
    if short:
        n, have = short[0]
        raise ValueError(f"--data {args.data}: its {n} split holds {have} bytes, fewer than --seq-len + 2 = {need} "
                         f"(a window and its next byte); use a larger corpus or a smaller --seq-len")


def census_lines(claims: list[Claim]) -> list[str]:
    """The per-tensor census, one line per tensor, read from each census record's structured details."""
    lines = []
    for c in claims:
        if c.id != "gauge.census":
            continue
        for label in ("QK-norm", "no QK-norm"):
            d = c.details.get(label)
            if d is None:
                continue
            lines.append(f"census ({c.dtype}, {label}): max |L(cp) - L(p)|, c in {c.details['scales_c']} "
                         f"(tol {d['loss_tol']:.3g}); radial cos (tol {d['radial_cos_tol']:.3g})")
            for name, row in d["per_tensor"].items():
                mark = "GAUGE" if row["gauge"] else "  -  "
                lines.append(f"    {mark}  {name:34s} max|dL| {row['max |dL|']:9.3g}   radial cos "
                             f"{row['radial cos']:10.3g}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(build_parser(), None if argv is None else list(argv), _work, check=_check)


def _check(args: argparse.Namespace) -> GaugeConfig | None:
    return None if args.command == "census" else config_from_args(args)


def _work(args: argparse.Namespace, cfg: GaugeConfig | None) -> int:
    if args.command == "census":  # python -m gauge census ...: the census of any model (its own flags)
        from gauge.census_cli import main as census_main

        return census_main(args.rest)
    dtypes = ("float64", "float32") if args.dtype == "both" else (args.dtype,)
    torch.set_num_threads(args.threads)

    def progress(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    progress(f"gauge: d_model={cfg.d_model}, {cfg.n_heads} heads, {cfg.n_layers} layers, batch {cfg.batch}x"
             f"{cfg.block}, seed {cfg.seed}; training {cfg.train_steps} AdamW steps in float32, "
             f"measuring in {' and '.join(dtypes)}")
    claims = run_claims(CLAIMS, cfg=cfg, dtypes=dtypes, progress=progress)
    elapsed = time.perf_counter() - t0
    if args.json:
        write_claims_json(args.json, claims, tool="gauge", config=cfg.__dict__, dtypes=list(dtypes),
                          torch=torch.__version__, seconds=elapsed)
    if args.quiet:
        for c in claims:
            print(f"[{'HOLDS' if c.holds else 'FAILS'}] {c.id} ({c.dtype})")
        print(verdict_line(claims))
        return 0 if all(c.holds for c in claims) else 1
    corpus = "the bundled Shakespeare" if cfg.corpus is None else cfg.corpus
    print(f"RMSNorm scale gauge: W = blocks.{cfg.layer}.attn.q_proj.weight of a QK-norm transformer")
    print(f"(d_model {cfg.d_model}, {cfg.n_heads} heads, {cfg.n_layers} layers) after {cfg.train_steps} AdamW "
          f"steps (float32) on {corpus};")
    print(f"loss: next-byte cross-entropy on a held-out {cfg.batch}x{cfg.block} batch; measured in "
          f"{' | '.join(dtypes)}.")
    wall = seconds_since_process_start()  # the whole run: the imports take seconds more on a loaded machine
    took = f"{elapsed:.1f} s after the imports" if wall is None else f"{wall:.1f} s wall since the process started"
    print(f"{took}; --verbose: source, law and details; --census: per tensor.")
    print()
    extra = census_lines(claims) if args.census or args.verbose else []
    print(claims_table(claims, verbose=args.verbose, extra=extra))
    return 0 if all(c.holds for c in claims) else 1


if __name__ == "__main__":
    sys.exit(main())
