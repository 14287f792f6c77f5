"""The fast CPU path of the rotation cascade (``fused`` around the numba kernels of ``entry``, loaded on first use
by ``runtime``: importing this package does not import numba) and the rule that decides when it runs (``policy``).
"""

from grt_model.kernels.fused import TUNING, FusedStats, Tuning, cascade_fused, ffn_fused, fused_available
from grt_model.kernels.policy import MIN_TOKENS, feed_forward, rotation_cascade, use_kernels

__all__ = ["MIN_TOKENS", "TUNING", "FusedStats", "Tuning", "cascade_fused", "feed_forward", "ffn_fused",
           "fused_available", "rotation_cascade", "use_kernels"]
