"""A traced GRT forward pass: every cascade's stage activations, every block's intermediates.

:func:`trace_model` (and :func:`trace_block` for one block) runs the model's sublayers the way their forwards do,
recording as it goes; the figures, the trained-model claims and the diagnostics read the records.  They are
plain tensors, detached, with no autograd state.  Each cascade runs stage by stage
(:meth:`grt_model.cascade.RotationCascade.stage_trace`: the eager path, the same function as the fused kernels)
and attention as an explicit softmax (its weights are recorded; the same function as SDPA, tested equal).

Shapes: ``B`` batch, ``T`` tokens, ``H`` heads, ``D`` = d_model, ``S`` a cascade's stage count, ``P`` pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from grt_model.attention import causal_attention_with_weights
from grt_model.butterfly import to_pairs
from grt_model.cascade import RotationCascade
from grt_model.embedding import to_polar
from grt_model.model import GATE_NAMES, GRT, GRTFFN, GRTAttention, GRTBlock, GRTMixer
from grt_model.pearlnorm import safe_pair_radius
from grt_model.radial_gelu import radial_gelu

__all__ = ["trace_model"]


def _wrap(a: torch.Tensor) -> torch.Tensor:
    """Wrap angles to (-pi, pi]."""
    return torch.atan2(torch.sin(a), torch.cos(a))


@dataclass
class CascadeTrace:
    """Activations of one cascade, stage 0's input first: ``acts [S+1, B, T, heads, width]``."""

    name: str  # "q", "k", "v", "o", "mixer", "ffn_expand", "ffn_contract"
    acts: torch.Tensor  # (S+1, B, T, heads, width)
    strides: list[int]  # stride of each stage

    @property
    def n_stages(self) -> int:
        return len(self.strides)

    def pairs(self, i: int) -> torch.Tensor:
        """``[B, T, heads, P, 2]``: ``acts[i]`` in the pairing of the stage that produced it (stage 0's for i=0).

        For i >= 1 these are exactly the pairs stage i-1 just rotated and scaled, so
        a pair's plotted point is the (x0, x1) the text's figures draw.
        """
        if not 0 <= i <= self.n_stages:
            raise ValueError(f"stage activation index must be in [0, {self.n_stages}], got {i}")
        x0, x1 = to_pairs(self.acts[i], self.strides[max(i - 1, 0)])  # (B, T, heads, P) each
        return torch.stack((x0, x1), dim=-1)


@dataclass
class BlockTrace:
    """Every intermediate of one block's forward pass (shapes inline; B batch, T tokens, H heads)."""

    stream_in: torch.Tensor  # (B, T, D) residual stream entering the block
    attn_in: torch.Tensor  # (B, T, D) PearlNorm_1 output
    q: CascadeTrace  # acts (S+1, B, T, H, d_head)
    k: CascadeTrace
    v: CascadeTrace
    q_rot: torch.Tensor  # (B, H, T, d_head) queries as attention sees them (after RoPE if on)
    k_rot: torch.Tensor  # (B, H, T, d_head)
    attn_weights: torch.Tensor  # (B, H, T_query, T_key), causal, rows sum to 1
    attn_values: torch.Tensor  # (B, T, H, d_head) attention output, O's input
    o: CascadeTrace  # acts (S+1, B, T, H, d_head)
    after_attn: torch.Tensor  # (B, T, D) stream after x + g_attn * O(...)
    mixer_in: torch.Tensor  # (B, T, D)
    mixer: CascadeTrace  # acts (S_mix+1, B, T, 1, D)
    after_mixer: torch.Tensor  # (B, T, D)
    ffn_in: torch.Tensor  # (B, T, D)
    ffn_expand: CascadeTrace  # acts (S_ffn+1, B, T, 1, d_ff); acts[0] is the zero-padded input
    gelu_out: torch.Tensor  # (B, T, d_ff)
    ffn_contract: CascadeTrace  # acts (S_ffn+1, B, T, 1, d_ff)
    stream_out: torch.Tensor  # (B, T, D)
    gates: dict[str, float] = field(default_factory=dict)  # {"attn", "mixer", "ffn"} -> sigmoid(logit)

    def cascades(self) -> list[CascadeTrace]:
        """The block's cascades in the text's order: Q, K, V, O, mixer, FFN expand, FFN contract."""
        return [self.q, self.k, self.v, self.o, self.mixer, self.ffn_expand, self.ffn_contract]

    def qk_angle_gap(self, query_pos: int | None = None, key_pos: int | None = None,
                     rotary: bool = True) -> torch.Tensor:
        """Angle gap phi_k - phi_q per adjacent pair, wrapped to (-pi, pi].

        Both positions ``None``: each token's own Q and K, ``[B, T, H, P_head]`` (the
        text's "angle gap for all 128 pairs").  Both given: query token vs key token,
        ``[B, H, P_head]``.  ``rotary`` uses Q/K after RoPE (what the scores see);
        the score is ``sum_p r_q r_k cos(gap) / sqrt(d_head)``.
        """
        q, k = (self.q_rot, self.k_rot) if rotary else (self.q.acts[-1].transpose(1, 2),
                                                         self.k.acts[-1].transpose(1, 2))  # (B, H, T, dh)
        if (query_pos is None) != (key_pos is None):
            raise ValueError("give both query_pos and key_pos, or neither")
        if query_pos is None:
            return _wrap(to_polar(k)[1] - to_polar(q)[1]).transpose(1, 2)  # (B, T, H, P)
        return _wrap(to_polar(k[:, :, key_pos])[1] - to_polar(q[:, :, query_pos])[1])  # (B, H, P)


