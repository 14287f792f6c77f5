r"""The "real downstream loss" of the gauge checks: the dense QK-norm transformer on Shakespeare.

A small :class:`lm.dense.DenseTransformer` with per-head QK-norm (``qk_norm_eps = 0``) is trained a handful of AdamW
steps in float32 (so the measured gradient is that of a model that has started to learn, not of the symmetric
initialization), then copied to float64 with bit-identical weights.  Every check evaluates the next-byte
cross-entropy on one fixed held-out batch (the validation split, never trained on).

The gauge weight is :math:`W = ` ``blocks[layer].attn.q_proj.weight``, shape ``(D_out, D_in)``; ``nn.Linear``
computes :math:`z = x W^\top`, so one *row* of ``W`` is one output neuron and head :math:`h` owns rows
:math:`[h\,d_h, (h+1)\,d_h)`, a gauge on its own under the per-head QK-norm.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from lm import DenseConfig, DenseTransformer
from rmsgauge import check_range, seed_everything
from rmsgauge.corpus import ByteCorpus

TORCH_EPS = "torch"  # in an eps list: torch.nn.RMSNorm's default, torch.finfo(dtype).eps
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class GaugeConfig:
    """Everything ``python gauge.py`` measures on; the CLI builds it from flags of the same names.  Each value is
    checked here (a ``ValueError`` names the field and its range)."""

    d_model: int = 64  # small enough that the whole run fits in 30 s on 2 shared cores
    n_layers: int = 2
    n_heads: int = 4  # head_dim = d_model / n_heads must be even (rotary pairs)
    batch_size: int = 8  # sequences in the measured batch (and in each training step)
    block_size: int = 64  # tokens per sequence
    seed: int = 0
    train_steps: int = 30  # AdamW steps (float32) before measuring; 0 measures the initialization
    lr: float = 3e-3  # AdamW learning rate for those steps
    layer: int = 0  # which block's q_proj is "W"
    c_min: float = 1e-2  # the source's range for the scale c
    c_max: float = 1e2
    c_points: int = 101  # log-spaced; odd so that c = 1 is on the grid for a symmetric range
    eps: tuple[float | str, ...] = (1e-6, 1e-5, TORCH_EPS)  # the eps-breaking study; "torch" = finfo(dtype).eps
    census_c: tuple[float, ...] = (10.0, 0.1)  # not powers of two: 2^k scaling is bit-exact and would prove nothing
    # (the census claim fails on such scales; tests/test_gauge.py pins these defaults)
    corpus: str | None = None  # a text file or folder; None = the bundled Shakespeare

    def __post_init__(self) -> None:
        self.dense_config()  # the model's own checks: positive sizes, heads that divide d_model, an even head dim
        check_range("layer", self.layer, 0, self.n_layers - 1)
        check_range("batch_size", self.batch_size, 1)
        check_range("train_steps", self.train_steps, 0)
        check_range("lr", self.lr, 0.0, lo_open=True)
        check_range("seed", self.seed, 0, 2**32 - 1)
        check_range("c_min", self.c_min, 0.0, lo_open=True)
        check_range("c_max", self.c_max, self.c_min, lo_open=True)
        check_range("c_points", self.c_points, 2)
        for e in (e for e in self.eps if e != TORCH_EPS):
            check_range("eps", e, 0.0)
        for c in self.census_c:
            check_range("census_c", c, 0.0, lo_open=True)

    def dense_config(self, qk_norm: bool = True) -> DenseConfig:
        """The model's typed config (raises ``ValueError`` naming the bad field)."""
        return DenseConfig(d_model=self.d_model, n_heads=self.n_heads, n_layers=self.n_layers,
                           d_ff=4 * self.d_model, block_size=self.block_size, qk_norm=qk_norm, qk_norm_eps=0.0)

    def c_grid(self) -> torch.Tensor:
        """``(C,)`` float64 log-spaced scales in ``[c_min, c_max]``."""
        return torch.logspace(math.log10(self.c_min), math.log10(self.c_max), self.c_points, dtype=torch.float64)

    def eps_values(self, dtype: torch.dtype) -> list[float]:
        """The eps list with ``"torch"`` resolved to ``torch.finfo(dtype).eps`` (torch.nn.RMSNorm's default)."""
        return [torch.finfo(dtype).eps if e == TORCH_EPS else float(e) for e in self.eps]


