"""figures/: the CLI, the registry, deterministic output, the report writer, claim gathering.

The expensive parts (training the figure model, running every package's checks)
are exercised by ``python -m figures``; here a fast subset runs: the static GRT
figures plus the trained-model figures drawn from an untrained tiny checkpoint.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from report_samples import (  # tests/ is on the path (conftest's folder)
    synthetic_claims,
    synthetic_proofs,
    write_untrained_checkpoint,
)

from figures import FigureContext, load_all, run
from figures import gather as gather_mod
from figures.__main__ import display_command, main
from figures.registry import resolve
from figures.report import render_html, render_markdown
from rmsgauge import Claim, ClaimGroup

TRAINED_SUBSET = ("grt.fig_q_pair_trace", "grt.fig_gates")  # one interactive 3-D view, one plain


def fast_names() -> list[str]:
    return [n for n, s in load_all().items() if s.fast]


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> Path:
    return write_untrained_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.pt")


# --------------------------------------------------------------------------------------------- CLI


def test_cli_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--only", "--list", "--out", "--checkpoint", "--quick", "--claims", "--json", "--seed"):
        assert flag in out


def test_cli_list_names_every_figure_and_its_claims(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name, spec in load_all().items():
        assert name in out
        for c in spec.claims:
            assert c in out


@pytest.mark.parametrize("argv, needle", [
    (["--only", "no.such_figure"], "--only: unknown figure 'no.such_figure'"),
    (["--only", ","], "--only needs at least one figure name"),
    (["--seed", "-1"], "--seed must be in [0, 2**32)"),
    (["--threads", "5000"], "--threads must be in [0, 1024]"),
    (["--checkpoint", "/nonexistent/ckpt.pt"], "--checkpoint must be an existing checkpoint file"),
    (["--claims", "gauge,bogus"], "--claims must be 'none' or a comma-separated subset"),
])
def test_cli_rejects_bad_flags_before_any_work(argv, needle, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out-dir", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert not (tmp_path / "out").exists()  # failed before writing anything


def test_unknown_name_error_lists_the_known_figures(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["--only", "gauge.nope", "--out-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert all(n in err for n in fast_names())


def test_resolve_accepts_names_and_groups():
    figs = load_all()
    grt = resolve(["grt"])
    assert grt == [n for n in figs if n.startswith("grt.")]
    assert resolve(["grt.mixing", "grt."]) == ["grt.mixing", *[n for n in grt if n != "grt.mixing"]]
    with pytest.raises(KeyError):
        resolve(["gr"])


def test_display_command_hides_output_folders():
    cmd = display_command(["--quick", "--out", "/tmp/a", "--out-dir=/tmp/c", "--only", "grt"])
    assert cmd == "python -m figures --quick --only grt"


# --------------------------------------------------------------------------------------------- registry


def test_figure_names_follow_the_claim_id_convention():
    """A figure's stem is the claim id it is evidence for where there is one; otherwise a ``fig_`` name."""
    for name, spec in load_all().items():
        pkg, _, rest = name.partition(".")
        assert pkg in ("gauge", "dynamics", "grt", "studies") and rest.replace("_", "").isalnum(), name
        assert name in spec.claims or rest.startswith("fig_"), name
        assert spec.source in ("gauge text", "GRT text")


def test_grt_figures_cite_real_grt_claim_ids():
    from grt_model.claims import CLAIMS
    from studies.trained import CLAIMS as TRAINED

    known = set(CLAIMS.checks) | set(TRAINED.checks)
    cited = {c for s in load_all().values() for c in s.claims if c.startswith("grt.")}
    assert cited <= known, cited - known
    assert {"grt.trained_gates", "grt.trained_ring_radius"} <= cited  # the trained figures are evidence too


