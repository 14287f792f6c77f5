r"""The Geometric Rotation Transformer: blocks of normalize-process-gate-add around rotation cascades.

Source: ``../shared/seeds/001_cfb910613b442095.txt``.  One block (all sizes from
:class:`~grt_model.config.GRTConfig`; reference numbers in brackets):

.. math::
   x &\leftarrow x + g_{attn}\;O\big(\operatorname{Attn}(Q(\hat x), K(\hat x), V(\hat x))\big),
      &\hat x = \operatorname{PearlNorm}_1(x)\\
   x &\leftarrow x + g_{mix}\;M(\operatorname{PearlNorm}_2(x))\\
   x &\leftarrow x + g_{ffn}\;\Pi\,C_2\big(\operatorname{RadialGELU}(C_1(\Pi^\top \operatorname{PearlNorm}_3(x)))\big)

* **Q, K, V, O** [11 stages each, coupling on]: each head's own cascade on its own
  :math:`d_{head}` [64] slice.  Q, K and V are *one* :class:`RotationCascade` call with
  ``heads = 3 n_heads``: the normalized token is broadcast to ``[..., 3, H, d_head]``
  and flattened, so cascade head :math:`jH + h` is projection :math:`j\in\{q,k,v\}`
  of head :math:`h`.  O is a second cascade with ``heads = n_heads``.
* **Attention**: standard causal :math:`\operatorname{softmax}(QK^\top/\sqrt{d_{head}})V`
  (``F.scaled_dot_product_attention``), with rotary position (RoFormer,
  arXiv:2104.09864) on the adjacent Q/K pairs when ``config.rope`` -- the text is
  silent on position; a rotation model should encode it as rotation.  Per head
  :math:`q\cdot k = \sum_p r^q_p r^k_p\cos(\varphi^k_p-\varphi^q_p)`: the text's "each pair
  contributing the cosine of its Q-K angle gap" (see :meth:`grt_model.trace.BlockTrace.qk_angle_gap`).
* **Mixer** [1 stage at :math:`d_{model}` = 256, coupling on]: its only stage has
  stride :math:`2^{\,\text{first\_stage} \bmod \log_2 d}` = 1, pairing coordinates
  :math:`(2p, 2p+1)`, which never straddle a head boundary (multiples of
  :math:`d_{head}`).  So the mixer's *rotation wiring* stays inside each head; it
  crosses heads **only through the coupling**: pair :math:`p`'s nudge
  :math:`\Delta\theta_p = \tanh(F W_{:,p})` reads the features of all 128 pairs (all
  four heads), and the features are normalized by the mean pair energy of the
  whole token.  With ``mixer_coupling=False`` the mixer would not cross heads at
  all (tested).  The cross-head Jacobian block into a head has rank at most its
  pair count (one angle per pair), against rank 1 before the mixer (only through
  PearlNorm's single per-token factor).
* **FFN** [21 + 21 stages at :math:`d_{ff}` = 1024, coupling off]: :math:`\Pi^\top`
  zero-pads the :math:`d_{model}` coordinates to :math:`d_{ff}` (coordinates
  :math:`0..d_{model}-1` carry the signal: 128 of 512 pairs), expand cascade
  :math:`C_1`, RadialGELU, contract cascade :math:`C_2`, and :math:`\Pi` **keeps the first**
  :math:`d_{model}` **coordinates** ("the 512-pair signal shrinks back to 128 pairs").
  Why truncation: :math:`\Pi` is the adjoint of the zero padding (a coordinate
  projection, :math:`\lVert\Pi\rVert_2 = 1`), so with coupling off the FFN's linear
  part :math:`\Pi C_2 G C_1 \Pi^\top` is a compression of rotations and can never
  amplify beyond the scales -- the text's "can't blow up" story survives; summing
  the four 256-blocks instead would be a fixed map of norm 2, not a rotation.
  Information from all 512 pairs still reaches the kept 128: 21 stages exceed
  :math:`\log_2 d_{ff}` = 10, so every kept output depends on every input
  coordinate of :math:`C_2` (the mixing property).
* **Gates** :math:`g = \sigma(\ell)\in(0,1)` per sublayer (``gate_logits [3]``,
  order attention, mixer, FFN): a write can be damped but neither flipped in sign
  nor amplified past the sublayer itself, matching the text's trained block-0
  values 0.99 / 0.97 / 0.79 (all in (0, 1)).  Init :math:`g = ` ``config.gate_init``.
* Final PearlNorm; logits :math:`= \hat x\,E^\top` with :math:`E` the phase embedding's
  rebuilt ``[V, d]`` table (``tie_head``) or a dense untied head.

**The residual Jacobian.**  A sublayer :math:`f` gives :math:`\partial(x + f(x)) = I + J_f`.
The text says its determinant "can go negative".  Sufficient condition for
:math:`\det(I + J_f) > 0`: :math:`\lVert J_f\rVert_2 < 1`.  Proof: every eigenvalue
:math:`\lambda` of :math:`J_f` has :math:`|\lambda|\le\lVert J_f\rVert_2 < 1`;
:math:`\det(I+J_f) = \prod_i (1+\lambda_i)`; a real :math:`\lambda` gives
:math:`1+\lambda > 0`; complex ones come in conjugate pairs with
:math:`(1+\lambda)(1+\bar\lambda) = |1+\lambda|^2 > 0`.  For the mixer sublayer
:math:`J_f = g\,J_M J_{PN}` and :math:`\lVert J_{PN}\rVert_2 \le \lVert\gamma\rVert_\infty \rho/\mu^2`
(:mod:`grt_model.pearlnorm`), so :math:`g\,\lVert J_M\rVert_2\lVert\gamma\rVert_\infty\rho/\mu^2 < 1`
suffices.  Witness of a negative determinant: mixer angles :math:`\pi`, unit scales,
coupling off, gain 1: :math:`J_f = -\tfrac g\mu(I - uv^\top)` and
:math:`\det(I+J_f) = (1 - g/\mu)^{d-1}`, negative for even :math:`d` as soon as the
token's mean pair radius :math:`\mu < g` (tested against ``slogdet``).

Vectorized throughout: heads are stacked in the cascade calls, tokens in the batch
dims; the only Python loops run over blocks and (inside the cascade) stages.
Nothing hard-codes a device or dtype; ``GRT(cfg, dtype=torch.float64)`` builds in
float64 directly (exact unit scales), ``.to(device, dtype)`` converts.

What a traced forward records (:meth:`GRT.trace`) is :mod:`grt_model.trace`; the attention seam (overrides,
the explicit softmax) is :mod:`grt_model.attention`.
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
from grt_model.fused import fused_ffn
from grt_model.pearlnorm import PearlNorm
from grt_model.radial_gelu import RadialGELU
from grt_model.rope import apply_rope, rope_angles
from grt_model.trace import GATE_NAMES, BlockTrace, BlockTracer, CascadeTrace, GRTTrace

__all__ = ["GRT", "GRTFFN", "GRTAttention", "GRTBlock", "GRTMixer"]


# ---------------------------------------------------------------------------------------------------
# Sublayers
# ---------------------------------------------------------------------------------------------------


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

    _tracer: BlockTracer | None = None  # set only while GRTBlock.traced() runs

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if z.dim() != 3:
            raise ValueError(f"GRTAttention expects (B, T, D), got shape {tuple(z.shape)}")
        B, T, D = z.shape
        H, dh = self.n_heads, self.d_head
        tr = self._tracer
        # the cascade broadcasts its H input heads to its 3H heads (q, k, v read the same slice): no copy
        if tr is None:
            y = self.qkv(z)  # (B, T, 3*H*dh)
        else:
            y = tr.cascade("qkv", self.qkv, z)
            qkv = tr.records.pop("qkv")
            acts = qkv.acts.unflatten(-2, (3, H))  # (S+1, B, T, 3, H, dh)
            tr.put(**{name: CascadeTrace(name, acts[..., j, :, :], qkv.strides) for j, name in enumerate("qkv")})
        q, k, v = y.view(B, T, 3, H, dh).permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, dh)
        override = current_override() if tr is None else None
        if override is not None:  # e.g. lm.hf_classes: cached keys at absolute positions (grt_model.attention)
            a = override(self, q, k, v).transpose(1, 2).reshape(B, T, D)  # (B, T, H*dh)
            return self.o(a)
        if self.rope:
            ang = rope_angles(T, dh, self.rope_base, dtype=z.dtype, device=z.device)  # (T, dh/2)
            q, k = apply_rope(q, ang), apply_rope(k, ang)
        if tr is None and not explicit_attention_active():
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, dh)
        else:
            a, w = causal_attention_with_weights(q, k, v)
            if tr is not None:
                tr.put(q_rot=q, k_rot=k, attn_weights=w, attn_values=a.transpose(1, 2))
        a = a.transpose(1, 2).reshape(B, T, D)  # heads back to the token: (B, T, H*dh)
        return self.o(a) if tr is None else tr.cascade("o", self.o, a)  # o acts (S+1, B, T, H, dh)


class GRTFFN(nn.Module):
    """Zero-pad d_model -> d_ff, expand cascade, RadialGELU, contract cascade, keep the first d_model coords."""

    def __init__(self, cfg: GRTConfig, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.d_model, self.d_ff = cfg.d_model, cfg.d_ff
        kw = {"coupling_init_std": cfg.coupling_init_std, "feature_norm": cfg.coupling_norm, "dtype": dtype,
              "device": device}
        self.expand = RotationCascade(cfg.d_ff, cfg.ffn_stages, coupling=cfg.ffn_coupling, **kw)
        self.act = RadialGELU()
        self.contract = RotationCascade(cfg.d_ff, cfg.ffn_stages, coupling=cfg.ffn_coupling, **kw)

    _tracer: BlockTracer | None = None  # set only while GRTBlock.traced() runs

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        tr = self._tracer
        if tr is None and self.expand.coupling is not None:  # the fused FFN kernels are coupling-off only
            h = self.act(self.expand(F.pad(z, (0, self.d_ff - self.d_model))))  # (..., d_ff)
            return self.contract(h)[..., : self.d_model]
        if tr is None:
            # one fused kernel per direction where numba is available (same function: tests/test_fast_cascade.py)
            return fused_ffn(z, self.expand, self.contract, self.d_model)
        h = F.pad(z, (0, self.d_ff - self.d_model))  # (..., d_ff): signal in coords 0..d_model-1
        h = self.act(tr.cascade("ffn_expand", self.expand, h))
        tr.put(gelu_out=h)
        return tr.cascade("ffn_contract", self.contract, h)[..., : self.d_model]


class GRTMixer(nn.Module):
    """One (or ``mixer_stages``) coupled rotation stage(s) across the whole d_model token."""

    def __init__(self, cfg: GRTConfig, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.cascade = RotationCascade(cfg.d_model, cfg.mixer_stages, coupling=cfg.mixer_coupling,
                                       first_stage=cfg.mixer_first_stage, feature_norm=cfg.coupling_norm,
                                       coupling_init_std=cfg.coupling_init_std, dtype=dtype, device=device)

    _tracer: BlockTracer | None = None  # set only while GRTBlock.traced() runs

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.cascade(z) if self._tracer is None else self._tracer.cascade("mixer", self.cascade, z)


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

    _tracer: BlockTracer | None = None  # set only while traced() runs

    def sublayer(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """The residual branch ``f`` of one cycle (``x + f(x)``): ``g * process(PearlNorm(x))``."""
        if name not in GATE_NAMES:
            raise ValueError(f"sublayer name must be one of {GATE_NAMES}, got {name!r}")
        i = GATE_NAMES.index(name)
        norm, proc = ((self.norm_attn, self.attn), (self.norm_mixer, self.mixer), (self.norm_ffn, self.ffn))[i]
        z = norm(x)
        if self._tracer is not None:
            self._tracer.put(**{f"{name}_in": z})
        return self.gates()[i] * proc(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tr = self._tracer
        if tr is not None:
            tr.put(stream_in=x, gates=dict(zip(GATE_NAMES, self.gates().tolist())))
        for name, after in zip(GATE_NAMES, ("after_attn", "after_mixer", "stream_out")):
            x = x + self.sublayer(name, x)
            if tr is not None:
                tr.put(**{after: x})
        return x

    @torch.no_grad()
    def traced(self, x: torch.Tensor) -> tuple[torch.Tensor, BlockTrace]:
        """``(forward(x), its BlockTrace)``: the block and its sublayers record into one :class:`BlockTracer`
        for this call (cascades run stage by stage, attention as an explicit softmax: the same function)."""
        tracer = BlockTracer()
        mods = (self, self.attn, self.mixer, self.ffn)
        for m in mods:
            m._tracer = tracer
        try:
            out = self(x)
        finally:
            for m in mods:
                del m._tracer  # back to the class default, None
        return out, tracer.trace()


# ---------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------


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
        if config.tie_head:
            self.head = None
        else:
            self.head = nn.Linear(config.d_model, config.vocab_size, bias=False, **kw)
            nn.init.normal_(self.head.weight, 0.0, config.head_init_std)

    def _check_idx(self, idx: torch.Tensor) -> None:
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
        self._check_idx(idx)
        x = self.embed(idx)  # (B, T, D) rebuilt from phases + magnitudes
        for blk in self.blocks:
            x = blk(x)
        logits = self.norm_f(x) @ self.output_weight().T  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def trace(self, idx: torch.Tensor) -> GRTTrace:
        """Run the forward pass recording every intermediate (see :class:`GRTTrace`, :class:`BlockTrace`).

        Computes the same function as :meth:`forward` (attention weights come from an
        explicit softmax instead of SDPA; tested equal).  Memory grows with the stage
        count: use a short ``idx`` at the reference config.
        """
        self._check_idx(idx)
        x = emb = self.embed(idx)
        blocks = []
        for blk in self.blocks:
            x, bt = blk.traced(x)
            blocks.append(bt)
        final = self.norm_f(x)
        return GRTTrace(idx=idx, embedding=emb, blocks=blocks, final=final, logits=final @ self.output_weight().T)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
