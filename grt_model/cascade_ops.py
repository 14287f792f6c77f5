r"""The eager (vectorized PyTorch) operations of the rotation cascade: the path for every device and dtype, and
the fused kernels' double backward and fallback (:mod:`grt_model.kernels` imports them; nothing here imports
the kernels).  The formulas are stated in :mod:`grt_model.cascade`'s docstring (source:
``../shared/seeds/001_cfb910613b442095.txt``, "Inside one stored weight").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grt_model.butterfly import from_pairs, stage_stride, to_pairs
from grt_model.radial_gelu import radial_gelu


def clifford_features(x0: torch.Tensor, x1: torch.Tensor, norm: str = "pair_energy") -> torch.Tensor:
    r"""The four normalized Clifford features, feature-major: ``[..., P] x2 -> [..., 4P]``:
    :math:`[e/m,\ x_0/\sqrt m,\ x_1/\sqrt m,\ (x_{0,p}x_{1,p+1} - x_{1,p}x_{0,p+1})/m]` with
    :math:`e = x_0^2 + x_1^2` and :math:`m` the token's mean pair energy (floored at the dtype's tiny).

    ``norm="feature_rms"`` (the ablation of :data:`grt_model.config.COUPLING_NORMS`) instead divides the raw
    features :math:`[e, x_0, x_1, \text{area}]` by their root mean square over all :math:`4P`."""
    energy = x0 * x0 + x1 * x1  # (..., P)
    area = x0 * x1.roll(-1, dims=-1) - x1 * x0.roll(-1, dims=-1)  # x0[p] x1[p+1] - x1[p] x0[p+1]
    if norm == "feature_rms":
        raw = torch.cat((energy, x0, x1, area), dim=-1)  # (..., 4P)
        return raw / raw.square().mean(dim=-1, keepdim=True).sqrt().clamp_min(torch.finfo(x0.dtype).tiny)
    # tiny floor: an all-zero token (FFN padding) gives zero features instead of 0/0
    m = energy.mean(dim=-1, keepdim=True).clamp_min(torch.finfo(x0.dtype).tiny)  # (..., 1)
    rs = m.sqrt()
    return torch.cat((energy / m, x0 / rs, x1 / rs, area / m), dim=-1)  # (..., 4P)


def broadcast_input_heads(x: torch.Tensor, heads: int, width: int) -> torch.Tensor:
    """``[..., Hin*width] -> [..., heads*width]`` with cascade head ``h`` reading input head ``h % Hin``
    (``Hin`` divides ``heads``; Q, K and V of one head read the same slice of the token).  Identity when
    ``Hin == heads``."""
    hin = x.shape[-1] // width
    if hin == heads:
        return x
    lead = x.shape[:-1]
    v = x.reshape(*lead, 1, hin * width).expand(*lead, heads // hin, hin * width)  # (..., H/Hin, Hin*d)
    return v.reshape(*lead, heads * width)


def cascade_eager(x: torch.Tensor, angles: torch.Tensor, raw_scales: torch.Tensor, coupling: torch.Tensor | None,
                  width: int, first_stage: int = 0, feature_norm: str = "pair_energy") -> torch.Tensor:
    """The eager path as a function of the parameters: ``x [..., Hin*width]`` (``Hin`` dividing ``H``:
    see :func:`broadcast_input_heads`), ``angles [H, S, P]``, ``raw_scales [H, S, P, 2]``,
    ``coupling [H, S, 4P, P]`` or None; ``[..., H*width]`` out.  Vectorized: strides are views, heads are a
    batch dim; the only loop runs over stages."""
    H, S = angles.shape[:2]
    lead = x.shape[:-1]
    x = broadcast_input_heads(x, H, width).reshape(*lead, H, width)  # (..., H, d)
    scales = F.softplus(raw_scales)  # (H, S, P, 2)
    for s in range(S):
        h = stage_stride(width, first_stage + s)
        x0, x1 = to_pairs(x, h)  # (..., H, P) each
        theta = angles[:, s]  # (H, P)
        if coupling is not None:
            feats = clifford_features(x0, x1, feature_norm)  # (..., H, 4P)
            theta = theta + torch.tanh(torch.einsum("...hf,hfp->...hp", feats, coupling[:, s]))
        c, sn = torch.cos(theta), torch.sin(theta)
        y0 = (c * x0 - sn * x1) * scales[:, s, :, 0]
        y1 = (sn * x0 + c * x1) * scales[:, s, :, 1]
        x = from_pairs(y0, y1, h)
    return x.reshape(*lead, H * width)


def ffn_eager(z: torch.Tensor, e_angles: torch.Tensor, e_raw: torch.Tensor, c_angles: torch.Tensor,
              c_raw: torch.Tensor, d_out: int) -> torch.Tensor:
    r""":math:`\Pi\,C_2(\operatorname{RadialGELU}(C_1(\Pi^\top z)))`: zero-pad to the cascades' width, expand,
    RadialGELU, contract, keep the first ``d_out`` coordinates (the composition the fused FFN computes)."""
    W = 2 * e_angles.shape[-1]
    h = F.pad(z, (0, W - z.shape[-1]))  # (..., W): signal in the first d_in coordinates
    h = radial_gelu(cascade_eager(h, e_angles, e_raw, None, W, 0))
    return cascade_eager(h, c_angles, c_raw, None, W, 0)[..., :d_out]


def stage_maps(angles: torch.Tensor, raw_scales: torch.Tensor) -> torch.Tensor:
    r"""``[..., P, 4]``: each pair's 2x2 map :math:`D R(\theta)` row-major, ``(s0 c, -s0 s, s1 s, s1 c)``.

    The coupling-off kernels run on these four numbers; their gradient (``sum_t g x^T``, from the kernel)
    goes back to the angle and the raw scales through autograd on this function.
    """
    s = F.softplus(raw_scales)  # (..., P, 2)
    c, sn = torch.cos(angles), torch.sin(angles)
    return torch.stack((s[..., 0] * c, -s[..., 0] * sn, s[..., 1] * sn, s[..., 1] * c), dim=-1)


def stage_inverse_maps(angles: torch.Tensor, raw_scales: torch.Tensor) -> torch.Tensor:
    r"""``[..., P, 4]``: :math:`(D R)^{-1} = R^\top D^{-1}` row-major, ``(c/s0, s/s1, -s/s0, c/s1)``."""
    s = F.softplus(raw_scales)  # (..., P, 2)
    c, sn = torch.cos(angles), torch.sin(angles)
    return torch.stack((c / s[..., 0], sn / s[..., 1], -sn / s[..., 0], c / s[..., 1]), dim=-1)
