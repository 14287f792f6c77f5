r"""What every gauge claim measures with: the source's statements, the round-off tolerances (each from
:func:`rmsgauge.tolerance`; the helpers say which sizes they count), the query path, gradients of the frozen model,
and the name of the measured tensor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from gauge.model import GaugeConfig, GaugeSetup, scaled
from lm import rms_norm
from rmsgauge import Tolerance, tolerance

CHUNK_ELEMENTS = 1 << 22  # per chunk of scales c: bounds the (C, N, D) temporaries to ~32 MB in float64

SOURCE = {
    "forward": "Scaling W by any positive constant scales z by the same constant, which the norm removes exactly: "
    "RMSNorm(x(cW)) = RMSNorm(xW), c > 0; measured over c from 0.01 to 100, the output deviation is about "
    "3e-15 in double precision.",
    "euler": "The loss is homogeneous of degree zero in W, and Euler's theorem gives, exactly, <grad_W L, W> = 0; "
    "with a gradient of norm about 3.6 on a real downstream loss, the radial part measures about 1e-15.",
    "jacobian": "The forward-side companion to the RMSNorm backward Jacobian annihilating the scale direction: "
    "J(z) z = 0.",
    "eps": "The norm removes the scale exactly (the source's RMSNorm has no eps; real ones have eps > 0).",
    "per_row": "RMSNorm's invariance is for the scale of the whole matrix W (one constant c).",
    "census": "In a pre-normalization block the weight W producing z = xW is followed by an RMSNorm; "
    "its scale is a gauge the loss cannot see.",
}


def output_tolerance(dtype: str, cfg: GaugeConfig, scale: float) -> Tolerance:
    """QK-norm output: ``z = x W^T`` sums ``d_model`` products, then mean square, sqrt and divide (depth 3)."""
    return tolerance(dtype, size=cfg.d_model, depth=3, scale=scale)


def loss_tolerance(dtype: str, cfg: GaugeConfig, loss: float) -> Tolerance:
    r"""Round-off bound of one loss evaluation, so of ``|L(p') - L(p)|`` when ``p'`` should change nothing.

    Any change in the forward pass, even one ulp in one activation, re-rounds everything downstream,
    so the two evaluations differ by the loss's own round-off: ``d_model``-term reductions through
    depth ``4 n_layers + 4`` (per block: pre-norm, q/k/v/o matmuls, softmax, MLP; plus embedding, final
    norm, logits, cross-entropy), relative to :math:`L`.  A bound, not an estimate: a tensor that barely
    matters can change :math:`L` by less than this in float32, which is why the census also asks for
    the scale-free radial test (:func:`radial_tolerance`).
    """
    return tolerance(dtype, size=cfg.d_model, depth=4 * cfg.n_layers + 4, scale=abs(loss))


def radial_tolerance(dtype: str, cfg: GaugeConfig, scale: float) -> Tolerance:
    r"""``<g, W>`` against :math:`\lVert g\rVert\,\lVert W\rVert` (``scale``): a dot product's error relative to
    the product of norms is :math:`O(\epsilon)`; the gradient itself went back through ``d_model``-term
    contractions over ``2 n_layers + 2`` steps."""
    return tolerance(dtype, size=cfg.d_model, depth=2 * cfg.n_layers + 2, scale=scale)


def q_norm_output(x: torch.Tensor, W: torch.Tensor, n_heads: int, eps: float,
                  gain: torch.Tensor | None) -> torch.Tensor:
    """``RMSNorm_eps(x W^T)`` per head: ``x (N, D)``, ``W (..., D, D)`` -> ``(..., N, H, hd)``."""
    z = torch.matmul(x, W.transpose(-1, -2))  # (..., N, D)
    return rms_norm(z.unflatten(-1, (n_heads, -1)), eps, gain)  # (..., N, H, hd)


def scale_deviation(x: torch.Tensor, W: torch.Tensor, n_heads: int, eps: float, gain: torch.Tensor | None,
                    cs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Measured :math:`\max|{\rm RMSNorm}_\epsilon(x(cW)^\top) - {\rm RMSNorm}_\epsilon(xW^\top)|` per ``c``.

    The weight is scaled and stored in ``W.dtype`` first (as a model would hold it), then multiplied:
    this is the source's experiment, not ``RMSNorm(c z)``.  Returns ``(dev (C,), ref (N, H, hd))``.
    """
    ref = q_norm_output(x, W, n_heads, eps, gain)  # (N, H, hd)
    chunk = max(1, CHUNK_ELEMENTS // ref.numel())
    devs = [(q_norm_output(x, cc[:, None, None] * W, n_heads, eps, gain) - ref).abs().flatten(1).amax(dim=1)
            for cc in cs.to(W.dtype).split(chunk)]  # a few chunks of scales (c, D, D), each one batched matmul
    return torch.cat(devs), ref


def grad_of(loss_fn: Callable[[], torch.Tensor], params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients of ``loss_fn()`` w.r.t. ``params`` only (the model's parameters are frozen otherwise)."""
    for p in params:
        p.requires_grad_(True)
    try:
        return list(torch.autograd.grad(loss_fn(), list(params)))
    finally:
        for p in params:
            p.requires_grad_(False)


def loss_change(loss_fn: Callable[[], torch.Tensor], L0: float, *scalings: tuple[torch.Tensor, float]) -> float:
    """``|L - L0|`` with each ``(tensor, c)`` of ``scalings`` scaled by ``c`` (restored bit for bit after)."""
    with contextlib.ExitStack() as stack:
        for p, c in scalings:
            stack.enter_context(scaled(p, c))
        return abs(float(loss_fn()) - L0)


def measured_tensor(setup: GaugeSetup, dtype: str, tensor: torch.Tensor | None = None) -> dict[str, object]:
    """Which tensor a check measured, named from the model itself (the parameter that *is* ``tensor``, by default
    ``setup.weight``), so a record cannot say ``q_proj`` while measuring another tensor."""
    W = setup.weight(dtype) if tensor is None else tensor
    name = next((n for n, p in setup.model(dtype).named_parameters() if p is W), "<not a parameter of the model>")
    return {"tensor": name, "shape": list(W.shape), "n_heads": setup.config.n_heads}