def test_link_figures_prefers_the_figure_named_after_the_claim():
    claims = [Claim(id="grt.param_accounting", statement="s", stated=None, measured=1, tolerance=None, holds=True),
              Claim(id="grt.jacobian", statement="s", stated=None, measured=1, tolerance=None, holds=True)]
    fc = {"grt.embedding_rebuild": ("grt.embedding_rebuild", "grt.param_accounting"),
          "grt.param_accounting": ("grt.param_accounting",)}
    out = gather_mod.link_figures(claims, fc)
    assert [c.figure for c in out] == ["grt.param_accounting", None]
    assert claims[0].figure is None  # copies: the packages' records are not mutated


# --------------------------------------------------------------------------------------------- gathering


def test_gather_notes_a_missing_source_and_rejects_foreign_records(monkeypatch):
    import sys
    import types

    monkeypatch.setitem(gather_mod.CLAIM_SOURCES, "ghost", "no_such_package.checks")
    monkeypatch.setattr(gather_mod, "ALL_SOURCES", (*gather_mod.ALL_SOURCES, "ghost"))
    g = gather_mod.gather(("ghost",), log=lambda _: None)
    assert "ghost" in g.missing and "no_such_package" in g.missing["ghost"]
    assert g.claims == []

    foreign = types.ModuleType("foreign_claims")
    foreign.CLAIMS = ClaimGroup(checks={"ghost.cwd": lambda: "/"})  # returns a str, not Claims
    monkeypatch.setitem(sys.modules, "foreign_claims", foreign)
    monkeypatch.setitem(gather_mod.CLAIM_SOURCES, "ghost", "foreign_claims")
    with pytest.raises(TypeError, match=r"must return rmsgauge\.Claim records"):
        gather_mod.gather(("ghost",), log=lambda _: None)


# --------------------------------------------------------------------------------------------- report


def test_report_lists_every_claim_with_status_law_and_figure():
    claims = synthetic_claims()
    claims[0].figure = "grt.mixing"  # a figure that exists in the sidecars below
    side = [{"name": "grt.mixing", "title": "wiring", "source": "GRT text", "claims": ["grt.mixing"],
             "caption": "c", "svg": "grt.mixing.svg", "png": "grt.mixing.png", "interactive": None,
             "trained": False, "numbers": {}}]
    md = render_markdown(claims, [], side, {"command": "python -m figures"})
    html = render_html(claims, [], side, {"command": "python -m figures"}, {})
    for c in claims:
        assert f"`{c.id}`" in md
        assert f'data-claim-id="{c.id}"' in html
        if c.exact_law:
            assert c.exact_law.replace("&", "&amp;") in html
    assert "WRONG as stated" in md and "approximate: see exact law" in md
    assert "&lt;wording&gt;" in html and "<wording>" not in html  # statements are escaped
    assert "[grt.mixing](grt.mixing.svg)" in md
    assert html.count('<tr class="claim') == len({c.id for c in claims})  # one row per claim id
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html  # offline


def _sidecar(name: str, claims: list[str]) -> dict:
    return {"name": name, "title": name, "source": "GRT text", "claims": claims, "caption": "c", "svg": f"{name}.svg",
            "png": f"{name}.png", "interactive": None, "trained": False, "numbers": {}}


def _broken_links(html: str) -> list[str]:
    ids = set(re.findall(r'\bid="([^"]+)"', html))
    return sorted({h for h in re.findall(r'href="#([^"]+)"', html) if h not in ids})


def test_partial_report_says_what_it_left_out_and_links_only_to_what_is_there():
    side = [_sidecar("grt.mixing", ["grt.mixing", "grt.param_accounting"])]
    meta = {"command": "python -m figures --only grt.mixing --claims gauge",
            "missing": {"dynamics": "not asked for (--claims gauge)"},
            "figures_skipped": {"grt.fig_gates": "lm is not in this checkout"}}
    claims = [c for c in synthetic_claims() if c.id == "grt.mixing"]
    html, md = render_html(claims, [], side, meta, {}), render_markdown(claims, [], side, meta)
    assert _broken_links(html) == []  # grt.param_accounting is cited, but has no row to link to
    assert "<code>grt.param_accounting</code> <span class=\"muted\">(not in this report)</span>" in html
    left = html.split('id="left-out"')[1].split("</ul>")[0]
    assert "claims of dynamics: not asked for (--claims gauge)" in left
    assert "figure grt.fig_gates: not drawn, lm is not in this checkout" in left
    absent = [n for n in load_all() if n not in ("grt.mixing", "grt.fig_gates")]
    assert all(n in left for n in absent) and f"{len(absent)} figure(s) not drawn by this run" in left
    assert "## Left out of this report" in md and "claims of dynamics: not asked for" in md


