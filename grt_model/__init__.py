"""grt_model: the Geometric Rotation Transformer, the dense baseline, the corpus.

Standalone: depends only on the ``rmsgauge`` core (claim record, tolerance, seed).
"""

from grt_model.butterfly import butterfly_pairs, stage_stride
from grt_model.cascade import RotationCascade, clifford_features, materialize, reference_cascade
from grt_model.corpus import VOCAB_SIZE, ByteCorpus, decode, encode, load_text
from grt_model.dense import DenseConfig, DenseTransformer
from grt_model.rmsnorm import RMSNorm, rms_norm, rms_norm_jacobian

__all__ = [
    "VOCAB_SIZE",
    "ByteCorpus",
    "DenseConfig",
    "DenseTransformer",
    "RMSNorm",
    "RotationCascade",
    "butterfly_pairs",
    "clifford_features",
    "decode",
    "encode",
    "load_text",
    "materialize",
    "reference_cascade",
    "rms_norm",
    "rms_norm_jacobian",
    "stage_stride",
]
