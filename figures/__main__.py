"""``python -m figures``: regenerate every figure (SVG + PNG) and the claims report (REPORT.md, index.html).

Figures are deterministic: two runs on the same inputs give byte-identical files
(``run.json``, which holds the timings, is the one exception).  Trained-model
figures use ``--checkpoint`` (loaded, checksum-verified and checked to be a GRT before any figure is
drawn; one without a checksum needs ``--trust-unverified``); without it the shipped reference GRT is drawn.
Every output (``--out-dir``, ``--json``) is checked before any work: writable, and not
the checkpoint or a folder holding it.  Exit status 0 when every figure was written, 1 when one failed or
an input is corrupt, 2 for a usage error (one line), 130 interrupted; --debug shows a traceback.

Examples::

    python -m figures                         # everything into figures/out/
    python -m figures --list                  # what exists, and which claim each figure supports
    python -m figures --only gauge.forward_invariance,grt   # one figure plus every grt.* figure
    python -m figures --quick --out-dir /tmp/f    # reduced sizes (tests)
    python -m figures --claims none           # redraw figures, reuse the claims of the last run (if any)
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from figures.context import DEFAULT_OUT, FigureContext
from figures.gather import ALL_SOURCES
from figures.report import NO_CLAIMS
from rmsgauge import check_output_dir, check_output_file, write_claims_json
from rmsgauge.cli import check_outputs_against_inputs, make_parser, run_main

REPORT_FILES = ("claims.json", "run.json", "REPORT.md", "index.html")  # what every run writes into --out-dir


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python -m figures", __doc__)
    ap.add_argument("--only", metavar="NAMES", action="append", default=[],
                    help="comma-separated figure names or groups (a name prefix such as 'gauge', 'dynamics', "
                         "'grt'); repeatable. Default: every figure. See --list.")
    ap.add_argument("--list", action="store_true", help="list the figures (name, source text, claims) and exit")
    ap.add_argument("--out-dir", metavar="DIR", type=Path, default=DEFAULT_OUT,
                    help=f"output folder for figures and the report (default: {DEFAULT_OUT})")
    ap.add_argument("--checkpoint", metavar="PATH", type=Path, default=None,
                    help="a trained GRT checkpoint (from python -m lm.train --model grt) for the trained-model "
                         "figures; default: the shipped reference GRT")
    ap.add_argument("--trust-unverified", action="store_true",
                    help="accept a --checkpoint that has no checksum file (ckpt.pt.sha256); refused without it")
    ap.add_argument("--quick", action="store_true",
                    help="reduced sizes and a tiny training budget (for tests; captions say so)")
    ap.add_argument("--seed", type=int, default=0, help="seed for every random draw, in [0, 2**32) (default 0)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads, in [0, 1024]; 0 leaves torch's default (default 0)")
    ap.add_argument("--claims", metavar="SOURCES", default=",".join(ALL_SOURCES),
                    help=f"claim sources to gather, comma-separated from {', '.join(ALL_SOURCES)}, or 'none' "
                         f"to reuse <out-dir>/claims.json of an earlier run where there is one (without one the "
                         f"report has no claims and says why) (default: all)")
    ap.add_argument("--no-report", action="store_true", help="draw figures only; do not write REPORT.md/index.html")
    ap.add_argument("--json", metavar="PATH", type=Path, default=None,
                    help="also write the gathered claim records as JSON (atomic)")
    return ap


def _validate(args: argparse.Namespace) -> tuple[list[str], tuple[str, ...]]:
    """Every flag, output path and input before any figure is drawn; a ``ValueError`` names the flag."""
    from figures import registry

    if not (0 <= args.seed < 2**32):
        raise ValueError(f"--seed must be in [0, 2**32), got {args.seed}")
    if not (0 <= args.threads <= 1024):
        raise ValueError(f"--threads must be in [0, 1024], got {args.threads}")
    figs = registry.load_all()
    selectors = [s.strip() for group in args.only for s in group.split(",") if s.strip()]
    if args.only and not selectors:
        raise ValueError("--only needs at least one figure name; see --list")
    try:
        names = registry.resolve(selectors) if selectors else list(figs)
    except KeyError as e:
        raise ValueError(f"--only: unknown figure {e.args[0]!r}; known figures: {', '.join(figs)} "
                         f"(or a group: gauge, dynamics, grt)") from None
    raw = args.claims.strip().lower()
    sources: tuple[str, ...] = () if raw == "none" else tuple(s.strip() for s in raw.split(",") if s.strip())
    if not set(sources) <= set(ALL_SOURCES) or (raw != "none" and not sources):
        raise ValueError(f"--claims must be 'none' or a comma-separated subset of {', '.join(ALL_SOURCES)}, "
                         f"got {args.claims!r}")
    if not args.list:
        _check_paths(args)
        if args.checkpoint is not None:
            _check_checkpoint(args)
    return names, sources


def _check_paths(args: argparse.Namespace) -> None:
    check_output_dir("--out-dir", args.out_dir)
    check_output_file("--json", args.json)
    from lm.checkpoint import checkpoint_inputs

    inputs = {"--checkpoint": checkpoint_inputs(args.checkpoint) if args.checkpoint is not None else None}
    report = {f"the report's {n}": args.out_dir / n for n in REPORT_FILES}
    check_outputs_against_inputs(inputs, {"--json": args.json, **report},
                                 {"--out-dir": args.out_dir})


def _check_checkpoint(args: argparse.Namespace) -> None:
    """The checkpoint is loaded (checksum, fields, weights) and must hold a GRT: before minutes of figures."""
    from lm.checkpoint import load_checkpoint, model_from_checkpoint, trust_unverified

    if not args.checkpoint.is_file():
        raise ValueError(f"--checkpoint must be an existing checkpoint file, got {args.checkpoint} (no such file)")
    ck = load_checkpoint(args.checkpoint, trust_unverified=args.trust_unverified)
    if ck["model_kind"] != "grt":
        raise ValueError(f"--checkpoint {args.checkpoint} holds a {ck['model_kind']} model; the figures need a GRT "
                         f"(python -m lm.train --model grt)")
    model_from_checkpoint(ck)
    if args.trust_unverified:
        trust_unverified(args.checkpoint)  # the figures load it again later


def list_figures() -> str:
    from figures import registry

    figs = registry.load_all()
    w = max(len(n) for n in figs)
    lines = [f"{'figure':<{w}}  {'source':<10}  {'kind':<13}  supports claims"]
    for n, s in figs.items():
        kind = "trained+3D" if s.trained and s.interactive else ("trained" if s.trained else "computed")
        lines.append(f"{n:<{w}}  {s.source:<10}  {kind:<13}  {', '.join(s.claims) or '(illustration)'}")
    return "\n".join(lines)


def display_command(argv: list[str]) -> str:
    """The command line as the report prints it, without the output folder (the report must not
    depend on where it was written: two runs into two folders give byte-identical pages)."""
    keep, args = [], iter(argv)
    for a in args:
        if a in ("--out-dir", "--out"):
            next(args, None)  # and its value
        elif not a.startswith(("--out-dir=", "--out=")):
            keep.append(a)
    return shlex.join(["python", "-m", "figures", *keep])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_main(build_parser(), argv, lambda args, checked: _work(args, checked, argv), check=_validate)


def _work(args: argparse.Namespace, checked: tuple[list[str], tuple[str, ...]], argv: list[str]) -> int:
    names, sources = checked
    if args.list:
        print(list_figures())
        return 0

    from figures import registry
    from figures.runner import run

    cmd = display_command(argv)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    ctx = FigureContext(out_dir=args.out_dir, quick=args.quick, seed=args.seed, checkpoint=args.checkpoint)
    registry.progress(f"{len(names)} figure(s) into {args.out_dir} "
                      f"({'quick (reduced) sizes' if args.quick else 'full sizes'}); claims from: "
                      f"{', '.join(sources) or 'claims.json of an earlier run'}")
    res = run(names, ctx, claim_sources=sources, report=not args.no_report, command=cmd)
    if args.json is not None:
        write_claims_json(args.json, res.claims, missing=res.missing)

    figs = registry.load_all()
    w = max(len(n) for n in names)
    print(f"{'figure':<{w}}  {'status':<8}  {'seconds':>7}  supports claims")
    for n in names:
        st = "written" if n in res.log.written else ("skipped" if n in res.log.skipped else "FAILED")
        print(f"{n:<{w}}  {st:<8}  {res.log.seconds.get(n, 0.0):7.1f}  {', '.join(figs[n].claims) or '-'}")
    if res.claims:
        print(f"{sum(c.holds for c in res.claims)} of {len(res.claims)} claims hold"
              + (" (reused from claims.json)" if res.reused_claims else ""))
    if res.proofs:
        print(f"{sum(bool(p.holds) for p in res.proofs)} of {len(res.proofs)} symbolic proofs hold")
    for src, why in res.missing.items():
        print(f"claims not gathered from {src}: {why}")
    if not res.claims and not res.missing:
        print(f"no claims in the report: {NO_CLAIMS}")
    print(f"total {res.seconds:.1f} s; report: {args.out_dir / 'index.html'} and {args.out_dir / 'REPORT.md'}"
          if not args.no_report else f"total {res.seconds:.1f} s")
    return 1 if res.log.failed else 0


if __name__ == "__main__":
    sys.exit(main())
