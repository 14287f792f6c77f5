r"""The scale-gauge weights the dynamics are measured on: three toys and the real QK-norm model.

Each problem owns one leaf tensor ``weight`` and a ``loss(step)`` invariant under scaling each *gauge group* of the
weight by its own :math:`c > 0`; ``groups(t)`` views a weight-shaped tensor as ``(R, m)``: ``R`` independent gauges
of ``m`` entries (the norm laws hold per group).  :class:`PhaseToy` makes the SGD norm map deterministic
(:math:`G = 1` exactly), :class:`NoiseToy` the random-walk regime that Kosson et al. and Wan et al. assume
(gradients uncorrelated across steps), :class:`RegressionToy` real learning (signal plus minibatch noise), and
:class:`QKNormProblem` the real model's ``W_q``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lm import DenseConfig, DenseTransformer, rms_norm
from rmsgauge import check_choice
from rmsgauge.claims import dtype_name
from rmsgauge.cli import DTYPES
from rmsgauge.corpus import ByteCorpus


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, check_choice("dtype", name, DTYPES))


class GaugeProblem:
    """Base: a leaf ``weight``, a scale-invariant ``loss(step)``, and its gauge ``groups``."""

    name: str = "problem"
    weight: torch.Tensor

    def loss(self, step: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def groups(self, t: torch.Tensor) -> torch.Tensor:
        """``(R, m)`` view of a weight-shaped tensor; default: the whole weight is one gauge."""
        return t.reshape(1, -1)

    def describe(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def dtype(self) -> str:
        return dtype_name(self.weight.dtype)

    def set_group_norms(self, norms_sq: torch.Tensor) -> None:
        """Rescale each gauge group to the given squared norms (allowed: the loss cannot see it)."""
        with torch.no_grad():
            grp = self.groups(self.weight)  # (R, m)
            scale = (norms_sq.to(grp.dtype) / grp.pow(2).sum(-1)).sqrt()  # (R,)
            grp.mul_(scale.unsqueeze(-1))


class PhaseToy(GaugeProblem):
    r""":math:`L(W) = \operatorname{atan2}(w_1, w_0)`: a 2-D gauge whose gradient norm at unit norm is exactly 1."""

    name = "phase2d"

    def __init__(self, norm_sq: float = 1.0, angle: float = 0.3, dtype: str = "float64") -> None:
        r = float(norm_sq) ** 0.5
        w = torch.tensor([[r * torch.cos(torch.tensor(angle)).item(), r * torch.sin(torch.tensor(angle)).item()]],
                         dtype=torch_dtype(dtype))  # (1, 2)
        self.weight = w.requires_grad_(True)

    def loss(self, step: int) -> torch.Tensor:
        w = self.weight
        return torch.atan2(w[:, 1], w[:, 0]).sum()

    def describe(self) -> str:
        return f"phase toy L=atan2(w1,w0), W in R^2, G=||g||*||W||=1 exactly ({self.dtype})"


class NoiseToy(GaugeProblem):
    r"""``R`` replicas of :math:`L_t = \langle \xi_t, W/\lVert W\rVert\rangle` with fresh Gaussian :math:`\xi_t`:
    :math:`\mathbb E\,G^2 = n - 1`."""

    name = "noise"

    def __init__(self, n: int = 256, replicas: int = 8, seed: int = 0, dtype: str = "float64",
                 norm_sq: float | None = None) -> None:
        if n < 2 or replicas < 1:
            raise ValueError(f"NoiseToy needs n >= 2 and replicas >= 1, got n={n}, replicas={replicas}")
        self.n, self.replicas = n, replicas
        self.gen = torch.Generator().manual_seed(seed)
        w = torch.randn(replicas, n, generator=self.gen, dtype=torch_dtype(dtype))  # (R, n)
        self.weight = w.requires_grad_(True)
        if norm_sq is not None:
            self.set_group_norms(torch.full((replicas,), float(norm_sq)))

    def loss(self, step: int) -> torch.Tensor:
        w = self.weight
        xi = torch.randn(w.shape, generator=self.gen, dtype=w.dtype)  # (R, n)
        return ((xi * w).sum(-1) / w.norm(dim=-1)).sum()

    def groups(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(self.replicas, self.n)

    def describe(self) -> str:
        return (f"noise toy L_t=<xi_t, W/||W||>, {self.replicas} replicas x n={self.n}, "
                f"gradients uncorrelated across steps, E G^2 = n-1 ({self.dtype})")


@dataclass
class RegressionConfig:
    d_in: int = 16
    d_out: int = 16
    n_samples: int = 512
    batch: int = 32
    noise: float = 0.5  # target noise: keeps minibatch gradients alive after the fit (a stationary regime)


class RegressionToy(GaugeProblem):
    r"""Minibatch :math:`\operatorname{mean}\lVert\operatorname{RMSNorm}(x_bW) - y_b\rVert^2` (eps = 0: exact gauge)."""

    name = "regression"

    def __init__(self, cfg: RegressionConfig | None = None, seed: int = 0, dtype: str = "float64") -> None:
        self.cfg = cfg = cfg or RegressionConfig()
        dt = torch_dtype(dtype)
        g = torch.Generator().manual_seed(10_000 + seed)
        self.x = torch.randn(cfg.n_samples, cfg.d_in, generator=g, dtype=torch.float64)  # (N, d_in)
        teacher = torch.randn(cfg.d_in, cfg.d_out, generator=g, dtype=torch.float64)
        self.y = rms_norm(self.x @ teacher) + cfg.noise * torch.randn(cfg.n_samples, cfg.d_out, generator=g,
                                                                      dtype=torch.float64)  # (N, d_out)
        self.x, self.y = self.x.to(dt), self.y.to(dt)
        w = torch.randn(cfg.d_in, cfg.d_out, generator=g, dtype=torch.float64) / cfg.d_in**0.5
        self.weight = w.to(dt).requires_grad_(True)
        self.gen = torch.Generator().manual_seed(20_000 + seed)

    def loss(self, step: int) -> torch.Tensor:
        return self.loss_on(torch.randint(0, self.cfg.n_samples, (self.cfg.batch,), generator=self.gen))

    def loss_on(self, idx: torch.Tensor) -> torch.Tensor:
        pred = rms_norm(self.x[idx] @ self.weight)  # (B, d_out)
        return (pred - self.y[idx]).pow(2).sum(-1).mean()

    def describe(self) -> str:
        c = self.cfg
        return (f"regression toy mean||RMSNorm(xW)-y||^2, W {c.d_in}x{c.d_out}, {c.n_samples} samples, "
                f"batch {c.batch} ({self.dtype})")


@dataclass
class QKNormSpec:
    batch: int = 4  # windows per step: 4 x 64 bytes keeps one step near 60 ms on one CPU thread
    block: int = 64  # tokens per window (<= DenseConfig.block_size)
    layer: int = -1  # the last block: backprop only runs through one block, which keeps steps cheap


class QKNormProblem(GaugeProblem):
    """``W_q`` of a QK-norm ``DenseTransformer`` (qk_norm_eps = 0) on next-byte loss; only ``W_q`` trains."""

    name = "qknorm"

    def __init__(self, spec: QKNormSpec | None = None, config: DenseConfig | None = None, seed: int = 0,
                 dtype: str = "float32", corpus: ByteCorpus | None = None) -> None:
        self.spec = spec = spec or QKNormSpec()
        self.config = config = config or DenseConfig(qk_norm=True, qk_norm_eps=0.0)
        if not config.qk_norm or config.qk_norm_eps != 0.0:
            raise ValueError("QKNormProblem needs DenseConfig(qk_norm=True, qk_norm_eps=0.0): "
                             "only then is W_q an exact scale gauge")
        if spec.block > config.block_size:
            raise ValueError(f"QKNormSpec.block ({spec.block}) must be <= DenseConfig.block_size "
                             f"({config.block_size})")
        torch.manual_seed(seed)  # the model's init draws from the global generator
        self.model = DenseTransformer(config).to(torch_dtype(dtype))
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.layer_index = spec.layer % config.n_layers
        self.weight = self.model.blocks[self.layer_index].attn.q_proj.weight  # (D, D): rows are head-major
        self.weight.requires_grad_(True)
        self.corpus = corpus if corpus is not None else ByteCorpus.load()
        self.gen = torch.Generator().manual_seed(30_000 + seed)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.corpus.batch("train", self.spec.batch, self.spec.block, generator=self.gen)

    def loss_on(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return self.model(xb, yb)[1]

    def loss(self, step: int) -> torch.Tensor:
        return self.loss_on(*self.batch())

    def groups(self, t: torch.Tensor) -> torch.Tensor:
        H = self.config.n_heads
        return t.reshape(H, -1)  # (H, head_dim * D): head h owns rows [h*hd, (h+1)*hd)

    def describe(self) -> str:
        c = self.config
        return (f"QK-norm DenseTransformer (d_model={c.d_model}, {c.n_layers} layers, {c.n_heads} heads), "
                f"blocks[{self.layer_index}].attn.q_proj.weight {c.d_model}x{c.d_model} = {c.n_heads} head gauges; "
                f"only W_q trained; ByteCorpus batches {self.spec.batch}x{self.spec.block} ({self.dtype})")
