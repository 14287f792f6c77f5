"""``python -m tools.readme_blocks``: rewrite the README's generated blocks from the committed results.

A generated block sits between two marker lines::

    <!-- generated: NAME (python -m tools.readme_blocks) -->
    ...
    <!-- end generated: NAME -->

and holds the output of the generator called NAME (:data:`BLOCKS`), fenced as code: ``experiments-summary``,
the tables and verdicts of ``python -m studies.experiments summary`` computed from
``results/grt-experiments/runs.json``, ``trained-claims``, the trained-model claims of both trained shapes
side by side (``results/grt-experiments/trained_claims_*.json``), and ``reference-comparison``, the reference
comparison's table (``results/compare-reference/runs.json``); the committed results, nothing retrained.
``--check`` changes nothing and exits 1 when a block is stale (``tests/test_readme_blocks.py`` runs it, so the
README cannot drift from the records it quotes).  The README is replaced atomically, and only when a block changed.

    python -m tools.readme_blocks            # rewrite README.md
    python -m tools.readme_blocks --check    # exit 1 if any block is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from rmsgauge import Failure
from rmsgauge.atomic import atomic_write_text
from rmsgauge.cli import make_parser, run_main

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "results/grt-experiments"
REFERENCE = "results/compare-reference"


def experiments_summary(root: Path) -> str:
    """The experiment grid's summary from the committed records (the command's output without its path)."""
    from studies.experiments_report import summary_lines
    from studies.grid import DEFAULT_GROUPS, grid

    path = root / RESULTS / "runs.json"
    records = json.loads(path.read_text()) if path.is_file() else []
    specs = [s for s in grid("full") if s.group in DEFAULT_GROUPS]
    return "\n".join(summary_lines(records, specs, f"{RESULTS}/runs.json")[0])


def _claim_cell(c: dict | None) -> str:
    if c is None:
        return "pending"
    return f"{'HOLDS' if c['holds'] else 'FAILS'}: {c.get('summary') or '-'}"


def trained_claims_both_shapes(root: Path) -> str:
    """The text's trained-model claims on the shipped GRT (2 blocks, width 128) beside the text's own shape (12
    blocks, width 256, the experiment grid's 3M-token run): verdict and the claim's one-line summary for each."""
    from studies.experiments_report import TRAINED_SHAPES, committed_trained_claims

    found = {TRAINED_SHAPES[key]: {c["id"]: c for c in recs}
             for key, recs in committed_trained_claims(root / RESULTS).items()}
    shapes = list(found)
    ids = list(dict.fromkeys(i for claims in found.values() for i in claims))
    rows = [["claim", *shapes]] + [[i, *(_claim_cell(found[label].get(i)) for label in shapes)] for i in ids]
    widths = [max(len(r[k]) for r in rows) for k in range(len(shapes))]  # the last column is not padded
    lines = ["  ".join(f"{cell:{w}s}" for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    missing = [label for label in shapes if not found[label]]
    if missing:
        lines.append(f"pending: {', '.join(missing)} (no {RESULTS}/trained_claims_*.json of it committed yet)")
    return "\n".join(lines)


def reference_comparison(root: Path) -> str:
    """The reference comparison's table and sweeps from its committed records."""
    from studies.reference_report import format_reference

    path = root / REFERENCE / "runs.json"
    lines = format_reference(json.loads(path.read_text()) if path.is_file() else [])
    return "\n".join(lines).strip("\n") or f"pending: no record in {REFERENCE}/runs.json yet"


BLOCKS: dict[str, Callable[[Path], str]] = {"experiments-summary": experiments_summary,
                                            "trained-claims": trained_claims_both_shapes,
                                            "reference-comparison": reference_comparison}

_BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) \(python -m tools\.readme_blocks\) -->\n)(?P<body>.*?)"
                    r"(<!-- end generated: (?P=name) -->)", re.S)


def render(text: str, root: Path) -> tuple[str, list[str]]:
    """``text`` with every generated block recomputed, and the names of the blocks that changed."""
    changed: list[str] = []

    def one(m: re.Match) -> str:
        name = m["name"]
        if name not in BLOCKS:
            raise Failure(f"README block {name!r} has no generator; known: {', '.join(BLOCKS)}")
        body = "```\n" + BLOCKS[name](root).rstrip("\n") + "\n```\n"
        if body != m["body"]:
            changed.append(name)
        return m.group(1) + body + m.group(4)

    out = _BLOCK.sub(one, text)
    missing = sorted(set(BLOCKS) - {m["name"] for m in _BLOCK.finditer(text)})
    if missing:
        raise Failure(f"README.md has no marked block for {', '.join(missing)} (see python -m tools.readme_blocks "
                      f"--help for the markers)")
    return out, changed


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python -m tools.readme_blocks", __doc__)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block is stale")
    return ap


def work(args: argparse.Namespace, _: None) -> int:
    readme = ROOT / "README.md"
    new, changed = render(readme.read_text(encoding="utf-8"), ROOT)
    if args.check:
        print(f"stale README blocks: {', '.join(changed)} (run python -m tools.readme_blocks)" if changed
              else f"README blocks current: {', '.join(BLOCKS)}")
        return 1 if changed else 0
    if changed:
        atomic_write_text(readme, new)
    print(f"rewrote {', '.join(changed)} in {readme}" if changed else "README blocks already current")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, work)


if __name__ == "__main__":
    sys.exit(main())
