"""``python -m proofs [--only PREFIX] [--json PATH]``: run the symbolic proofs and print verdicts.

Exit status 0 when every identity is proved, 1 when one is not, 2 for a usage error (one line, before any
proof runs), 130 interrupted; --debug shows a traceback instead of the one line."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from rmsgauge import atomic_write_json, check_output_file
from rmsgauge.cli import make_parser, run_main


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python -m proofs", __doc__)
    ap.add_argument("--only", default="", help="run only proofs whose name starts with this prefix (e.g. gauge.)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return ap


def _check(args: argparse.Namespace) -> None:
    check_output_file("--json", args.json)  # before any proof runs: a bad --json path must not cost the run
    from proofs import PROOFS

    if args.only and not any(n.startswith(args.only) for n in PROOFS):
        raise ValueError(f"--only {args.only!r} matches no proof; known: {', '.join(sorted(PROOFS))}")


def _work(args: argparse.Namespace, _checked: None) -> int:
    from proofs import run_proofs

    results = run_proofs(args.only)
    for r in results:
        print(r, flush=True)
    ok = sum(r.holds for r in results)
    print(f"{ok} of {len(results)} identities proved (sympy)")
    if args.json:
        atomic_write_json(args.json, {"proofs": [asdict(r) for r in results]})
    return 0 if ok == len(results) else 1


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, _work, check=_check)


if __name__ == "__main__":
    sys.exit(main())
