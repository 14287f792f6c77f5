"""``tools/readme_blocks.py``: the README's generated blocks equal what their generators compute from the
committed results, and a stale, unknown or missing block is reported, never silently kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmsgauge import Failure
from studies.grid import DEFAULT_GROUPS, grid
from tools import readme_blocks
from tools.readme_blocks import BLOCKS, ROOT, render

OPEN = "<!-- generated: {0} (python -m tools.readme_blocks) -->\n"
CLOSE = "<!-- end generated: {0} -->\n"


def test_the_committed_readme_quotes_the_committed_records(capsys):
    assert readme_blocks.main(["--check"]) == 0, capsys.readouterr().out
    text = (ROOT / "README.md").read_text()
    assert all(OPEN.format(name) in text for name in BLOCKS)


def _tiny_results(root: Path, records: list[dict]) -> None:
    (root / readme_blocks.RESULTS).mkdir(parents=True)
    (root / readme_blocks.RESULTS / "runs.json").write_text(json.dumps(records))


def test_a_stale_block_is_rewritten_from_the_records(tmp_path):
    committed = json.loads((ROOT / readme_blocks.RESULTS / "runs.json").read_text())
    shipped = next(r for r in committed if r["name"] == "shipped-seed0")
    _tiny_results(tmp_path, [shipped])
    stale = "".join(OPEN.format(n) + "```\nold numbers\n```\n" + CLOSE.format(n) for n in BLOCKS)
    new, changed = render("# title\n\n" + stale + "after\n", tmp_path)
    assert changed == list(BLOCKS)
    last = CLOSE.format(list(BLOCKS)[-1])
    assert "old numbers" not in new and new.startswith("# title\n\n") and new.endswith(last + "after\n")
    specs = [s for s in grid("full") if s.group in DEFAULT_GROUPS]  # the reference comparison keeps its own records
    assert f"1 of {len(specs)} runs recorded" in new and f"{shipped['val_bpb_full']:.4f}" in new
    assert "pending: shipped GRT" in new  # no trained-claims records in this folder: said, not left blank
    assert "pending: no record in results/compare-reference" in new
    again, changed = render(new, tmp_path)
    assert again == new and changed == []  # a current block is left as it is


def test_the_trained_claims_block_sets_both_shapes_side_by_side(tmp_path):
    def claims(*rows):
        return {"claims": [{"id": i, "holds": h, "summary": s} for i, h, s in rows]}

    res = tmp_path / readme_blocks.RESULTS
    res.mkdir(parents=True)
    (res / "trained_claims_shipped.json").write_text(json.dumps(claims(("grt.a", True, "x 1"), ("grt.b", False, "y"))))
    out = readme_blocks.trained_claims_both_shapes(tmp_path)
    lines = out.splitlines()
    assert lines[1].split() == ["grt.a", "HOLDS:", "x", "1", "pending"] and "text-shape GRT" in lines[-1]
    (res / "trained_claims_text_shape.json").write_text(json.dumps(claims(("grt.b", True, "z"), ("grt.c", True, ""))))
    lines = readme_blocks.trained_claims_both_shapes(tmp_path).splitlines()
    assert [ln.split()[0] for ln in lines[1:]] == ["grt.a", "grt.b", "grt.c"]  # every claim of either shape
    assert lines[2].split() == ["grt.b", "FAILS:", "y", "HOLDS:", "z"] and lines[3].split()[1] == "pending"
    assert not any(ln.startswith("pending:") for ln in lines)


def test_unknown_and_missing_blocks_are_failures(tmp_path):
    _tiny_results(tmp_path, [])
    with pytest.raises(Failure, match="has no generator"):
        render(OPEN.format("nosuch") + "```\n```\n" + CLOSE.format("nosuch"), tmp_path)
    with pytest.raises(Failure, match="no marked block for experiments-summary, reference-comparison, trained-claims"):
        render("# a README without markers\n", tmp_path)
