"""grt_model: the Geometric Rotation Transformer alone (cascade fast + reference, embedding, PearlNorm,
RadialGELU, blocks, accounting, its claims).

Standalone: depends only on the ``rmsgauge`` core (claim record, tolerance, seed); the language-model
foundation that trains it (dense baseline, corpus, training loop, checkpoints) is :mod:`lm`, one level up.
"""

from grt_model.butterfly import butterfly_pairs, stage_stride
from grt_model.cascade import RotationCascade, clifford_features, materialize, reference_cascade
from grt_model.config import GRTConfig
from grt_model.embedding import PhaseEmbedding, from_polar, to_polar
from grt_model.model import GRT, GRTBlock
from grt_model.pearlnorm import PearlNorm, pearl_norm
from grt_model.radial_gelu import RadialGELU, radial_gelu
from grt_model.trace import trace_model

__all__ = [
    "GRT", "GRTBlock", "GRTConfig", "PearlNorm", "PhaseEmbedding", "RadialGELU", "RotationCascade",
    "butterfly_pairs", "clifford_features", "from_polar", "materialize", "pearl_norm", "radial_gelu",
    "reference_cascade", "stage_stride", "to_polar", "trace_model",
]
