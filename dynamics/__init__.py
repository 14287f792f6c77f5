"""dynamics: weight-norm dynamics of an RMSNorm scale gauge under weight decay (``python dynamics.py``).

The exact laws live in :mod:`dynamics.laws`, the gauge weights in :mod:`dynamics.problems`, the training
loops in :mod:`dynamics.simulate`, and one check per claim in :mod:`dynamics.checks` (``run_all``).
"""

from dynamics import laws
from dynamics.checks import DynamicsPlan, run_all
from dynamics.problems import NoiseToy, PhaseToy, QKNormProblem, RegressionToy
from dynamics.simulate import OptimConfig, Stepper, Trace, run

__all__ = [
    "DynamicsPlan",
    "NoiseToy",
    "OptimConfig",
    "PhaseToy",
    "QKNormProblem",
    "RegressionToy",
    "Stepper",
    "Trace",
    "laws",
    "run",
    "run_all",
]
