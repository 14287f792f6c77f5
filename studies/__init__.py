"""studies: the work that needs a trained model or a training run, above every other package but ``figures``.

The GRT experiment grid (:mod:`studies.experiments`, its runs in :mod:`studies.grid`, one run's process in
:mod:`studies.job`, the measurements in :mod:`studies.measure`, the tables and verdicts in
:mod:`studies.experiments_report`).
"""

from studies.grid import GROUPS, RunSpec, grid

__all__ = ["GROUPS", "RunSpec", "grid"]