@dataclass
class GRTTrace:
    """The whole forward pass: embedding ring, every block's :class:`BlockTrace`, final norm, logits."""

    idx: torch.Tensor  # (B, T)
    embedding: torch.Tensor  # (B, T, D) rebuilt Cartesian embedding (block 0's input)
    blocks: list[BlockTrace]
    final: torch.Tensor  # (B, T, D) final PearlNorm output
    logits: torch.Tensor  # (B, T, V)

    def gates(self) -> torch.Tensor:
        """``[n_blocks, 3]`` gates (attention, mixer, FFN) per block."""
        return torch.tensor([[b.gates[n] for n in GATE_NAMES] for b in self.blocks])

    def streams(self) -> torch.Tensor:
        """``[n_blocks+1, B, T, D]``: the stream entering block 0 (the embedding), then after each block."""
        return torch.stack([self.embedding] + [b.stream_out for b in self.blocks])

    def pair_radii(self) -> torch.Tensor:
        """``[n_blocks+1, B, T, P]`` stream pair radii (adjacent pairing)."""
        return safe_pair_radius(self.streams())

    def pair_radius_spread(self) -> torch.Tensor:
        """``[n_blocks+1, B, T]``: std/mean of a token's pair radii (0 on the embedding's ring)."""
        r = self.pair_radii()
        return r.std(dim=-1, unbiased=False) / r.mean(dim=-1)

    def qk_angle_gaps(self, rotary: bool = True) -> torch.Tensor:
        """``[n_blocks, B, T, H, P_head]`` each token's own Q-K angle gap per pair, per block."""
        return torch.stack([b.qk_angle_gap(rotary=rotary) for b in self.blocks])


def trace_cascade(name: str, cascade: RotationCascade, x: torch.Tensor) -> tuple[CascadeTrace, torch.Tensor]:
    """Run ``cascade`` stage by stage (eager): its :class:`CascadeTrace` under ``name`` and its output."""
    acts = torch.stack(cascade.stage_trace(x))  # (S+1, ..., heads*width)
    acts = acts.unflatten(-1, (cascade.heads, cascade.width))  # (S+1, ..., heads, width)
    return CascadeTrace(name, acts, cascade.strides()), acts[-1].flatten(-2)


def _attention(attn: GRTAttention, z: torch.Tensor, rec: dict[str, Any]) -> torch.Tensor:
    qkv, y = trace_cascade("qkv", attn.qkv, z)
    acts = qkv.acts.unflatten(-2, (3, attn.n_heads))  # (S+1, B, T, 3, H, dh)
    rec.update({name: CascadeTrace(name, acts[..., j, :, :], qkv.strides) for j, name in enumerate("qkv")})
    q, k, v = attn.split_heads(y)  # 3 x (B, H, T, dh)
    q, k = attn.position(q, k)
    a, w = causal_attention_with_weights(q, k, v)
    rec.update(q_rot=q, k_rot=k, attn_weights=w, attn_values=a.transpose(1, 2))
    rec["o"], out = trace_cascade("o", attn.o, a.transpose(1, 2).reshape(z.shape))  # o acts (S+1, B, T, H, dh)
    return out


def _mixer(mixer: GRTMixer, z: torch.Tensor, rec: dict[str, Any]) -> torch.Tensor:
    rec["mixer"], out = trace_cascade("mixer", mixer.cascade, z)
    return out


def _ffn(ffn: GRTFFN, z: torch.Tensor, rec: dict[str, Any]) -> torch.Tensor:
    h = F.pad(z, (0, ffn.d_ff - ffn.d_model))  # (..., d_ff): signal in coords 0..d_model-1
    rec["ffn_expand"], h = trace_cascade("ffn_expand", ffn.expand, h)
    rec["gelu_out"] = h = radial_gelu(h)
    rec["ffn_contract"], out = trace_cascade("ffn_contract", ffn.contract, h)
    return out[..., : ffn.d_model]


@torch.no_grad()
def trace_block(blk: GRTBlock, x: torch.Tensor) -> tuple[torch.Tensor, BlockTrace]:
    """``(blk(x), its BlockTrace)``: the block's three cycles as :meth:`GRTBlock.forward` runs them."""
    rec: dict[str, Any] = {"stream_in": x, "gates": dict(zip(GATE_NAMES, blk.gates().tolist()))}
    cycles: tuple[tuple[Any, Any, Callable, str], ...] = (
        (blk.norm_attn, blk.attn, _attention, "after_attn"), (blk.norm_mixer, blk.mixer, _mixer, "after_mixer"),
        (blk.norm_ffn, blk.ffn, _ffn, "stream_out"))
    for i, (name, (norm, proc, run, after)) in enumerate(zip(GATE_NAMES, cycles)):
        rec[f"{name}_in"] = z = norm(x)
        rec[after] = x = x + blk.gates()[i] * run(proc, z, rec)
    return x, BlockTrace(**rec)


@torch.no_grad()
def trace_model(model: GRT, idx: torch.Tensor) -> GRTTrace:
    """Run ``model`` on ``idx [B, T]`` recording every intermediate (:class:`GRTTrace`).  Memory grows with the
    stage count: use a short ``idx`` at the reference config."""
    model.check_idx(idx)
    x = emb = model.embed(idx)
    blocks = []
    for blk in model.blocks:
        x, bt = trace_block(blk, x)
        blocks.append(bt)
    final = model.norm_f(x)
    return GRTTrace(idx=idx, embedding=emb, blocks=blocks, final=final, logits=final @ model.output_weight().T)