def test_report_without_claims_says_so_instead_of_an_empty_summary():
    side = [_sidecar("grt.mixing", ["grt.mixing"])]
    html, md = render_html([], [], side, {}, {}), render_markdown([], [], side, {})
    assert "<th>all</th>" not in html and "**all**" not in md  # no "all 0 0"
    assert '<table class="claims' not in html and '<table class="proofs' not in html  # no empty tables
    assert "No claim records in this report" in html and "No claim records in this report" in md
    assert "No proofs in this report" in html and _broken_links(html) == []


def test_claims_none_on_a_fresh_folder_draws_and_reports_without_claims(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--only", "grt.fig_storage", "--claims", "none", "--out-dir", str(out)]) == 0
    assert "no claims in the report" in capsys.readouterr().out
    html = (out / "index.html").read_text(encoding="utf-8")
    assert 'id="fig-grt.fig_storage"' in html and "No claim records in this report" in html
    assert _broken_links(html) == []


def test_gather_names_each_source_it_was_not_asked_for(monkeypatch):
    monkeypatch.setattr(gather_mod, "CLAIM_SOURCES", {"samples": "report_samples", "gauge": "gauge.checks"})
    monkeypatch.setattr(gather_mod, "ALL_SOURCES", ("samples", "gauge", "proofs"))
    g = gather_mod.gather(("samples",), log=lambda _: None)
    assert len(g.claims) == len(synthetic_claims())
    assert g.missing == {"gauge": "not asked for (--claims samples)", "proofs": "not asked for (--claims samples)"}


# --------------------------------------------------------------------------------------------- output


def _generate(out: Path, ckpt: Path, names: list[str]) -> None:
    ctx = FigureContext(out_dir=out, quick=True, checkpoint=ckpt)
    res = run(names, ctx, command="python -m figures --quick", claims=synthetic_claims(), proofs=synthetic_proofs())
    assert not res.log.failed, res.log.failed
    assert res.log.written == names


def test_byte_identical_regeneration(tmp_path, tiny_ckpt):
    """Two runs into two folders give byte-identical files (run.json holds timings and is exempt)."""
    names = fast_names() + list(TRAINED_SUBSET)
    a, b = tmp_path / "a", tmp_path / "b"
    _generate(a, tiny_ckpt, names)
    _generate(b, tiny_ckpt, names)
    files_a = sorted(p.name for p in a.iterdir() if p.name != "run.json")
    assert files_a == sorted(p.name for p in b.iterdir() if p.name != "run.json")
    for name in names:
        assert f"{name}.svg" in files_a and f"{name}.png" in files_a and f"{name}.json" in files_a
    for f in ("grt.fig_q_pair_trace.plotly.json", "index.html", "REPORT.md", "claims.json", "plotly.min.js"):
        assert f in files_a, f
    html = (a / "index.html").read_text(encoding="utf-8")
    assert html.count('<tr class="claim') == len(synthetic_claims())
    assert html.count('<tr class="proof"') == len(synthetic_proofs())
    differ = [f for f in files_a if (a / f).read_bytes() != (b / f).read_bytes()]
    assert differ == []

    svg = (a / "grt.mixing.svg").read_text(encoding="utf-8")
    assert "<dc:date>" not in svg and "Matplotlib v" not in svg  # no timestamp, no version
    png = (a / "grt.mixing.png").read_bytes()
    assert b"Software" not in png and b"matplotlib" not in png.lower()

    # trained-model captions say which checkpoint and budget made them
    side = json.loads((a / "grt.fig_gates.json").read_text(encoding="utf-8"))
    assert "tiny.pt" in side["caption"] and "steps of" in side["caption"] and "float32" in side["caption"]
    assert re.search(r"\b0 steps\b", side["caption"])


def test_svg_ids_do_not_depend_on_layout_ulps():
    """Clip-path ids hash the clip rectangle's floats; an ulp of layout noise must not change the file."""
    import math
    import re

    import matplotlib.pyplot as plt

    from figures.style import canonical_svg_ids, new_figure, render

    def svg_with_clip(width: float) -> bytes:
        fig = new_figure(figsize=(3.0, 2.0), layout=None)
        ax = fig.add_axes((0.1, 0.1, width, 0.8))
        ax.plot([0, 1], [0, 1])
        data = render(fig)["svg"]
        plt.close(fig)
        return data

    a, b = svg_with_clip(0.8), svg_with_clip(math.nextafter(0.8, 1.0))
    assert a == b
    defined = set(re.findall(rb'id="([^"]+)"', a))
    referenced = set(re.findall(rb'(?:url\(#|href="#)([^")]+)', a))
    assert referenced and referenced <= defined  # every reference still resolves after the renaming
    assert canonical_svg_ids(a) == a  # idempotent


# --------------------------------------------------------------------------------------------- legible panels


def _text_outside(fig) -> list[str]:
    """What of ``fig`` reaches past the figure's edge (clipped in the SVG and PNG): each axes' drawn text (its
    title, labels, tick labels that are drawn, texts), named by the axes' title, and the figure's own texts."""
    fig.canvas.draw()  # the constrained layout places everything here
    renderer = fig.canvas.get_renderer()
    edge = fig.bbox.padded(0.5)  # half a pixel of rounding
    boxes = [(f"axes {k} ({ax.get_title()!r})", ax.get_tightbbox(renderer)) for k, ax in enumerate(fig.axes)]
    boxes += [(t.get_text(), t.get_window_extent(renderer)) for t in fig.texts if t.get_text().strip()]
    return [name for name, b in boxes if not (edge.contains(b.x0, b.y0) and edge.contains(b.x1, b.y1))]


def test_storage_panels_keep_their_text_inside_the_figure_and_off_the_bars(tmp_path):
    fig = load_all()["grt.fig_storage"].fn(FigureContext(out_dir=tmp_path)).fig
    assert _text_outside(fig) == []
    renderer = fig.canvas.get_renderer()
    bars = fig.axes[0]
    headings = [t for t in bars.texts if t.get_fontweight() == "bold"]
    assert len(headings) == 2
    for t in headings:  # each group's heading sits in the gap above its bars, on none of them
        box = t.get_window_extent(renderer)
        assert not any(box.overlaps(p.get_window_extent(renderer)) for p in bars.patches), t.get_text()




def test_trained_header_leads_with_the_cards_whole_split_bits_per_byte():
    from figures.model_source import _shipped

    card = json.loads((Path(__file__).resolve().parents[1] / "lm" / "reference_models" / "grt.json").read_text())
    prov = _shipped().provenance
    whole, sample = f"{card['final_val_bpb_full']:.4f} bits/byte on the whole split", f"{card['final_val_bpb']:.3f}"
    assert whole in prov and prov.index(whole) < prov.index(sample), prov


def test_reused_claims_keep_what_the_earlier_run_left_out(tmp_path):
    """With runner.patch: ``--claims none`` reuses a partial claims.json and the report still names what it lacks."""
    from report_samples import synthetic_claims

    from figures.__main__ import main
    from rmsgauge import write_claims_json

    out = tmp_path / "out"
    out.mkdir()
    write_claims_json(out / "claims.json", synthetic_claims()[:1], sources=["gauge"],
                      missing={"dynamics": "not asked for (--claims gauge)"}, proofs=[])
    assert main(["--only", "grt.mixing", "--claims", "none", "--out-dir", str(out)]) == 0
    assert "claims of dynamics: not asked for (--claims gauge)" in (out / "index.html").read_text(encoding="utf-8")
