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
import dataclasses
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch

from gauge.census.cli import main as census_main
from gauge.checks import CLAIMS
from gauge.model import TORCH_EPS, GaugeConfig
from rmsgauge.claims import Claim, claims_table, run_claims, verdict_line, write_claims_json
from rmsgauge.cli import (
    add_subcommand,
    add_subcommands,
    check_output_file,
    check_outputs_against_inputs,
    check_range,
    make_parser,
    parse_dtype,
    parse_float_list,
    run_main,
    seconds_since_process_start,
)
from rmsgauge.corpus import ByteCorpus, corpus_files


def _dtype_choice(value: str) -> str:
    if value == "both":
        return value
    try:
        return parse_dtype(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"unknown dtype {value!r}; allowed: float32, float64, both") from None


def _eps_list(value: str) -> list[float | str]:
    out: list[float | str] = []
    for item in filter(None, (v.strip() for v in value.split(","))):
        try:
            out.append(item if item == TORCH_EPS else float(item))
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
    m.add_argument("--batch-size", type=int, default=d.batch_size, help=f"sequences per batch (default {d.batch_size})")
    m.add_argument("--block-size", type=int, default=d.block_size, help=f"tokens per sequence (default {d.block_size})")
    m.add_argument("--train-steps", type=int, default=d.train_steps,
                   help=f"float32 AdamW steps before measuring; 0 = the initialization (default {d.train_steps})")
    m.add_argument("--lr", type=float, default=d.lr, help=f"AdamW learning rate for those steps (default {d.lr:g})")
    m.add_argument("--corpus", metavar="PATH", default=None,
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
                        "two, which scale floats exactly (the census claim then fails) (default: 10,0.1)")
    o = ap.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", help="also write the claim records as JSON (atomic)")
    o.add_argument("--verbose", action="store_true",
                   help="add each claim's source, law and measurements, and the census (wrapped at 100 columns)")
    o.add_argument("--census", action="store_true", help="add the per-tensor census table")
    o.add_argument("--quiet", action="store_true", help="no progress on stderr; one line per claim")
    o.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: machines are shared)")
    return ap


def config_from_args(args: argparse.Namespace) -> GaugeConfig:
    """The config the flags name (:class:`GaugeConfig` checks each value), before any work: also --threads, --json
    and the corpus."""
    check_range("--threads", args.threads, 1)
    check_output_file("--json", args.json)
    names = {f.name for f in dataclasses.fields(GaugeConfig)}
    cfg = GaugeConfig(**{**{n: getattr(args, n) for n in names}, "eps": tuple(args.eps),
                         "census_c": tuple(args.census_c)})
    if args.corpus is None:
        return cfg
    # the corpus is read (as the run will read it), both splits hold a window, and --json is none of its files
    if args.corpus == "" or not Path(args.corpus).exists():
        raise ValueError(f"--corpus must be an existing text file or folder, got {args.corpus!r}")
    check_outputs_against_inputs({"--corpus": [args.corpus, *corpus_files(args.corpus)]}, {"--json": args.json})
    try:
        corpus = ByteCorpus.load(args.corpus)
    except (ValueError, OSError) as e:
        raise ValueError(f"--corpus {args.corpus}: {e}") from None
    need = args.block_size + 2
    for n in ("train", "val"):
        if len(corpus.split(n)) < need:
            raise ValueError(f"--corpus {args.corpus}: its {n} split holds {len(corpus.split(n))} bytes, fewer than "
                             f"--block-size + 2 = {need} (a window and its next byte); use a larger corpus or a "
                             f"smaller --block-size")
    return cfg


def census_lines(claims: list[Claim]) -> list[str]:
    """The per-tensor census, one line per tensor, read from each census record's structured details."""
    lines = []
    for c in (c for c in claims if c.id == "gauge.census"):
        for label in (label for label in ("QK-norm", "no QK-norm") if label in c.details):
            d = c.details[label]
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
        return census_main(args.rest)
    dtypes = ("float64", "float32") if args.dtype == "both" else (args.dtype,)
    torch.set_num_threads(args.threads)
    progress = None if args.quiet else partial(print, file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    if progress:
        progress(f"gauge: d_model={cfg.d_model}, {cfg.n_heads} heads, {cfg.n_layers} layers, batch {cfg.batch_size}x"
                 f"{cfg.block_size}, seed {cfg.seed}; training {cfg.train_steps} AdamW steps in float32, "
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
    else:
        corpus = "the bundled Shakespeare" if cfg.corpus is None else cfg.corpus
        print(f"RMSNorm scale gauge: W = blocks.{cfg.layer}.attn.q_proj.weight of a QK-norm transformer")
        print(f"(d_model {cfg.d_model}, {cfg.n_heads} heads, {cfg.n_layers} layers) after {cfg.train_steps} AdamW "
              f"steps (float32) on {corpus};")
        print(f"loss: next-byte cross-entropy on a held-out {cfg.batch_size}x{cfg.block_size} batch; measured in "
              f"{' | '.join(dtypes)}.")
        wall = seconds_since_process_start()  # the whole run: the imports take seconds more on a loaded machine
        took = f"{elapsed:.1f} s after the imports" if wall is None else f"{wall:.1f} s wall since the process started"
        print(f"{took}; --verbose: source, law and details; --census: per tensor.\n")
        extra = census_lines(claims) if args.census or args.verbose else []
        print(claims_table(claims, verbose=args.verbose, extra=extra))
    return 0 if all(c.holds for c in claims) else 1


if __name__ == "__main__":
    sys.exit(main())
