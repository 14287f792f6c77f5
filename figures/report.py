"""The claims report: ``REPORT.md`` and ``index.html`` beside the figures.

Both list every claim record (statement, stated value, ours, tolerance, verdict, dtype, exact law, evidence figure),
every symbolic proof and every figure with its caption.  ``index.html`` works offline: inline CSS, figures as sibling
files, and for the 3-D views plotly's bundled ``plotly.min.js`` written beside it (never a CDN) with each view's data
in a JSON ``<script>`` block.  ``LOADER_JS`` writes load counters onto ``<html>`` (``data-images-ok``, ...) for the
headless-browser test.  Nothing time-dependent is written (runtimes go to ``run.json``): two runs on the same inputs
give byte-identical reports.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rmsgauge import Claim, atomic_write_text

STATUS_NOTE = {
    "exact": "exact",
    "approximate": "approximate: see exact law",
    "wrong": "WRONG as stated: see exact law",
    "unstated": "the source states no value",
    "not_a_source_claim": "our addition, not a source claim",
}
PLOTLY_JS = "plotly.min.js"


# ------------------------------------------------------------------------------------------- values


def fmt(v: Any, *, digits: int = 3) -> str:
    """Compact text for a stated/measured value (numbers to ``digits`` significant figures)."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v == 0.0:
            return "0"
        return f"{v:.{digits}g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(v, dict):
        return "; ".join(f"{k}: {fmt(x, digits=digits)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        if len(v) > 12:
            return "[" + ", ".join(fmt(x, digits=digits) for x in v[:12]) + f", … ({len(v)} values)]"
        return "[" + ", ".join(fmt(x, digits=digits) for x in v) + "]"
    if hasattr(v, "tolist"):
        return fmt(v.tolist(), digits=digits)
    return str(v)


def ours(c: Claim) -> str:
    """The claim's deciding number(s) in a few words (its ``summary``; the full values are in the details)."""
    return c.summary or fmt(c.measured)


def by_id(records: Iterable[Any], key: Callable[[str], str] = str) -> dict[str, list[Any]]:
    """Claim records or proofs grouped by ``key(id)``, in first-seen order (gauge: one record per dtype)."""
    out: dict[str, list[Any]] = {}
    for r in records:
        out.setdefault(key(r.id), []).append(r)
    return out


def summary_counts(claims: list[Claim]) -> dict[str, tuple[int, int]]:
    """package -> (holding, total)."""
    packages = by_id(claims, lambda cid: cid.partition(".")[0])
    return {pkg: (sum(c.holds for c in cs), len(cs)) for pkg, cs in packages.items()}


NO_CLAIMS = ("none were gathered by this run, and the output folder held no claims.json of an earlier run to "
             "reuse (--claims none reuses one; without it every source is gathered)")


def left_out(sidecars: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """What a partial report leaves out, one sentence each: claim sources not gathered (and why), figures that
    failed or could not be drawn, and registered figures neither this run nor an earlier one left in the folder."""
    from figures.registry import load_all

    out = [f"claims of {src}: {why}" for src, why in meta.get("missing", {}).items()]
    present = {s["name"] for s in sidecars}
    skipped, failed = meta.get("figures_skipped", {}), meta.get("figures_failed", {})
    out += [f"figure {n}: not drawn, {why}" for n, why in skipped.items() if n not in present]
    out += [f"figure {n}: FAILED (the run's stderr has the traceback)" for n in failed if n not in present]
    absent = [n for n in load_all() if n not in present and n not in skipped and n not in failed]
    if absent:
        out.append(f"{len(absent)} figure(s) not drawn by this run and not in the output folder from an earlier "
                   f"one: {', '.join(absent)} (python -m figures --only NAME draws one)")
    return out


# ------------------------------------------------------------------------------------------- markdown


def _md(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _md_table(head: tuple[str, ...], rows: list[tuple[Any, ...]], empty: str) -> list[str]:
    """A Markdown table of ``rows`` (cells escaped), or the sentence ``empty`` when there are none."""
    if not rows:
        return [empty]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(_md(x) for x in r) + " |" for r in rows)]


def render_markdown(claims: list[Claim], proofs: list[Any], sidecars: list[dict[str, Any]],
                    meta: dict[str, Any]) -> str:
    fig_names = {s["name"] for s in sidecars}
    claim_ids = {c.id for c in claims}
    proofs_for = by_id(proofs)
    L = ["# rmsgauge: claims report", ""]
    L.append(f"Generated by `{meta.get('command', 'python -m figures')}`. "
             "Verification runs in float64; the GRT trains in float32; each row says which.")
    if meta.get("model"):
        L.append("")
        L.append(f"Trained-model figures: {meta['model']}")
    L += ["", "## Summary", ""]
    total = [("**all**", f"**{sum(c.holds for c in claims)}**", f"**{len(claims)}**")] if claims else []
    L += _md_table(("package", "hold", "claims"), [(p, ok, n) for p, (ok, n) in summary_counts(claims).items()]
                   + total, f"No claim records in this report: {NO_CLAIMS}.")
    if proofs:
        L.append(f"\nSymbolic proofs: {sum(p.holds for p in proofs)} of {len(proofs)} proved (sympy).")
    missing = left_out(sidecars, meta)
    if missing:
        L += ["", "## Left out of this report", ""] + [f"- {_md(x)}" for x in missing]
    L += ["", "## Claims", ""]
    L += _md_table(("verdict", "id", "source says", "stated", "source status", "ours", "tolerance", "dtype",
                    "exact law", "figure", "proof"),
                   [("**HOLDS**" if c.holds else "**FAILS**", f"`{c.id}`", c.statement, fmt(c.stated),
                     STATUS_NOTE.get(c.source_status, c.source_status), ours(c), fmt(c.tolerance), c.dtype,
                     c.exact_law or "–", f"[{c.figure}]({c.figure}.svg)" if c.figure in fig_names else "–",
                     ", ".join("proved" if p.holds else "NOT proved" for p in proofs_for.get(c.id, [])) or "–")
                    for c in claims], "No claim records (see the summary).")
    L += ["", "## Symbolic proofs (sympy)", ""]
    L += _md_table(("verdict", "claim id", "identity", "residual", "dimension"),
                   [("**PROVED**" if p.holds else "**NOT PROVED**", f"`{p.id}`", p.statement, f"`{p.residual}`",
                     p.dimension) for p in proofs], "No proofs in this report.")
    L += ["", "## Figures", ""]
    L += _md_table(("figure", "source text", "supports claims"),
                   [(f"[{s['name']}]({s['svg']})", s["source"], ", ".join(
                       f"`{c}`" + ("" if c in claim_ids else " (not in this report)") for c in s["claims"])
                     or "(illustration)") for s in sidecars], "No figures in this report.")
    for s in sidecars:
        L += ["", f"### {s['title']}", "", f"![{_md(s['title'])}]({s['svg']})", "", s["caption"]]
        if s.get("interactive"):
            L.append(f"\nInteractive 3-D view: open `index.html#fig-{s['name']}` (drag to rotate).")
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------------------- html

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 auto;max-width:1200px;
padding:1em 2em;color:#222;line-height:1.4;overflow-wrap:break-word}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;width:100%;font-size:.85em} th,td{border:1px solid #ddd;padding:4px 6px;
vertical-align:top;text-align:left;overflow-wrap:break-word} th{background:#f4f4f4;position:sticky;top:0}
th.v,td.v{white-space:nowrap}
table.claims{table-layout:fixed} table.claims td.fig{width:170px} td.fig img{width:160px;height:auto}
.dt{display:block;margin-bottom:.3em} .dt b{font-weight:600;color:#555}
tr.fails td{background:#fff0f0} .v-holds{color:#176d17;font-weight:bold} .v-fails{color:#b00;font-weight:bold}
.st-approximate{color:#8a5a00;font-weight:bold} .st-wrong{color:#b00;font-weight:bold} code{font-size:.95em}
figure{margin:1.5em 0;padding:1em;border:1px solid #e4e4e4;border-radius:6px} figure img{max-width:100%;
height:auto;display:block;margin:0 auto} figcaption{margin-top:.6em;font-size:.9em}
.iv{width:100%;height:560px;border-top:1px dashed #ccc;margin-top:.8em} .muted{color:#777}
details summary{cursor:pointer;color:#555} nav a{margin-right:1em;white-space:nowrap} ul.left-out li{margin:.2em 0}
.n{white-space:nowrap}
@media (max-width:900px){
body{padding:.5em 1em} figure{padding:.5em;margin:1em 0}
table.stack,table.stack thead,table.stack tbody,table.stack tr,table.stack td{display:block;width:auto}
table.stack thead{display:none} table.stack col{width:auto!important}
table.stack tr{border:1px solid #ddd;margin:0 0 .8em} table.stack td{border:0;border-bottom:1px solid #eee}
table.stack td::before{content:attr(data-label);display:block;font-size:.85em;font-weight:600;color:#555}
table.claims td.fig{width:auto}
}
"""

LOADER_JS = """
(function(){
  var root=document.documentElement, pending=[];
  function plot(el){
    var spec=JSON.parse(document.getElementById('ivdata-'+el.dataset.fig).textContent);
    return Plotly.newPlot(el, spec.data, spec.layout, {responsive:true, displaylogo:false});
  }
  window.addEventListener('load', function(){
    var ivs=document.querySelectorAll('div.iv');
    ivs.forEach(function(el){
      if(!window.Plotly){ el.textContent='plotly.min.js not found beside this page: 3-D view unavailable'; return; }
      try{ pending.push(plot(el)); }catch(e){ el.textContent='error: '+e; }
    });
    Promise.allSettled(pending).then(function(){
      var imgs=Array.prototype.slice.call(document.images);
      root.dataset.imagesTotal=imgs.length;
      root.dataset.imagesOk=imgs.filter(function(i){return i.complete && i.naturalWidth>0;}).length;
      root.dataset.claimRows=document.querySelectorAll('tr.claim').length;
      root.dataset.scrollWidth=document.documentElement.scrollWidth;
      root.dataset.viewWidth=window.innerWidth;
      root.dataset.proofRows=document.querySelectorAll('tr.proof').length;
      root.dataset.ivTotal=ivs.length;
      root.dataset.ivOk=document.querySelectorAll('div.iv.js-plotly-plot').length;
      root.dataset.selftest='done';
    });
  });
})();
"""


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:e[-+]?\d+)?")


def _numbers(text: str) -> str:
    """``text`` escaped, each number in a span that never breaks (a browser would split ``3.55e-13`` at its
    hyphen)."""
    out, at = [], 0
    for m in NUMBER.finditer(text):
        out += [_e(text[at:m.start()]), f'<span class="n">{_e(m.group(0))}</span>']
        at = m.end()
    return "".join(out) + _e(text[at:])


def _claim_row(group: list[Claim], proofs_for: dict[str, list[Any]], figure_files: dict[str, str]) -> str:
    """One row per claim id: its records (one per dtype) side by side in the "ours" cell, the statement, law
    and details collapsed under ``<details>``, and the claim's figure beside it (a thumbnail linking to it)."""
    c = group[0]
    holds = all(r.holds for r in group)
    verdict = '<span class="v-holds">HOLDS</span>' if holds else '<span class="v-fails">FAILS</span>'
    status = f'<span class="st-{_e(c.source_status)}">{_e(STATUS_NOTE.get(c.source_status, c.source_status))}</span>'
    if c.figure in figure_files:
        fig = (f'<a href="#fig-{_e(c.figure)}"><img src="{_e(figure_files[c.figure])}" alt="{_e(c.figure)}" '
               'loading="eager"></a>')
    else:
        fig = '<span class="muted">–</span>'
    pr = ", ".join("proved" if p.holds else "NOT proved" for p in proofs_for.get(c.id, [])) or "–"
    ours_cell = "".join(
        f'<span class="dt"><b>{_e(r.dtype)}</b> {"" if r.holds else "<b class=v-fails>FAILS</b> "}'
        f"{_numbers(ours(r))} <span class=muted>(tol {_numbers(fmt(r.tolerance))})</span></span>" for r in group)
    more = [f"<p><b>Source:</b> {_e(c.statement)}</p>"]
    if c.exact_law:
        more.append(f"<p><b>Exact law:</b> {_e(c.exact_law)}</p>")
    for r in group:
        more.append(f"<p><b>Measured ({_e(r.dtype)}):</b> {_numbers(fmt(r.measured))}</p>")
        if r.details:
            items = "".join(f"<li><code>{_e(k)}</code>: {_numbers(fmt(v))}</li>" for k, v in r.details.items())
            more.append(f"<p><b>Details ({_e(r.dtype)}):</b></p><ul>{items}</ul>")
    cells = [verdict, f"<code>{_e(c.id)}</code><details><summary>source, law, details</summary>{''.join(more)}"
             "</details>", _numbers(fmt(c.stated)), status, ours_cell, _e(pr), fig]
    cls = "claim" + ("" if holds else " fails")
    return (f'<tr class="{cls}" id="claim-{_e(c.id)}" data-claim-id="{_e(c.id)}" '
            f'data-dtype="{_e(" ".join(r.dtype for r in group))}">'
            + "".join(_td(x, label, k) for x, (label, k) in zip(cells, CLAIM_COLUMNS)) + "</tr>")


# the claims table's columns: header, cell class (v: a verdict, never wrapped; fig: the thumbnail)
CLAIM_COLUMNS = (("verdict", "v"), ("id", ""), ("stated", ""), ("source status", ""), ("ours (per dtype)", ""),
                 ("proof", ""), ("figure", "fig"))
PROOF_COLUMNS = (("verdict", "v"), ("claim id", ""), ("identity", ""), ("residual", ""), ("dimension", ""))


def _td(content: str, label: str, cls: str) -> str:
    """A cell that names its column (``data-label``: a narrow screen shows each row as a card of labelled cells)."""
    return f'<td{_class(cls)} data-label="{_e(label)}">{content}</td>'


def _thead(columns: tuple[tuple[str, str], ...]) -> str:
    return "<thead><tr>" + "".join(f"<th{_class(k)}>{_e(h)}</th>" for h, k in columns) + "</tr></thead>"


def _class(cls: str) -> str:
    return f' class="{cls}"' if cls else ""


def render_html(claims: list[Claim], proofs: list[Any], sidecars: list[dict[str, Any]], meta: dict[str, Any],
                interactive_json: dict[str, str]) -> str:
    claim_ids = {c.id for c in claims}
    proofs_for = by_id(proofs)
    H = ['<!DOCTYPE html>', '<html lang="en">', "<head>", '<meta charset="utf-8">',
         '<meta name="viewport" content="width=device-width, initial-scale=1">',
         "<title>rmsgauge: claims report</title>", f"<style>{CSS}</style>"]
    if interactive_json:
        H.append(f'<script src="{PLOTLY_JS}"></script>')
    missing = left_out(sidecars, meta)
    H += ["</head>", "<body>", "<h1>rmsgauge: claims report</h1>",
          f'<p class="muted">Generated by <code>{_e(meta.get("command", "python -m figures"))}</code>. '
          "Verification runs in float64; the GRT trains in float32; each row and caption says which.</p>",
          '<nav><a href="#claims">Claims</a><a href="#proofs">Proofs</a><a href="#figures">Figures</a>'
          + ('<a href="#left-out">Left out</a>' if missing else "") + '<a href="REPORT.md">REPORT.md</a></nav>']
    if meta.get("model"):
        H.append(f"<p><b>Trained-model figures:</b> {_e(meta['model'])}</p>")
    H.append("<h2>Summary</h2>")
    if claims:
        H.append("<table><tr><th>package</th><th>hold</th><th>claims</th></tr>")
        for pkg, (ok, n) in summary_counts(claims).items():
            H.append(f"<tr><td>{_e(pkg)}</td><td>{ok}</td><td>{n}</td></tr>")
        H.append(f"<tr><th>all</th><th>{sum(c.holds for c in claims)}</th><th>{len(claims)}</th></tr></table>")
    else:
        H.append(f"<p><b>No claim records in this report:</b> {_e(NO_CLAIMS)}.</p>")
    if proofs:
        H.append(f"<p>Symbolic proofs: {sum(bool(p.holds) for p in proofs)} of {len(proofs)} proved (sympy).</p>")
    if missing:
        H += ['<h2 id="left-out">Left out of this report</h2>', '<ul class="left-out">']
        H += [f"<li>{_e(x)}</li>" for x in missing]
        H.append("</ul>")
    H.append('<h2 id="claims">Claims</h2>')
    if claims:
        H += ['<table class="claims stack">',
              '<colgroup><col style="width:70px"><col style="width:22%"><col style="width:12%">'
              '<col style="width:10%"><col><col style="width:70px"><col style="width:170px"></colgroup>',
              _thead(CLAIM_COLUMNS), "<tbody>"]
        figure_files = {s["name"]: s["svg"] for s in sidecars}
        for group in by_id(claims).values():  # one row per claim id; gauge's float64 and float32 side by side
            H.append(_claim_row(group, proofs_for, figure_files))
        H.append("</tbody></table>")
    else:
        H.append('<p class="muted">No claim records (see the summary).</p>')
    H.append('<h2 id="proofs">Symbolic proofs (sympy)</h2>')
    if proofs:
        H += ['<table class="proofs stack">', _thead(PROOF_COLUMNS), "<tbody>"]
        for p in proofs:
            v = '<span class="v-holds">PROVED</span>' if p.holds else '<span class="v-fails">NOT PROVED</span>'
            cells = [v, f"<code>{_e(p.id)}</code>", _e(p.statement), f"<code>{_e(p.residual)}</code>",
                     _e(p.dimension)]
            H.append(f'<tr class="proof" data-claim-id="{_e(p.id)}">'
                     + "".join(_td(x, label, k) for x, (label, k) in zip(cells, PROOF_COLUMNS)) + "</tr>")
        H.append("</tbody></table>")
    else:
        H.append('<p class="muted">No proofs in this report.</p>')
    H.append('<h2 id="figures">Figures</h2>')
    if not sidecars:
        H.append('<p class="muted">No figures in this report.</p>')
    for source in ("gauge text", "GRT text"):
        group = [s for s in sidecars if s["source"] == source]
        if not group:
            continue
        H.append(f"<h3>From the {_e(source)}</h3>")
        for s in group:
            claims_html = ", ".join(
                f'<a href="#claim-{_e(c)}"><code>{_e(c)}</code></a>' if c in claim_ids
                else f'<code>{_e(c)}</code> <span class="muted">(not in this report)</span>' for c in s["claims"])
            H.append(f'<figure id="fig-{_e(s["name"])}">')
            H.append(f'<img src="{_e(s["svg"])}" alt="{_e(s["title"])}" loading="eager">')
            H.append(f'<figcaption><b>{_e(s["title"])}</b> <span class="muted">({_e(s["name"])}; '
                     f'<a href="{_e(s["svg"])}">SVG</a>, <a href="{_e(s["png"])}">PNG</a>)</span><br>'
                     f'{_e(s["caption"])}'
                     + (f"<br>Evidence for: {claims_html}" if claims_html else "")
                     + "</figcaption>")
            if s["name"] in interactive_json:
                n = _e(s["name"])
                data = interactive_json[s["name"]].replace("</", "<\\/")  # a JSON string cannot close the script
                H.append(f'<p class="muted">Interactive 3-D view: drag to rotate, scroll to zoom.</p>'
                         f'<div class="iv" data-fig="{n}"></div>'
                         f'<script type="application/json" id="ivdata-{n}">{data}</script>')
            H.append("</figure>")
    H += [f"<script>{LOADER_JS}</script>", "</body>", "</html>"]
    return "\n".join(H) + "\n"


def write_report(out_dir: str | Path, claims: list[Claim], proofs: list[Any], sidecars: list[dict[str, Any]],
                 meta: dict[str, Any]) -> list[Path]:
    """Write ``REPORT.md``, ``index.html`` and (when a 3-D view exists) ``plotly.min.js``, all atomically."""
    out_dir = Path(out_dir)
    inter = {s["name"]: (out_dir / s["interactive"]).read_text(encoding="utf-8") for s in sidecars
             if s.get("interactive") and (out_dir / s["interactive"]).is_file()}
    written = []
    if inter:
        from figures.interactive import plotly_js

        js = plotly_js()
        target = out_dir / PLOTLY_JS
        if not target.is_file() or target.read_text(encoding="utf-8") != js:
            atomic_write_text(target, js)
        written.append(target)
    written.append(atomic_write_text(out_dir / "REPORT.md", render_markdown(claims, proofs, sidecars, meta)))
    written.append(atomic_write_text(out_dir / "index.html", render_html(claims, proofs, sidecars, meta, inter)))
    return written


__all__ = ["render_html", "render_markdown", "write_report"]
