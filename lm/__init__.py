"""lm: the language-model foundation both texts stand on.

The dense pre-norm transformer with optional per-head QK-norm (the gauge text's model), RMSNorm, the
byte corpus and tokenizer, the training loop, checkpoints, sampling, the GRT-vs-dense comparison and the
benchmark.  It trains both model families: it imports :mod:`grt_model` (below it) and never
:mod:`gauge`, :mod:`dynamics` or :mod:`figures` (above it).
"""

from lm.corpus import VOCAB_SIZE, ByteCorpus, decode, encode, load_text
from lm.dense import DenseConfig, DenseTransformer
from lm.rmsnorm import RMSNorm, rms_norm, rms_norm_jacobian

__all__ = [
    "VOCAB_SIZE",
    "ByteCorpus",
    "DenseConfig",
    "DenseTransformer",
    "RMSNorm",
    "decode",
    "encode",
    "load_text",
    "rms_norm",
    "rms_norm_jacobian",
]
