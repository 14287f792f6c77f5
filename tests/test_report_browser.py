"""The report page in a real headless browser (Debian's chromium): it loads, every image renders, every
claim row is present, the 3-D views draw, and a screenshot is not blank.

The page writes its own load counters onto ``<html>`` once everything has loaded
(``figures.report.LOADER_JS``); ``chromium --dump-dom`` returns the DOM after the
virtual-time budget, so the counters are read from it.  Skipped only where no
chromium binary exists outside CI; under CI (``CI`` set) a missing browser is a failure,
since ``.ci/run`` installs it (``apt-get install -y chromium``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from report_samples import synthetic_claims, synthetic_proofs  # tests/ is on the path (conftest's folder)

from figures import FigureContext, load_all, run
from figures.model_source import write_untrained_checkpoint
from figures.registry import read_sidecars

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((p for p in map(shutil.which, BROWSERS) if p), None)
VIRTUAL_TIME_MS = 15_000  # page time for plotly (4.8 MB script) to parse and draw every 3-D view
WALL_TIMEOUT_S = 180  # a hung browser fails the test instead of the CI job
TRAINED_SUBSET = ("grt.fig_q_pair_trace", "grt.fig_gates")  # one with a 3-D view, one without

if BROWSER is None and os.environ.get("CI"):
    raise RuntimeError("CI is set but no chromium is in PATH: .ci/run must install it (apt-get install -y chromium)")
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no chromium in PATH (CI installs it: apt-get install -y "
                                                        "chromium); the browser check needs a real browser")


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
           "--no-first-run", f"--user-data-dir={profile}", f"--virtual-time-budget={VIRTUAL_TIME_MS}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=WALL_TIMEOUT_S, check=False)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A fast subset of figures (static GRT figures + two trained-model figures, one with a 3-D view) and the
    report with synthetic claims (HTML-special characters included) and the real proofs."""
    root = tmp_path_factory.mktemp("report")
    ckpt = write_untrained_checkpoint(root / "tiny.pt")
    out = root / "out"
    names = [n for n, s in load_all().items() if s.fast] + list(TRAINED_SUBSET)
    ctx = FigureContext(out_dir=out, quick=True, checkpoint=ckpt)
    proofs = synthetic_proofs()
    res = run(names, ctx, claims=synthetic_claims(), proofs=proofs, command="python -m figures --quick")
    assert not res.log.failed, res.log.failed
    return {"out": out, "claims": res.claims, "proofs": res.proofs, "sidecars": read_sidecars(out),
            "profile": root / "profile"}


def test_page_loads_renders_every_image_and_lists_every_claim(page):
    r = _chromium(page["profile"], "--dump-dom", (page["out"] / "index.html").as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    m = re.search(r"<html[^>]*>", dom)
    assert m, dom[:500]
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', m.group(0)))
    assert attrs.get("selftest") == "done", f"page script did not finish: {m.group(0)}"
    n_fig = len(page["sidecars"])
    thumbs = len({c.id for c in page["claims"] if c.figure in {s["name"] for s in page["sidecars"]}})
    assert int(attrs["images-total"]) == n_fig + thumbs  # every figure, and each claim row's thumbnail
    assert int(attrs["images-ok"]) == n_fig + thumbs, "some <img> did not render (naturalWidth == 0)"
    assert int(attrs["claim-rows"]) == len({c.id for c in page["claims"]})  # one row per claim, dtypes side by side
    assert int(attrs["proof-rows"]) == len(page["proofs"])
    n_iv = sum(1 for s in page["sidecars"] if s.get("interactive"))
    assert n_iv >= 1
    assert int(attrs["iv-total"]) == n_iv and int(attrs["iv-ok"]) == n_iv, "a 3-D view did not draw"
    for c in page["claims"]:
        assert f'data-claim-id="{c.id}"' in dom
    assert "&lt;wording&gt;" in dom  # escaped source text survives as text


def test_no_horizontal_scroll_at_1400_px(page):
    r = _chromium(page["profile"], "--window-size=1400,1000", "--dump-dom", (page["out"] / "index.html").as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', re.search(r"<html[^>]*>", r.stdout).group(0)))
    assert int(attrs["scroll-width"]) <= int(attrs["view-width"]), attrs


def test_screenshot_is_not_blank(page, tmp_path):
    shot = tmp_path / "page.png"
    r = _chromium(page["profile"], "--window-size=1280,2400", f"--screenshot={shot}",
                  (page["out"] / "index.html").as_uri())
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)[..., :3]  # (H, W, 3) floats in [0, 1]
    assert img.shape[0] >= 2000 and img.shape[1] >= 1200
    non_white = float((img.min(axis=-1) < 0.9).mean())
    assert non_white > 0.05, f"screenshot is nearly blank ({non_white:.3%} non-white pixels)"
    assert len(np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 50  # text, plots, colours


def test_page_needs_nothing_from_the_network(page):
    html = (page["out"] / "index.html").read_text(encoding="utf-8")
    srcs = re.findall(r'(?:src|href)="([^"#]+)"', html)
    assert srcs, "no local references found"
    for s in srcs:
        assert "://" not in s, f"external reference {s}"
        assert (page["out"] / s).is_file(), f"missing local file {s}"
