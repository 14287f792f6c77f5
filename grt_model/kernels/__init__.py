"""The fast CPU path of the rotation cascade and the rule that decides when it runs.

``policy`` (the rule: :func:`use_kernels`; the dispatching :func:`rotation_cascade` and :func:`feed_forward`)
< ``fused`` (autograd functions around the kernels) < ``runtime`` (loads the kernels, runs their threads) <
the numba sources ``entry`` (the kernels Python calls), ``coupled``, ``rotate``, ``gelu``, ``scalar`` and
``jit`` (compile options and the on-disk cache keyed on all of them).  Importing this package does not import
numba: the runtime loads the kernels on first use.
"""

from grt_model.kernels.fused import TUNING, FusedStats, Tuning, cascade_fused, ffn_fused, fused_available
from grt_model.kernels.policy import MIN_TOKENS, feed_forward, rotation_cascade, use_kernels

__all__ = ["MIN_TOKENS", "TUNING", "FusedStats", "Tuning", "cascade_fused", "feed_forward", "ffn_fused",
           "fused_available", "rotation_cascade", "use_kernels"]
