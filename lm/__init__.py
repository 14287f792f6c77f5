"""lm: the language-model foundation both texts stand on: the dense QK-norm transformer, RMSNorm, training,
checkpoints, sampling, scoring, sizing and the Hugging Face bridge (the README's layout lists the modules).  It
imports :mod:`grt_model` and :mod:`rmsgauge`, never the packages above it."""

from lm.dense import DenseConfig, DenseTransformer
from lm.rmsnorm import RMSNorm, rms_norm, rms_norm_jacobian

__all__ = ["DenseConfig", "DenseTransformer", "RMSNorm", "rms_norm", "rms_norm_jacobian"]
