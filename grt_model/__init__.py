"""grt_model: the Geometric Rotation Transformer, the dense baseline, the corpus.

Standalone: depends only on the ``rmsgauge`` core (claim record, tolerance, seed).
"""

from grt_model.butterfly import butterfly_pairs, stage_stride
from grt_model.cascade import RotationCascade, clifford_features, materialize, reference_cascade
from grt_model.config import GRTConfig
from grt_model.corpus import VOCAB_SIZE, ByteCorpus, decode, encode, load_text
from grt_model.dense import DenseConfig, DenseTransformer
from grt_model.embedding import PhaseEmbedding, from_polar, to_polar
from grt_model.model import GRT, BlockTrace, CascadeTrace, GRTBlock, GRTTrace
from grt_model.pearlnorm import PearlNorm, pearl_norm
from grt_model.radial_gelu import RadialGELU, radial_gelu
from grt_model.rmsnorm import RMSNorm, rms_norm, rms_norm_jacobian

__all__ = [
    "GRT",
    "VOCAB_SIZE",
    "BlockTrace",
    "ByteCorpus",
    "CascadeTrace",
    "DenseConfig",
    "DenseTransformer",
    "GRTBlock",
    "GRTConfig",
    "GRTTrace",
    "PearlNorm",
    "PhaseEmbedding",
    "RMSNorm",
    "RadialGELU",
    "RotationCascade",
    "butterfly_pairs",
    "clifford_features",
    "decode",
    "encode",
    "from_polar",
    "load_text",
    "materialize",
    "pearl_norm",
    "radial_gelu",
    "reference_cascade",
    "rms_norm",
    "rms_norm_jacobian",
    "stage_stride",
    "to_polar",
]
