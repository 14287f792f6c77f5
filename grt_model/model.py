r"""The Geometric Rotation Transformer: blocks of normalize-process-gate-add around rotation cascades.

Source: ``../shared/seeds/001_cfb910613b442095.txt``.  One block (sizes from :class:`~grt_model.config.GRTConfig`):

.. math::
   x &\leftarrow x + g_{attn}\;O\big(\operatorname{Attn}(Q(\hat x), K(\hat x), V(\hat x))\big),
      &\hat x = \operatorname{PearlNorm}_1(x)\\
   x &\leftarrow x + g_{mix}\;M(\operatorname{PearlNorm}_2(x))\\
   x &\leftarrow x + g_{ffn}\;\Pi\,C_2\big(\operatorname{RadialGELU}(C_1(\Pi^\top \operatorname{PearlNorm}_3(x)))\big)

* **Q, K, V, O**: each head's own cascade on its :math:`d_{head}` slice; Q, K and V are *one*
  :class:`RotationCascade` call with ``heads = 3 n_heads`` (cascade head :math:`jH + h` is projection
  :math:`j\in\{q,k,v\}` of head :math:`h`), O a second one.
* **Attention**: causal :math:`\operatorname{softmax}(QK^\top/\sqrt{d_{head}})V` with rotary position (RoFormer,
  arXiv:2104.09864) on the adjacent Q/K pairs when ``config.rope``.  Per head
  :math:`q\cdot k = \sum_p r^q_p r^k_p\cos(\varphi^k_p-\varphi^q_p)`: the text's "each pair contributing the
  cosine of its Q-K angle gap" (:meth:`grt_model.trace.BlockTrace.qk_angle_gap`).
* **Mixer**: its stage has stride 1, whose pairs never straddle a head boundary, so it crosses heads **only
  through the coupling**: pair :math:`p`'s nudge :math:`\tanh(F W_{:,p})` reads the features of every pair of
  the token.  The cross-head Jacobian block into a head has rank at most its pair count, against rank 1 before
  the mixer (PearlNorm's single per-token factor).
* **FFN** (coupling off): :math:`\Pi^\top` zero-pads :math:`d_{model}` to :math:`d_{ff}`, expand :math:`C_1`,
  RadialGELU, contract :math:`C_2`, and :math:`\Pi` **keeps the first** :math:`d_{model}` **coordinates**.  Why
  truncation: :math:`\Pi` is the adjoint of the padding (:math:`\lVert\Pi\rVert_2 = 1`), so the linear part
  :math:`\Pi C_2 G C_1 \Pi^\top` is a compression of rotations and never amplifies beyond the scales (the text's
  "can't blow up"); summing the four blocks instead would be a fixed map of norm 2.  21 stages exceed
  :math:`\log_2 d_{ff} = 10`, so every kept output still depends on every input of :math:`C_2`.
* **Gates** :math:`g = \sigma(\ell)\in(0,1)` per sublayer (``gate_logits [3]``: attention, mixer, FFN): a write
  can be damped but neither flipped nor amplified, as the text's trained block-0 gates 0.99 / 0.97 / 0.79.
* Final PearlNorm; logits :math:`= \hat x\,E^\top` with :math:`E` the phase embedding's rebuilt table
  (``tie_head``) or a dense untied head.

**The residual Jacobian** :math:`I + J_f` of a sublayer can have a negative determinant (the text).
:math:`\lVert J_f\rVert_2 < 1` suffices for :math:`\det(I + J_f) > 0`: every eigenvalue has :math:`|\lambda| < 1`,
so real ones give :math:`1+\lambda > 0` and conjugate pairs :math:`|1+\lambda|^2 > 0`.  For the mixer
:math:`J_f = g\,J_M J_{PN}` with :math:`\lVert J_{PN}\rVert_2 \le \lVert\gamma\rVert_\infty \rho/\mu^2`
(:mod:`grt_model.pearlnorm`).  Witness of a negative determinant: mixer angles :math:`\pi`, unit scales, coupling
off, gain 1 give :math:`\det(I+J_f) = (1 - g/\mu)^{d-1}`, negative for even :math:`d` once the token's mean pair
radius :math:`\mu < g`.

Heads are stacked in the cascade calls and tokens in the batch dims: the only Python loops run over blocks and
stages.  ``GRT(cfg, dtype=torch.float64)`` builds in float64 directly (exact unit scales).  The traced forward is
:func:`grt_model.trace.trace_model`; the attention seam is :mod:`grt_model.attention`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from grt_model.attention import causal_attention_with_weights, current_override, explicit_attention_active
from grt_model.cascade import RotationCascade
from grt_model.config import GRTConfig
from grt_model.embedding import PhaseEmbedding
from grt_model.kernels import feed_forward
from grt_model.pearlnorm import PearlNorm
from grt_model.rope import apply_rope, rope_angles

__all__ = ["GATE_NAMES", "GRT", "GRTFFN", "GRTAttention", "GRTBlock", "GRTMixer"]

GATE_NAMES = ("attn", "mixer", "ffn")  # a block's three sublayers, in order; its gates follow this order


class GRTAttention(nn.Module):
    """Q/K/V as one head-stacked cascade, causal softmax attention (+RoPE), O cascade per head."""

    def __init__(self, cfg: GRTConfig, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.rope, self.rope_base = cfg.rope, cfg.rope_base
        self.layer_index = 0  # its block's index (set by GRT): what an attention override keys a cache by
        kw = {"coupling_init_std": cfg.coupling_init_std, "feature_norm": cfg.coupling_norm, "dtype": dtype,
              "device": device}
        # one call for Q, K, V of every head: cascade head j*H + h = projection j (q, k, v) of head h
        self.qkv = RotationCascade(cfg.d_head, cfg.qkvo_stages, coupling=cfg.qkvo_coupling,
                                   heads=3 * cfg.n_heads, **kw)
        self.o = RotationCascade(cfg.d_head, cfg.qkvo_stages, coupling=cfg.qkvo_coupling, heads=cfg.n_heads, **kw)

    def split_heads(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[B, T, 3*H*dh]`` of the Q/K/V cascade -> q, k, v, each ``[B, H, T, dh]``."""
        B, T = y.shape[:2]
        return y.view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)

    def position(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Q and K as the scores see them: rotary position applied when ``config.rope``."""
        if not self.rope:
            return q, k
        ang = rope_angles(q.shape[-2], self.d_head, self.rope_base, dtype=q.dtype, device=q.device)  # (T, dh/2)
        return apply_rope(q, ang), apply_rope(k, ang)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if z.dim() != 3:
            raise ValueError(f"GRTAttention expects (B, T, D), got shape {tuple(z.shape)}")
        # the cascade broadcasts its H input heads to its 3H heads (q, k, v read the same slice): no copy
        q, k, v = self.split_heads(self.qkv(z))  # 3 x (B, H, T, dh)
        if (override := current_override()) is not None:  # e.g. lm.hf_classes: cached keys at absolute positions
            a = override(self, q, k, v)
        elif explicit_attention_active():
            a = causal_attention_with_weights(*self.position(q, k), v)[0]
        else:
            a = F.scaled_dot_product_attention(*self.position(q, k), v, is_causal=True)  # (B, H, T, dh)
        return self.o(a.transpose(1, 2).reshape(z.shape))  # heads back to the token: (B, T, H*dh)


class GRTFFN(nn.Module):
    """Zero-pad d_model -> d_ff, expand cascade, RadialGELU, contract cascade, keep the first d_model coords."""

    def __init__(self, cfg: GRTConfig, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.d_model, self.d_ff = cfg.d_model, cfg.d_ff
        kw = {"coupling_init_std": cfg.coupling_init_std, "feature_norm": cfg.coupling_norm, "dtype": dtype,
              "device": device}
        self.expand = RotationCascade(cfg.d_ff, cfg.ffn_stages, coupling=cfg.ffn_coupling, **kw)
        self.contract = RotationCascade(cfg.d_ff, cfg.ffn_stages, coupling=cfg.ffn_coupling, **kw)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return feed_forward(z, self.expand, self.contract, self.d_model)


class GRTMixer(nn.Module):
    """One (or ``mixer_stages``) coupled rotation stage(s) across the whole d_model token."""

    def __init__(self, cfg: GRTConfig, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.cascade = RotationCascade(cfg.d_model, cfg.mixer_stages, coupling=cfg.mixer_coupling,
                                       first_stage=cfg.mixer_first_stage, feature_norm=cfg.coupling_norm,
                                       coupling_init_std=cfg.coupling_init_std, dtype=dtype, device=device)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.cascade(z)


class GRTBlock(nn.Module):
    """Three normalize-process-gate-add cycles: attention, mixer, FFN (see the module docstring)."""

    def __init__(self, cfg: GRTConfig, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        D, eps = cfg.d_model, cfg.norm_eps
        self.norm_attn = PearlNorm(D, eps, **kw)
        self.attn = GRTAttention(cfg, **kw)
        self.norm_mixer = PearlNorm(D, eps, **kw)
        self.mixer = GRTMixer(cfg, **kw)
        self.norm_ffn = PearlNorm(D, eps, **kw)
        self.ffn = GRTFFN(cfg, **kw)
        logit = math.log(cfg.gate_init / (1.0 - cfg.gate_init))
        self.gate_logits = nn.Parameter(torch.full((3,), logit, **kw))  # (3,) attn, mixer, ffn; g = sigmoid

    def gates(self) -> torch.Tensor:
        """``[3]`` gates in (0, 1): attention, mixer, FFN."""
        return torch.sigmoid(self.gate_logits)

    def sublayer(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """The residual branch ``f`` of one cycle (``x + f(x)``): ``g * process(PearlNorm(x))``."""
        if name not in GATE_NAMES:
            raise ValueError(f"sublayer name must be one of {GATE_NAMES}, got {name!r}")
        i = GATE_NAMES.index(name)
        norm, proc = ((self.norm_attn, self.attn), (self.norm_mixer, self.mixer), (self.norm_ffn, self.ffn))[i]
        return self.gates()[i] * proc(norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in GATE_NAMES:
            x = x + self.sublayer(name, x)
        return x


class GRT(nn.Module):
    """The Geometric Rotation Transformer; ``forward(idx, targets=None) -> (logits, loss)``.

    Same interface as :class:`lm.dense.DenseTransformer`; ``model.config`` is
    the :class:`GRTConfig`.  ``idx`` is ``[B, T]`` long token ids with
    ``T <= config.block_size``.
    """

    def __init__(self, config: GRTConfig, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        if not isinstance(config, GRTConfig):
            raise TypeError(f"GRT needs a GRTConfig, got {type(config).__name__}")
        self.config = config
        kw = {"dtype": dtype, "device": device}
        self.embed = PhaseEmbedding(config.vocab_size, config.pairs, config.embed_radius_init, **kw)
        self.blocks = nn.ModuleList(GRTBlock(config, **kw) for _ in range(config.n_blocks))
        for i, blk in enumerate(self.blocks):
            blk.attn.layer_index = i
        self.norm_f = PearlNorm(config.d_model, config.norm_eps, gain_init=config.resolved_final_gain_init, **kw)
        self.head = None if config.tie_head else nn.Linear(config.d_model, config.vocab_size, bias=False, **kw)
        if self.head is not None:
            nn.init.normal_(self.head.weight, 0.0, config.head_init_std)

    def check_idx(self, idx: torch.Tensor) -> None:
        if idx.dim() != 2:
            raise ValueError(f"idx must be (B, T) token ids, got shape {tuple(idx.shape)}")
        if idx.shape[1] > self.config.block_size:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds block_size {self.config.block_size}")

    def gates(self) -> torch.Tensor:
        """``[n_blocks, 3]`` residual gates in (0, 1) per block: attention, mixer, FFN."""
        return torch.stack([b.gates() for b in self.blocks])

    def output_weight(self) -> torch.Tensor:
        """``[V, D]``: the embedding's rebuilt Cartesian table (tied) or the untied head's weight."""
        return self.embed.cartesian_table() if self.head is None else self.head.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        self.check_idx(idx)
        x = self.embed(idx)  # (B, T, D) rebuilt from phases + magnitudes
        for blk in self.blocks:
            x = blk(x)
        logits = self.norm_f(x) @ self.output_weight().T  # (B, T, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
