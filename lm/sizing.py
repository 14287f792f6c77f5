"""Model sizing, in one place for the recipes, the benchmark and the experiment grid: a GRT at a CPU size, the
dense model's closed-form parameter count, and the dense width matched to a parameter count."""

from __future__ import annotations

from typing import Any

from lm.dense import DenseConfig


def grt_config(quick: bool = False, **overrides: Any):
    """A GRT at a width a CPU can train (``quick``: a toy), the source's stage counts."""
    from grt_model.config import GRTConfig

    if quick:
        base = {"d_model": 32, "n_heads": 2, "n_blocks": 1, "d_ff": 64, "block_size": 32}
    else:
        base = {"d_model": 64, "n_heads": 2, "n_blocks": 2, "d_ff": 256, "block_size": 64}
    return GRTConfig.small(**{**base, **overrides})


def dense_params(d_model: int, n_heads: int, n_layers: int, d_ff: int, vocab: int = 256, qk_norm: bool = True,
                 tied: bool = True) -> int:
    r"""Closed-form parameter count of :class:`DenseTransformer`:
    :math:`Vd\,(\times 2 \text{ untied}) + L\,(4d^2 + 2 d\,d_{ff} + 2d + 2 d_h [\text{QK-norm}]) + d`."""
    per_layer = 4 * d_model * d_model + 2 * d_model * d_ff + 2 * d_model + (2 * (d_model // n_heads) if qk_norm else 0)
    return vocab * d_model * (1 if tied else 2) + n_layers * per_layer + d_model


def dense_family(grt_cfg, d_model: int) -> DenseConfig:
    """The dense baseline at width ``d_model`` with the GRT's depth, heads, context and vocabulary."""
    return DenseConfig(vocab_size=grt_cfg.vocab_size, block_size=grt_cfg.block_size, d_model=d_model,
                       n_heads=grt_cfg.n_heads, n_layers=grt_cfg.n_blocks, d_ff=4 * d_model, qk_norm=True,
                       rope=grt_cfg.rope, tie_embeddings=grt_cfg.tie_head)


def widths(n_heads: int, hi: int = 2048) -> list[int]:
    step = 2 * n_heads  # head dim must be even (rotary pairs)
    return list(range(step, hi + 1, step))


def param_matched_width(grt_cfg, target: int) -> int:
    """The dense width whose parameter count is nearest ``target`` (ties: the smaller width)."""
    return min(widths(grt_cfg.n_heads), key=lambda d: (abs(dense_params(
        d, grt_cfg.n_heads, grt_cfg.n_blocks, 4 * d, grt_cfg.vocab_size, True, grt_cfg.tie_head) - target), d))
