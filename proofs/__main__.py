"""``python -m proofs [--only PREFIX] [--json PATH]``: run the symbolic proofs and print verdicts."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from rmsgauge import atomic_write_json, check_output_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m proofs", description=__doc__)
    ap.add_argument("--only", default="", help="run only proofs whose name starts with this prefix (e.g. gauge.)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    try:  # before any proof runs: a bad --json path must not cost the whole run
        check_output_file("--json", args.json)
    except ValueError as e:
        ap.error(str(e))
    from proofs import PROOFS, run_all

    if args.only and not any(n.startswith(args.only) for n in PROOFS):
        ap.error(f"--only {args.only!r} matches no proof; known: {', '.join(sorted(PROOFS))}")
    results = run_all(args.only)
    for r in results:
        print(r, flush=True)
    ok = sum(r.holds for r in results)
    print(f"{ok} of {len(results)} identities proved (sympy)")
    if args.json:
        atomic_write_json(args.json, {"proofs": [asdict(r) for r in results]})
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
