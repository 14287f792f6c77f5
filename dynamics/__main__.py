"""``python dynamics.py`` / ``python -m dynamics``: weight-norm dynamics of an RMSNorm scale gauge under weight decay.

Without setting flags it runs the default reproduction of the source text's dynamics claims: SGD with
the source's decay W <- W - lr g - wd W (wd = 0.02) on the real QK-norm query projection (float32,
learning rate calibrated so the first step turns W_q by the source's 0.0025 rad) and on a float64
RMSNorm regression toy, plus the grids the laws need (a wd sweep for the 4e-4 figure, a phase toy for
exact fixed points and relaxation, a noise toy for each optimizer's equilibrium angle).

With any of --optimizer --decay --lr --wd --momentum --betas --steps --dtype the run measures that one
setting on every problem, and every record reflects it (--seed and --quick do not switch modes).

Decay conventions: source (decay wd per step, independent of lr), torch (lr*wd per step, as
torch.optim.AdamW / SGD-W), l2 (wd*W added to the gradient, torch.optim.SGD's weight_decay; sgd/sgdm).

Prints one row per claim and the verdict last; --verbose adds each claim's source, law and data.
Exit status 0 when every claim holds, 1 when one fails, 2 for a usage error (one line, before any work),
130 interrupted; --debug shows a traceback instead of the one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
import time

from dynamics.context import DynamicsPlan
from rmsgauge import check_output_file, claims_table, parse_dtype, run_claims, write_claims_json
from rmsgauge.claims import WIDTH
from rmsgauge.cli import make_parser, run_main, seconds_since_process_start

SETTING_FLAGS = ("optimizer", "decay", "lr", "wd", "momentum", "betas", "steps", "dtype")


def _betas(value: str) -> tuple[float, float]:
    try:
        b = tuple(float(p) for p in value.replace(" ", "").split(",") if p)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two comma-separated numbers like 0.9,0.999; got {value!r}") \
            from None
    if len(b) != 2:
        raise argparse.ArgumentTypeError(f"expected exactly two numbers (beta1,beta2); got {value!r}")
    return b  # type: ignore[return-value]


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python dynamics.py", __doc__, usage="%(prog)s [options]")
    ap.add_argument("--optimizer", choices=("sgd", "sgdm", "adamw"), default=None,
                    help="sgd, sgd with momentum (torch.optim.SGD), or adamw (torch.optim.AdamW); default sgd")
    ap.add_argument("--decay", choices=("source", "torch", "l2"), default=None,
                    help="weight-decay convention: source (W <- W - lr g - wd W), torch (lr*wd per step), "
                         "l2 (coupled, sgd/sgdm only); default source")
    ap.add_argument("--lr", type=float, default=None,
                    help="learning rate > 0; default per problem (model: calibrated to a 0.0025 rad first step; "
                         "toys 0.1; adamw 1e-3, noise toy 1e-2)")
    ap.add_argument("--wd", type=float, default=None, help="weight decay in [0, 1); default 0.02")
    ap.add_argument("--momentum", type=float, default=None, help="sgdm momentum in [0, 1); default 0.9")
    ap.add_argument("--betas", type=_betas, default=None, help="adamw betas 'b1,b2', each in [0, 1); default 0.9,0.999")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps >= 1 for every run; default per problem (enough for equilibrium)")
    ap.add_argument("--seed", type=int, default=0, help="seed for data, init and noise (default 0)")
    ap.add_argument("--dtype", type=parse_dtype, default=None,
                    help="float32 or float64 for every run; default float64 toys and a float32 model")
    ap.add_argument("--quick", action="store_true", help="shorter runs and grids (default reproduction only)")
    ap.add_argument("--json", metavar="PATH", help="also write the claim records as JSON (atomic)")
    ap.add_argument("--verbose", action="store_true",
                    help="add each claim's source, law and data (wrapped at 100 columns)")
    ap.add_argument("--no-laws", action="store_true", help="with --verbose: omit the exact-law lines")
    return ap


def validate(args: argparse.Namespace) -> DynamicsPlan:
    """Before any work: the plan the flags describe (:class:`DynamicsPlan` checks each value) and --json."""
    check_output_file("--json", args.json)
    settings = {f: getattr(args, f) for f in SETTING_FLAGS if getattr(args, f) is not None}
    return DynamicsPlan(single=bool(settings), seed=args.seed, quick=args.quick, **settings)


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, _work, check=validate)


def _work(args: argparse.Namespace, plan: DynamicsPlan) -> int:
    from dynamics.checks import CLAIMS  # heavy imports only after the flags are valid
    from dynamics.simulate import stderr_progress

    t0 = time.perf_counter()
    claims = run_claims(CLAIMS, plan=plan, progress=stderr_progress)
    seconds = time.perf_counter() - t0
    if args.json:
        write_claims_json(args.json, claims, package="dynamics", mode="single" if plan.single else "default",
                          plan=plan.describe(), seed=plan.seed, seconds=round(seconds, 2))
        print(f"wrote {args.json}", file=sys.stderr)
    wall = seconds_since_process_start()  # the whole run: the imports take seconds more on a loaded machine
    took = f"{seconds:.1f} s after the imports" if wall is None else f"{wall:.1f} s wall since the process started"
    print(textwrap.fill(f"dynamics ({took}): {plan.describe()}", WIDTH))
    print("decay: source W <- W - lr g - wd W (d = wd); torch lr*wd per step (d = lr wd); l2 wd*W in gradient")
    print("--verbose: each claim's source, law and data")
    print()
    claims_shown = [dataclasses.replace(c, exact_law="") for c in claims] if args.no_laws else claims
    print(claims_table(claims_shown, verbose=args.verbose))
    return 0 if all(c.holds for c in claims) else 1


if __name__ == "__main__":
    sys.exit(main())
