"""figures: every figure of the two source texts and the claims report, from one command (``python -m figures``).

Programmatic use: ``run(list(load_all()), FigureContext(out_dir="figures/out"))``.  Nothing imports ``figures`` (it
is the top of the import graph).
"""

from figures.context import FigureContext
from figures.registry import FigureOutput, FigureUnavailable, figure, load_all
from figures.runner import run

__all__ = ["FigureContext", "FigureOutput", "FigureUnavailable", "figure", "load_all", "run"]