@dataclass
class GaugeSetup:
    """One trained model in both precisions and the held-out batch it is measured on."""

    config: GaugeConfig
    models: dict[str, DenseTransformer]  # "float32" / "float64": identical weights
    idx: torch.Tensor  # (B, T) int64 input bytes
    targets: torch.Tensor  # (B, T) next bytes
    plain: GaugeSetup | None = None  # the same model without QK-norm (the census compares the two)

    def model(self, dtype: str) -> DenseTransformer:
        return self.models[dtype]

    def weight_name(self) -> str:
        return f"blocks.{self.config.layer}.attn.q_proj.weight"

    def weight(self, dtype: str) -> nn.Parameter:
        return self.models[dtype].blocks[self.config.layer].attn.q_proj.weight  # (D, D) = (out, in)


def build_setup(cfg: GaugeConfig, *, qk_norm: bool = True, progress: Callable[[str], None] | None = None) -> GaugeSetup:
    """Seed, build, train ``cfg.train_steps`` AdamW steps in float32, copy to float64, draw the held-out batch."""
    corpus = ByteCorpus.load(cfg.corpus)
    seed_everything(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)  # data order: fixed by the seed alone
    model = DenseTransformer(cfg.dense_config(qk_norm)).float()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)  # no decay: it is not the topic here
    for step in range(cfg.train_steps):
        x, y = corpus.batch("train", cfg.batch_size, cfg.block_size, gen)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if progress and (step + 1) % 10 == 0:
            progress(f"  train (float32, qk_norm={qk_norm}) step {step + 1}/{cfg.train_steps}: loss {loss.item():.3f}")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)  # gradients are requested explicitly, per tensor
    idx, targets = corpus.batch("val", cfg.batch_size, cfg.block_size, gen)
    models = {"float32": model, "float64": copy.deepcopy(model).double()}
    return GaugeSetup(config=cfg, models=models, idx=idx, targets=targets)


def loss_of(model: DenseTransformer, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The scalar next-byte cross-entropy (in the model's dtype)."""
    return model(idx, targets)[1]


@contextlib.contextmanager
def scaled(param: torch.Tensor, c: float, rows: slice | torch.Tensor | None = None) -> Iterator[None]:
    """Temporarily multiply ``param`` (or ``param[rows]``) by ``c``; restore the exact original bits after."""
    saved = param.detach().clone()
    with torch.no_grad():
        if rows is None:
            param.mul_(c)
        else:
            param[rows] = param[rows] * c
    try:
        yield
    finally:
        with torch.no_grad():
            param.copy_(saved)  # dividing by c would not restore bit-for-bit


@contextlib.contextmanager
def qk_eps(model: DenseTransformer, eps: float) -> Iterator[None]:
    """Temporarily give every QK-norm of ``model`` this ``eps`` (the model is built with eps = 0)."""
    norms = [n for b in model.blocks for n in (b.attn.q_norm, b.attn.k_norm) if n is not None]
    old = [n.eps for n in norms]
    for n in norms:
        n.eps = float(eps)
    try:
        yield
    finally:
        for n, e in zip(norms, old):
            n.eps = e


@dataclass
class QCapture:
    """What flows through the measured layer's query path on the held-out batch."""

    x: torch.Tensor  # (B, T, D) input of q_proj (the pre-norm output)
    z: torch.Tensor  # (B, H, T, hd) q_proj output split into heads = QK-norm input
    y: torch.Tensor  # (B, H, T, hd) QK-norm output (with gain)
    loss: torch.Tensor  # () the loss


def capture_q_path(model: DenseTransformer, layer: int, idx: torch.Tensor, targets: torch.Tensor) -> QCapture:
    """One forward pass with hooks on ``blocks[layer]``: q_proj's input and the q-norm's input and output.

    ``y`` stays in the autograd graph so ``torch.autograd.grad(loss, y)`` gives :math:`\\partial L/\\partial y`.
    """
    attn = model.blocks[layer].attn
    if attn.q_norm is None:
        raise ValueError("capture_q_path needs a QK-norm model (DenseConfig.qk_norm=True)")
    store: dict[str, torch.Tensor] = {}
    handles = [attn.q_proj.register_forward_hook(lambda _m, inp, _out: store.update(x=inp[0].detach())),
               attn.q_norm.register_forward_hook(lambda _m, inp, out: store.update(z=inp[0].detach(), y=out))]
    try:
        loss = loss_of(model, idx, targets)
    finally:
        for h in handles:
            h.remove()
    return QCapture(x=store["x"], z=store["z"], y=store["y"], loss=loss)

