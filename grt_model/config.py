r"""``GRTConfig``: every size of the Geometric Rotation Transformer in one typed dataclass.

The defaults are the source text's reference configuration (``../shared/seeds/001_cfb910613b442095.txt``);
stages per block (heads run in parallel, so a head-stacked cascade counts once):

.. math::  S_{block} = 4\,S_{qkvo} + S_{mixer} + 2\,S_{ffn} = 4\cdot 11 + 1 + 2\cdot 21 = 87,
           \qquad S_{total} = 12 \cdot 87 = 1044.

:meth:`GRTConfig.small` is the byte-level preset.  A config round-trips through a checkpoint as a plain dict:
``GRTConfig(**cfg.to_dict())``.  Choices the text leaves open are the fields commented so; two need more words:

* ``final_gain_init`` -- with a tied head the logits are :math:`\langle \gamma\odot\hat x, e_v\rangle` and a unit
  gain gives logit std :math:`\approx r_e\sqrt{P/2}\approx 6.3` (a loss near 20 at step 0), so ``None`` means
  :math:`1/\sqrt{P}` when tied (logit std :math:`\approx 0.56`) and 1 when untied.
* ``mixer_first_stage`` -- 0 (stride 1, pairs inside a head) is the schedule every cascade starts with; stride 1
  never crosses a head boundary, so the mixer crosses heads *only* through its coupling (:mod:`grt_model.model`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

PRESETS = ("reference", "small")
# The text says only that the coupling features are "normalized".  "pair_energy" divides them by the token's
# mean pair energy m (degree-0 features: the cascade stays homogeneous of degree 1, the fused kernels' form);
# "feature_rms" divides the raw features [e, x0, x1, area] by their RMS (an ablation: mixed degrees, eager only).
COUPLING_NORMS = ("pair_energy", "feature_rms")


# real fields: (lower bound, upper bound or None, the allowed range as printed; "(" and ")" are strict bounds)
REAL_RANGES = {"rope_base": (1.0, None, "(1, inf)"), "embed_radius_init": (0.0, None, "(0, inf)"),
               "gate_init": (0.0, 1.0, "(0, 1)"), "norm_eps": (0.0, None, "[0, inf)"),
               "coupling_init_std": (0.0, None, "[0, inf)"), "head_init_std": (0.0, None, "[0, inf)"),
               "final_gain_init": (0.0, None, "(0, inf)")}


def _is_pow2(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 2 and not n & (n - 1)


@dataclass
class GRTConfig:
    vocab_size: int = 50000  # the text's reference vocabulary (the byte corpus uses ids < 256 of it)
    block_size: int = 256  # context length in tokens; the text does not state one
    d_model: int = 256  # residual width: 128 pairs
    n_heads: int = 4  # d_head = 64: 32 pairs per head
    n_blocks: int = 12
    d_ff: int = 1024  # FFN width: input zero-padded 256 -> 1024 (512 pairs, 384 empty at the start)
    qkvo_stages: int = 11  # stages of each of Q, K, V, O
    mixer_stages: int = 1  # the mixer's single stage at d_model
    ffn_stages: int = 21  # stages of the FFN expand and (separately) of the contract cascade
    qkvo_coupling: bool = True  # Clifford coupling W [4P, P] per head per stage in Q, K, V, O
    mixer_coupling: bool = True  # the mixer's coupling: its only route across heads at stride 1
    ffn_coupling: bool = False  # the text: the FFN's angles are fixed (adapts only through RadialGELU)
    coupling_norm: str = "pair_energy"  # how the Clifford features are normalized: see COUPLING_NORMS
    mixer_first_stage: int = 0  # butterfly stage index of the mixer's first stage (0: stride 1)
    rope: bool = True  # rotary position on Q/K pairs (the text is silent on position; RoFormer, arXiv:2104.09864)
    rope_base: float = 10000.0
    tie_head: bool = True  # logits = PearlNorm(x) @ embedding.cartesian_table().T
    embed_radius_init: float = 0.79  # the text's block-0 ring radius (one magnitude per token)
    gate_init: float = 0.5  # g = sigmoid(logit) at init, the sigmoid's steepest point (the text gives only
    # trained block-0 values: 0.99/0.97/0.79)
    norm_eps: float = 0.0  # PearlNorm eps; 0 keeps it exactly homogeneous of degree 0 (a scale gauge)
    final_gain_init: float | None = None  # None: 1/sqrt(P) with a tied head (logit std ~0.56), 1 untied
    coupling_init_std: float = 0.02  # normal std of every coupling W at init (small nudges)
    head_init_std: float = 0.02  # normal std of an untied output head

    def __post_init__(self) -> None:
        for name, lo in (("vocab_size", 1), ("block_size", 1), ("n_heads", 1), ("n_blocks", 1), ("qkvo_stages", 1),
                         ("mixer_stages", 1), ("ffn_stages", 1), ("mixer_first_stage", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"GRTConfig.{name} must be an integer in [{lo}, inf), got {v!r}")
        for name in ("d_model", "d_ff"):
            if not _is_pow2(getattr(self, name)):
                raise ValueError(f"GRTConfig.{name} must be a power of two >= 2 (butterfly wiring pairs i with "
                                 f"i XOR 2^k), got {getattr(self, name)!r}")
        if self.d_model % self.n_heads or not _is_pow2(self.d_model // self.n_heads):
            raise ValueError(f"GRTConfig.n_heads must divide d_model={self.d_model} into power-of-two heads of "
                             f"width >= 2 (each head runs its own butterfly), got n_heads={self.n_heads}")
        if self.d_ff < self.d_model:
            raise ValueError(f"GRTConfig.d_ff must be in [d_model={self.d_model}, inf) (the FFN zero-pads "
                             f"d_model -> d_ff), got {self.d_ff}")
        for name in ("qkvo_coupling", "mixer_coupling", "ffn_coupling", "rope", "tie_head"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GRTConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.coupling_norm not in COUPLING_NORMS:
            raise ValueError(f"GRTConfig.coupling_norm must be one of {', '.join(COUPLING_NORMS)}, got "
                             f"{self.coupling_norm!r}")
        for name, (lo, hi, rng) in REAL_RANGES.items():
            v = getattr(self, name)
            if v is None and name == "final_gain_init":
                continue
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not (ok and (v > lo if rng[0] == "(" else v >= lo) and (hi is None or v < hi)):
                raise ValueError(f"GRTConfig.{name} must be a finite number in {rng}, got {v!r}")

    @classmethod
    def small(cls, **overrides: Any) -> GRTConfig:
        """Byte-level preset for the bundled corpus: vocabulary 256, d = 128 (4 heads of 32), 4 blocks,
        d_ff = 512, the text's stage counts (11 / 1 / 21) and couplings unchanged."""
        base = {"vocab_size": 256, "block_size": 128, "d_model": 128, "n_heads": 4, "n_blocks": 4, "d_ff": 512}
        return cls(**{**base, **overrides})

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GRTConfig:
        """``reference`` (the text's configuration: the dataclass defaults) or :meth:`small`, with overrides."""
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got {name!r}")
        return cls.small(**overrides) if name == "small" else cls(**overrides)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def pairs(self) -> int:
        """P = d_model / 2 pairs in the residual stream."""
        return self.d_model // 2

    @property
    def head_pairs(self) -> int:
        return self.d_head // 2

    @property
    def ffn_pairs(self) -> int:
        return self.d_ff // 2

    @property
    def resolved_final_gain_init(self) -> float:
        if self.final_gain_init is not None:
            return float(self.final_gain_init)
        return 1.0 / math.sqrt(self.pairs) if self.tie_head else 1.0

    def stage_counts(self) -> dict[str, int]:
        """Rotation stages per projection, per block and in total (the text: 87 per block, 1,044 in all).

        Heads run in parallel inside one cascade call, so Q counts ``qkvo_stages`` once, not once per head.
        """
        per = {**dict.fromkeys(("q", "k", "v", "o"), self.qkvo_stages), "mixer": self.mixer_stages,
               "ffn_expand": self.ffn_stages, "ffn_contract": self.ffn_stages}
        block = sum(per.values())
        return {**per, "per_block": block, "n_blocks": self.n_blocks, "total": block * self.n_blocks}
