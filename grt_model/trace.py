"""What one traced GRT forward pass records: every cascade's stage activations, every block's intermediates.

:meth:`grt_model.model.GRT.trace` and :meth:`grt_model.model.GRTBlock.traced` fill these records; the figures,
the trained-model claims and the diagnostics read them.  They are plain tensors, detached, with no autograd
state.  While a block is traced, its sublayers hand each cascade to a :class:`BlockTracer`, which runs it stage
by stage (:meth:`grt_model.cascade.RotationCascade.stage_trace`: the eager backend, the same function as the
fused kernels) and keeps every stage's output; a sublayer whose ``_tracer`` is ``None`` runs its plain forward.

Shapes: ``B`` batch, ``T`` tokens, ``H`` heads, ``D`` = d_model, ``S`` a cascade's stage count, ``P`` pairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grt_model.butterfly import to_pairs
from grt_model.cascade import RotationCascade
from grt_model.embedding import to_polar
from grt_model.pearlnorm import safe_pair_radius

__all__ = ["GATE_NAMES", "BlockTrace", "BlockTracer", "CascadeTrace", "GRTTrace"]

GATE_NAMES = ("attn", "mixer", "ffn")  # a block's three sublayers, in order; its gates follow this order


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

    def stages(self) -> list[tuple[str, int, torch.Tensor]]:
        """All rotation stages of the block in order (87 at the reference config).

        Each entry ``(cascade name, stage index, pairs [B, T, n_pairs, 2])``: the
        stage's output in its own pairing, heads flattened into pairs (4 heads x 32
        = 128 pairs for Q/K/V/O, 128 for the mixer, 512 for the FFN).
        """
        out = []
        for c in self.cascades():
            for s in range(c.n_stages):
                p = c.pairs(s + 1)  # (B, T, heads, P, 2)
                out.append((c.name, s, p.flatten(-3, -2)))
        return out

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
            _, pq = to_polar(q)
            _, pk = to_polar(k)
            return _wrap(pk - pq).transpose(1, 2)  # (B, T, H, P)
        _, pq = to_polar(q[:, :, query_pos])
        _, pk = to_polar(k[:, :, key_pos])
        return _wrap(pk - pq)  # (B, H, P)


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


def _cascade_trace(name: str, cascade: RotationCascade, x: torch.Tensor) -> tuple[CascadeTrace, torch.Tensor]:
    acts = torch.stack(cascade.stage_trace(x))  # (S+1, ..., heads*width)
    acts = acts.unflatten(-1, (cascade.heads, cascade.width))  # (S+1, ..., heads, width)
    return CascadeTrace(name, acts, cascade.strides()), acts[-1].flatten(-2)


class BlockTracer:
    """Collects one block's intermediates while :meth:`GRTBlock.traced` runs it (the fields of
    :class:`BlockTrace`).  Installed on the block and its sublayers for that call only: a module whose
    ``_tracer`` is ``None`` (always, outside ``traced``) runs its plain forward."""

    def __init__(self) -> None:
        self.records: dict[str, Any] = {}

    def put(self, **values: Any) -> None:
        self.records.update(values)

    def cascade(self, name: str, cascade: RotationCascade, x: torch.Tensor) -> torch.Tensor:
        """Run ``cascade`` stage by stage (eager), record its activations under ``name``; its output."""
        self.records[name], out = _cascade_trace(name, cascade, x)
        return out

    def trace(self) -> BlockTrace:
        return BlockTrace(**self.records)
