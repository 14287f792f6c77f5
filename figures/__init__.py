"""figures: every figure of the two source texts and the claims report, from one command.

``python -m figures`` (see ``figures/__main__.py``) draws each registered figure
deterministically (SVG + PNG), gathers every claim record by running the packages'
claim groups, and writes ``REPORT.md`` and ``index.html`` beside them.

Programmatic use::

    from figures import FigureContext, run, FIGURES, load_all
    ctx = FigureContext(out_dir="figures/out")
    run(list(load_all()), ctx)

Nothing imports ``figures`` (it is the top of the import graph).
"""

from figures.context import FigureContext
from figures.registry import FigureOutput, FigureUnavailable, figure, load_all
from figures.runner import run

__all__ = ["FigureContext", "FigureOutput", "FigureUnavailable", "figure", "load_all", "run"]
