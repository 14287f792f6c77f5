"""The dense baseline: a small pre-norm causal transformer (``x += attn(norm1(x)); x += mlp(norm2(x))``) with
optional per-head QK-norm.  With ``qk_norm=True`` the query and key projections each feed an RMSNorm (as in OLMo 2,
Gemma 3, Qwen 3), so ``W_q`` and ``W_k`` are exact scale gauges of the loss; the weights that write into the
residual stream (V, O, the MLP) are not.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from grt_model.attention import current_override
from grt_model.embedding import PhaseEmbedding
from grt_model.rope import apply_rope, rope_angles
from lm.rmsnorm import RMSNorm
from rmsgauge import check_choice


@dataclass
class DenseConfig:
    vocab_size: int = 256  # byte-level tokens
    block_size: int = 128  # context length in tokens
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 1024
    qk_norm: bool = True  # per-head RMSNorm on q and k: makes W_q, W_k exact scale gauges
    qk_norm_eps: float = 0.0  # 0: the gauge is exact; torch.nn.RMSNorm's default would be finfo.eps
    norm_eps: float = 1e-6  # the pre-norms (their inputs are sums, never a gauge question)
    rope: bool = True  # rotary position on q/k pairs
    tie_embeddings: bool = True  # output head = token embedding^T
    init_std: float = 0.02  # GPT-2 style normal init
    # ablations of the GRT experiments (studies.experiments); the defaults are the baseline
    embedding: str = "table"  # table: nn.Embedding | phase: the GRT's phase embedding (one radius, P phases)
    norms: bool = True  # False: no pre-norms and no final norm (QK-norm is its own flag)
    residual_init: str = "scaled"  # scaled: o_proj/down at init_std/sqrt(2L) (GPT-2) | zero: both start at 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "d_model", "n_heads", "n_layers", "d_ff"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"DenseConfig.{name} must be a positive integer, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"DenseConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError("DenseConfig: head dim d_model/n_heads must be even (rotary pairs)")
        check_choice("DenseConfig.embedding", self.embedding, ("table", "phase"))
        if self.embedding == "phase" and not self.tie_embeddings:
            raise ValueError("DenseConfig.embedding=phase needs tie_embeddings=true (the head reads the phase table)")
        if not isinstance(self.norms, bool):
            raise ValueError(f"DenseConfig.norms must be true or false, got {self.norms!r}")
        check_choice("DenseConfig.residual_init", self.residual_init, ("scaled", "zero"))
        for name in ("qk_norm_eps", "norm_eps", "init_std"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"DenseConfig.{name} must be a finite number in [0, inf), got {v!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class DenseAttention(nn.Module):
    def __init__(self, cfg: DenseConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.d_model, cfg.head_dim
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.rope, self.rope_base = cfg.rope, 10000.0  # rope_angles' default base
        self.layer_index = 0  # its block's index (set by DenseTransformer): what an attention override keys by
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, eps=cfg.qk_norm_eps)
            self.k_norm = RMSNorm(hd, eps=cfg.qk_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        H, hd = self.cfg.n_heads, self.cfg.head_dim  # q, k, v: (B, H, T, hd) each
        q, k, v = (p(x).view(B, T, H, hd).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        override = current_override()
        if override is not None:  # e.g. lm.hf_classes: cached keys at absolute positions (grt_model.attention)
            return self.o_proj(override(self, q, k, v).transpose(1, 2).reshape(B, T, D))
        if self.cfg.rope:
            ang = rope_angles(T, hd, self.rope_base, dtype=x.dtype, device=x.device)  # (T, hd/2)
            q, k = apply_rope(q, ang), apply_rope(k, ang)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))


class DenseMLP(nn.Module):
    def __init__(self, cfg: DenseConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


def _pre_norm(cfg: DenseConfig) -> nn.Module:
    """The block's pre-norm, or the identity for the norm-free ablation (``norms=False``)."""
    return RMSNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.norms else nn.Identity()


class DenseBlock(nn.Module):
    def __init__(self, cfg: DenseConfig) -> None:
        super().__init__()
        self.norm1 = _pre_norm(cfg)
        self.attn = DenseAttention(cfg)
        self.norm2 = _pre_norm(cfg)
        self.mlp = DenseMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class DenseTransformer(nn.Module):
    """Pre-norm causal transformer; ``forward(idx, targets=None) -> (logits, loss)``."""

    def __init__(self, cfg: DenseConfig) -> None:
        super().__init__()
        self.config = cfg
        if cfg.embedding == "phase":  # the GRT's embedding: a token is one radius and P phases
            self.tok_emb = PhaseEmbedding(cfg.vocab_size, cfg.d_model // 2)
        else:
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(DenseBlock(cfg) for _ in range(cfg.n_layers))
        for i, blk in enumerate(self.blocks):
            blk.attn.layer_index = i
        self.norm_f = _pre_norm(cfg)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("o_proj.weight") or name.endswith("down.weight"):
                # residual writes scaled by depth (GPT-2): keeps the stream's variance O(1)
                if cfg.residual_init == "zero":  # SkipInit/Fixup: every block starts as the identity
                    nn.init.zeros_(p)
                else:
                    nn.init.normal_(p, 0.0, cfg.init_std / math.sqrt(2 * cfg.n_layers))
        if cfg.embedding == "phase" and cfg.norms:
            # tied to a phase table of radius ~0.79, a unit final gain gives logit std ~ r sqrt(P/2) (a loss
            # near 20 at step 0); 1/sqrt(P) is the GRT's own choice (GRTConfig.final_gain_init)
            with torch.no_grad():
                self.norm_f.weight.fill_(1.0 / math.sqrt(cfg.d_model // 2))

    def _init(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, self.config.init_std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        x = self.tok_emb(idx)  # (B, T, D)
        for blk in self.blocks:
            x = blk(x)
        x = self.norm_f(x)
        if self.head is not None:
            logits = self.head(x)  # (B, T, V)
        elif isinstance(self.tok_emb, PhaseEmbedding):
            logits = x @ self.tok_emb.cartesian_table().T
        else:
            logits = x @ self.tok_emb.weight.T
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss
