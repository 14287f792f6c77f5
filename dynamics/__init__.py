"""dynamics: weight-norm dynamics of an RMSNorm scale gauge under weight decay (``python dynamics.py``).

The exact laws live in :mod:`dynamics.laws` (with :mod:`dynamics.heavyball` for the SGD family and
:mod:`dynamics.scalefree` for AdamW, Lion and Muon), the gauge weights in :mod:`dynamics.problems`, the training
loops in :mod:`dynamics.simulate` and :mod:`dynamics.noise_sim`, the claims as one group in :mod:`dynamics.checks`
(``CLAIMS``); the equilibrium monitor in :mod:`dynamics.monitor`, the rotational optimizers in
:mod:`dynamics.rotational`, and the Hugging Face ``Trainer`` callback in :mod:`dynamics.callback`
(``EquilibriumCallback``: imported on first use, since ``transformers`` is an optional extra).
"""

from typing import Any

from dynamics import laws
from dynamics.checks import CLAIMS
from dynamics.context import DynamicsPlan
from dynamics.heavyball import HeavyBall
from dynamics.lion import Lion
from dynamics.monitor import EquilibriumLagWarning, EquilibriumLogWarning, EquilibriumMonitor
from dynamics.problems import NoiseToy, PhaseToy, QKNormProblem, RegressionToy
from dynamics.rotational import rotational_adamw, rotational_lion, rotational_sgd
from dynamics.simulate import OptimConfig, Stepper, Trace, run

__all__ = [
    "CLAIMS", "DynamicsPlan", "EquilibriumCallback", "EquilibriumLagWarning", "EquilibriumLogWarning",
    "EquilibriumMonitor", "HeavyBall", "Lion", "NoiseToy", "OptimConfig", "PhaseToy", "QKNormProblem",
    "RegressionToy", "Stepper", "Trace", "laws", "rotational_adamw", "rotational_lion", "rotational_sgd", "run",
]


def __getattr__(name: str) -> Any:  # PEP 562: transformers is optional, imported only when the callback is asked for
    if name == "EquilibriumCallback":
        try:
            from dynamics.callback import EquilibriumCallback
        except ImportError as e:
            raise ImportError(f"dynamics.EquilibriumCallback needs transformers ({e}); "
                              "pip install 'rmsgauge[hf]'") from None
        return EquilibriumCallback
    raise AttributeError(f"module 'dynamics' has no attribute {name!r}")
