"""lm: the language-model foundation both texts stand on.

The dense pre-norm transformer with optional per-head QK-norm (the gauge text's model), RMSNorm, the
training loop, checkpoints, sampling, scoring on the whole validation split, model sizing, the Hugging Face
classes and the benchmark.  It trains both model families on the bundled byte corpus
(:mod:`rmsgauge.corpus`, below it): it imports :mod:`grt_model` and :mod:`rmsgauge` and never :mod:`gauge`,
:mod:`dynamics`, :mod:`studies` or :mod:`figures` (above it).
"""

from lm.dense import DenseConfig, DenseTransformer
from lm.rmsnorm import RMSNorm, rms_norm, rms_norm_jacobian

__all__ = [
    "DenseConfig",
    "DenseTransformer",
    "RMSNorm",
    "rms_norm",
    "rms_norm_jacobian",
]
