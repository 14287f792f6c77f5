"""Which code computes a cascade or the GRT FFN, decided from the tensors alone: the one rule is :func:`use_kernels`.

Calls it turns down run the eager PyTorch code of :mod:`grt_model.cascade_ops` (any device and dtype, derivatives
of any order).  Both compute the same function (``tests/test_fast_cascade.py``), so the rule decides speed, never
the result beyond round-off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from grt_model.cascade_ops import cascade_eager
from grt_model.kernels.fused import cascade_fused, ffn_fused, fused_available
from grt_model.radial_gelu import radial_gelu

__all__ = ["MIN_TOKENS", "feed_forward", "rotation_cascade", "use_kernels"]

# Small calls (sampling, tiny tests) run eager and never pay the kernels' one-time compile (~1 min per dtype,
# cached on disk afterwards).  Measured (shipped widths, fwd+bwd, 1 thread): fused beats eager from 64 tokens on
# (Q/K/V 4x, FFN 6x; the mixer at parity below 256); 512 keeps a two-process data-parallel shard of the trainer's
# 16 x 64 batch on the kernels.
MIN_TOKENS = 512


def use_kernels(x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether a call on input ``x [..., features]`` with these parameter tensors runs the fused kernels."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    if x.numel() < MIN_TOKENS * max(1, x.shape[-1]):
        return False
    tensors = [x, *(p for p in params if p is not None)]
    if any(p.dtype != x.dtype or p.device != x.device for p in tensors):
        return False  # mixed dtypes: the eager path's type promotion decides
    if any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors):
        return False  # torch.func transforms need the eager graph
    return fused_available()


def rotation_cascade(x: torch.Tensor, angles: torch.Tensor, raw_scales: torch.Tensor, coupling: torch.Tensor | None,
                     width: int, first_stage: int, feature_norm: str) -> torch.Tensor:
    """The cascade's function (arguments: :func:`~grt_model.cascade_ops.cascade_eager`), on the path the rule
    picks; the kernels implement ``pair_energy`` features only."""
    if (coupling is None or feature_norm == "pair_energy") and use_kernels(x, angles, raw_scales, coupling):
        return cascade_fused(x, angles, raw_scales, coupling, width, first_stage)
    return cascade_eager(x, angles, raw_scales, coupling, width, first_stage, feature_norm)


def feed_forward(z: torch.Tensor, expand: nn.Module, contract: nn.Module, d_out: int) -> torch.Tensor:
    r""":math:`\Pi\,C_2(\operatorname{RadialGELU}(C_1(\Pi^\top z)))` for two rotation cascades of one width:
    zero-pad ``z`` to it, expand, RadialGELU, contract, keep the first ``d_out`` coordinates.  One fused kernel
    per direction where both cascades are coupling-off and the rule allows, else the cascades' own calls."""
    params = (expand.angles, expand.raw_scales, contract.angles, contract.raw_scales)
    if expand.coupling is None and contract.coupling is None and use_kernels(z, *params):
        return ffn_fused(z, *params, d_out)
    return contract(radial_gelu(expand(F.pad(z, (0, expand.width - z.shape[-1])))))[..., :d_out]
