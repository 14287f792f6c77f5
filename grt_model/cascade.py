r"""The rotation cascade: GRT's replacement for a dense projection.

A cascade of ``n_stages`` stages acts on ``[..., heads * width]`` (each head's
``width`` coordinates independently, with its own parameters).  Stage :math:`s`
of head :math:`h`, on the stage's pairs :math:`(x_0, x_1)_p` (pairing: see
:mod:`grt_model.butterfly`), computes

.. math::
   m &= \tfrac1P \textstyle\sum_p (x_{0p}^2 + x_{1p}^2)
      \quad\text{(mean pair energy of the token; features are divided by it)}\\
   F &= \big[\,\tfrac{x_0^2 + x_1^2}{m},\; \tfrac{x_0}{\sqrt m},\; \tfrac{x_1}{\sqrt m},\;
         \tfrac{x_{0,p} x_{1,p+1} - x_{1,p} x_{0,p+1}}{m}\,\big] \in \mathbb R^{4P}
      \quad\text{(feature-major: rows } p,\,P{+}p,\,2P{+}p,\,3P{+}p)\\
   \Delta\theta &= \tanh(F\,W_{h,s}), \qquad W_{h,s}\in\mathbb R^{4P\times P}
      \quad\text{(the Clifford coupling; zero when coupling is off)}\\
   \begin{pmatrix}y_0\\y_1\end{pmatrix}_p &=
      \begin{pmatrix}s_{0}&0\\0&s_{1}\end{pmatrix}_{p}
      \begin{pmatrix}\cos\vartheta_p&-\sin\vartheta_p\\ \sin\vartheta_p&\cos\vartheta_p\end{pmatrix}
      \begin{pmatrix}x_0\\x_1\end{pmatrix}_p,
      \qquad \vartheta = \theta_{h,s} + \Delta\theta,\quad s = \operatorname{softplus}(\tilde s_{h,s}).

Source: ``../shared/seeds/001_cfb910613b442095.txt`` ("Inside one stored weight",
"How the coupling W is indexed").  The text says the features are "normalized"
without saying how; dividing by the token's mean pair energy :math:`m` makes
every feature homogeneous of degree 0 in :math:`x`, so the nudge ignores the
input's overall scale and the whole cascade is positively homogeneous of degree
1 (:math:`C(cx) = c\,C(x)` for :math:`c>0`) -- the same property a linear map has.

Every per-pair map has determinant :math:`s_0 s_1 > 0` and, at unit scales, is a
rotation, whatever :math:`\Delta\theta` is: with coupling off the cascade is a
linear map in :math:`GL^+(d)` (in :math:`SO(d)` at unit scales); with coupling on
it still preserves every input's length at unit scales.

Parameters (per head ``H``, stage ``S``, pair ``P``): ``angles`` ``[H, S, P]``,
``raw_scales`` ``[H, S, P, 2]`` (softplus gives :math:`s_0, s_1`), and
``coupling`` ``[H, S, 4P, P]`` (absent when ``coupling=False``).

Paths: :func:`grt_model.cascade_ops.cascade_eager` (vectorized PyTorch, any device and dtype, any-order
derivatives) and the numba kernels of :mod:`grt_model.kernels` (CPU, float32/float64: all stages per token tile
in cache); which one computes a call is decided from its tensors by :func:`grt_model.kernels.use_kernels`.
Both compute the same function (``tests/test_fast_cascade.py``); :func:`reference_cascade` is the slow
explicit-matrix check of both.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from grt_model.butterfly import check_width, pair_index, stage_stride
from grt_model.cascade_ops import broadcast_input_heads, cascade_eager, clifford_features
from grt_model.kernels import rotation_cascade

__all__ = [
    "UNIT_RAW_SCALE", "RotationCascade", "broadcast_input_heads", "cascade_eager", "clifford_features",
    "materialize", "reference_cascade",
]

UNIT_RAW_SCALE = math.log(math.e - 1.0)  # softplus(log(e-1)) = 1: cascades start length-preserving
COUPLING_INIT_STD = 0.02  # small nudges at init: the cascade starts close to its fixed-angle rotation


class RotationCascade(nn.Module):
    """``n_stages`` butterfly stages of Givens rotation + per-axis softplus scale (+ Clifford coupling).

    Forward on ``[..., heads * width]``; ``width`` must be a power of two.
    """

    def __init__(self, width: int, n_stages: int, coupling: bool = True, heads: int = 1,
                 *, first_stage: int = 0, coupling_init_std: float = COUPLING_INIT_STD,
                 feature_norm: str = "pair_energy",
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        check_width(width)
        for name, v, lo in (("n_stages", n_stages, 1), ("heads", heads, 1), ("first_stage", first_stage, 0)):
            if v < lo:
                raise ValueError(f"{name} must be >= {lo}, got {v}")
        if feature_norm not in ("pair_energy", "feature_rms"):
            raise ValueError(f"feature_norm must be pair_energy or feature_rms, got {feature_norm!r}")
        self.width, self.n_stages, self.heads, self.first_stage = width, n_stages, heads, first_stage
        self.feature_norm = feature_norm  # the kernels implement pair_energy only; feature_rms runs eager
        self.has_coupling = bool(coupling)
        P = width // 2
        kw = {"dtype": dtype, "device": device}  # build in the target dtype: softplus(raw)=1 exactly
        self.angles = nn.Parameter(torch.empty(heads, n_stages, P, **kw))  # (H, S, P) base phase theta
        self.raw_scales = nn.Parameter(torch.empty(heads, n_stages, P, 2, **kw))  # (H, S, P, 2) -> (s0, s1)
        if self.has_coupling:
            self.coupling = nn.Parameter(torch.empty(heads, n_stages, 4 * P, P, **kw))  # (H, S, 4P, P)
        else:
            self.register_parameter("coupling", None)
        self.coupling_init_std = coupling_init_std
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.angles.uniform_(-math.pi, math.pi)
            self.raw_scales.fill_(UNIT_RAW_SCALE)
            if self.coupling is not None:
                self.coupling.normal_(0.0, self.coupling_init_std)

    @property
    def pairs(self) -> int:
        return self.width // 2

    def strides(self) -> list[int]:
        return [stage_stride(self.width, self.first_stage + s) for s in range(self.n_stages)]

    def scales(self) -> torch.Tensor:
        """``[H, S, P, 2]`` positive scales (s0, s1)."""
        return F.softplus(self.raw_scales)

    def extra_repr(self) -> str:
        return (f"width={self.width}, n_stages={self.n_stages}, heads={self.heads}, "
                f"coupling={self.has_coupling}, strides={self.strides()}")

    def _check_input(self, x: torch.Tensor) -> int:
        """The number of input heads ``Hin`` of ``x [..., Hin*width]``: ``heads``, or a divisor of it (cascade
        head ``h`` then reads input head ``h % Hin``: one token slice feeds Q, K and V without a copy)."""
        d, H = x.shape[-1], self.heads
        if d % self.width or not 1 <= d // self.width <= H or H % (d // self.width):
            raise ValueError(
                f"RotationCascade expects last dim heads*width = {H}*{self.width} = {H * self.width} (or Hin*width "
                f"with Hin dividing heads={H}: shared input heads), got input of shape {tuple(x.shape)}"
            )
        return d // self.width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., Hin*width] -> [..., heads*width]`` (``Hin = heads``, or a divisor: shared input heads)."""
        self._check_input(x)  # shape check with the message every path shares
        return rotation_cascade(x, self.angles, self.raw_scales, self.coupling, self.width, self.first_stage,
                                self.feature_norm)

    def stage_trace(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The activation after every stage (stage 0's input first): for figures and diagnostics (eager)."""
        self._check_input(x)
        out = [broadcast_input_heads(x, self.heads, self.width)]
        for s in range(self.n_stages):
            cpl = None if self.coupling is None else self.coupling[:, s : s + 1]
            out.append(cascade_eager(out[-1], self.angles[:, s : s + 1], self.raw_scales[:, s : s + 1], cpl,
                                     self.width, self.first_stage + s, self.feature_norm))
        return out

    @torch.no_grad()
    def log_det(self) -> torch.Tensor:
        """``[H]``: log|det| of the (coupling-off) linear map, sum of log(s0 s1) over stages and pairs."""
        return torch.log(self.scales()).sum(dim=(1, 2, 3))


# The slow, obviously correct reference: explicit d x d Givens and scale matrices, stage by stage.


def givens_matrix(width: int, i0: int, i1: int, theta: torch.Tensor) -> torch.Tensor:
    """``[..., d, d]`` identity except the (i0, i1) plane, rotated by ``theta`` (``[...]``)."""
    G = torch.eye(width, dtype=theta.dtype, device=theta.device).expand(*theta.shape, width, width).clone()
    c, s = torch.cos(theta), torch.sin(theta)
    G[..., i0, i0] = c
    G[..., i0, i1] = -s
    G[..., i1, i0] = s
    G[..., i1, i1] = c
    return G


def reference_features(x: torch.Tensor, pairs: list[tuple[int, int]]) -> torch.Tensor:
    """``[..., d] -> [..., 4P]`` Clifford features written out pair by pair."""
    e = [x[..., i0] ** 2 + x[..., i1] ** 2 for i0, i1 in pairs]
    m = (sum(e) / len(pairs)).clamp_min(torch.finfo(x.dtype).tiny)
    f0 = [ep / m for ep in e]
    f1 = [x[..., i0] / m.sqrt() for i0, _ in pairs]
    f2 = [x[..., i1] / m.sqrt() for _, i1 in pairs]
    f3 = [(x[..., i0] * x[..., j1] - x[..., i1] * x[..., j0]) / m  # pair p against pair p+1 mod P
          for (i0, i1), (j0, j1) in zip(pairs, pairs[1:] + pairs[:1])]
    return torch.stack(f0 + f1 + f2 + f3, dim=-1)


def reference_cascade(cascade: RotationCascade, x: torch.Tensor) -> torch.Tensor:
    """Apply ``cascade`` as a product of explicit matrices: ``y = prod_s D_s G_s(x) x`` per head.

    Each stage builds one ``[..., d, d]`` Givens matrix per pair (the pairs are
    disjoint, so their product is the stage's block rotation) and a diagonal
    scale matrix, then multiplies.  Loops over stages and pairs on purpose: this
    is the slow path the fast one is tested against.
    """
    d, H = cascade.width, cascade.heads
    cascade._check_input(x)
    xs = broadcast_input_heads(x, H, d).unflatten(-1, (H, d))  # (..., H, d)
    scales = cascade.scales()
    outs = []
    for head in range(H):
        v = xs[..., head, :]  # (..., d)
        for s in range(cascade.n_stages):
            pairs = [tuple(p) for p in pair_index(d, cascade.first_stage + s).tolist()]
            theta = cascade.angles[head, s].expand(*v.shape[:-1], len(pairs))  # (..., P)
            if cascade.coupling is not None:
                feats = reference_features(v, pairs)  # (..., 4P)
                theta = theta + torch.tanh(feats @ cascade.coupling[head, s])
            M = torch.eye(d, dtype=v.dtype, device=v.device).expand(*v.shape[:-1], d, d)
            for p, (i0, i1) in enumerate(pairs):
                M = givens_matrix(d, i0, i1, theta[..., p]) @ M
            diag = torch.empty(d, dtype=v.dtype, device=v.device)
            idx = torch.tensor(pairs, device=v.device)
            diag = diag.index_put((idx[:, 0],), scales[head, s, :, 0]).index_put((idx[:, 1],), scales[head, s, :, 1])
            M = torch.diag(diag) @ M
            v = (M @ v.unsqueeze(-1)).squeeze(-1)
        outs.append(v)
    return torch.stack(outs, dim=-2).reshape(*x.shape[:-1], H * d)


def materialize(cascade: RotationCascade) -> torch.Tensor:
    """``[H, d, d]`` matrix of a coupling-off cascade (columns are images of basis vectors)."""
    if cascade.coupling is not None:
        raise ValueError("materialize() needs coupling=False: with coupling on the cascade is not linear")
    eye = torch.eye(cascade.width, dtype=cascade.angles.dtype, device=cascade.angles.device)  # (d, d)
    basis = eye.unsqueeze(1).expand(cascade.width, cascade.heads, cascade.width)  # (d_in, H, d)
    out = cascade(basis.reshape(cascade.width, -1)).reshape(cascade.width, cascade.heads, cascade.width)
    return out.permute(1, 2, 0)  # (H, d_out, d_in)
