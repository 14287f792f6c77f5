r"""The measurements behind :mod:`studies.trained.claims`, on float64 copies, one cached traced pass per model
(signal propagation's, for the GRT and the dense baseline: :func:`grt_signal`, :func:`dense_signal`).

Shapes inline: ``B`` sequences, ``T`` tokens, ``N = B*T``, ``D`` width, ``H`` heads, ``S`` stages.  Jacobians
are ``torch.func.vmap(jacrev(...))`` over tokens and heads; Python loops run only over blocks, projections, models.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from grt_model.attention import causal_attention_with_weights
from grt_model.cascade import RotationCascade, broadcast_input_heads, cascade_eager, materialize
from grt_model.model import GATE_NAMES, GRT, GRTBlock
from grt_model.radial_gelu import radial_gelu
from grt_model.rope import apply_rope, rope_angles
from grt_model.trace import trace_model
from rmsgauge import tolerance

JAC_TOKENS = 128  # held-out tokens whose per-token Jacobians are taken (spread evenly over the batch)
COUPLED = ("q", "k", "v", "o", "mixer")


def radial_gelu_jacobian_max() -> float:
    r"""Largest eigenvalue of RadialGELU's Jacobian: :math:`\max_r \Phi(r) + r\varphi(r)`, at :math:`r = \sqrt2`
    (the derivative :math:`\varphi(r)(2 - r^2)` vanishes there); float64, closed form."""
    r = math.sqrt(2.0)
    return 0.5 * (1.0 + math.erf(r / math.sqrt(2.0))) + r * math.exp(-r * r / 2.0) / math.sqrt(2.0 * math.pi)


def float64_copy(model: nn.Module) -> nn.Module:
    """A float64, eval-mode, gradient-free copy (measurements never touch the float32 model)."""
    m = copy.deepcopy(model).to(torch.float64).eval()
    m.requires_grad_(False)
    return m


def memo(cache: dict | None, key: tuple, fn: Callable[[], Any]) -> Any:
    if cache is None:
        return fn()
    return cache[key] if key in cache else cache.setdefault(key, fn())


def summary_stats(x: torch.Tensor) -> dict[str, float]:
    x = x.detach().reshape(-1).to(torch.float64)
    q = torch.quantile(x, torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))
    return {"min": float(q[0]), "median": float(q[1]), "max": float(q[2])}


def rms(x: torch.Tensor) -> torch.Tensor:
    """``[..., D] -> [...]`` root mean square over the last dim."""
    return x.pow(2).mean(dim=-1).sqrt()


def jacobian_token_index(n_tokens: int, k: int) -> torch.Tensor:
    """``[min(k, N)]`` flat token indices spread evenly over the held-out batch (deterministic)."""
    k = min(k, n_tokens)
    return torch.linspace(0, n_tokens - 1, k, dtype=torch.float64).round().long()


def per_token_jacobian(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``x [n, d_in] -> [n, d_out, d_in]``: the Jacobian of a per-token map at each of ``n`` tokens
    (``vmap(jacrev)``; the cascade runs its eager backend under ``torch.func``)."""
    return torch.func.vmap(torch.func.jacrev(lambda t: fn(t.unsqueeze(0)).squeeze(0)))(x)


def cascade_bounds(c: RotationCascade) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``([H], [H])``: :math:`\prod_s \min s` and :math:`\prod_s \max s` per cascade head (min/max over the
    stage's pairs and both axes), summed in logs (11 to 21 factors)."""
    s = c.scales().detach().to(torch.float64)  # (H, S, P, 2)
    return s.amin(dim=(2, 3)).log().sum(1).exp(), s.amax(dim=(2, 3)).log().sum(1).exp()


def cascade_gain(c: RotationCascade, x: torch.Tensor) -> torch.Tensor:
    """``x [N, Hin*w] -> [N, H]``: ||C(x)_h|| / ||x_h|| per token and cascade head (the module's own forward)."""
    y = c(x).unflatten(-1, (c.heads, c.width))  # (N, H, w)
    xin = broadcast_input_heads(x, c.heads, c.width).unflatten(-1, (c.heads, c.width))  # (N, H, w)
    return torch.linalg.vector_norm(y, dim=-1) / torch.linalg.vector_norm(xin, dim=-1)


def cascade_head_jacobians(c: RotationCascade, x: torch.Tensor) -> torch.Tensor:
    """``x [n, Hin*w] -> [n, H, w, w]``: each cascade head's own ``w x w`` Jacobian (heads never mix).

    Coupling on: ``vmap`` over tokens and heads of ``jacrev`` of the head's cascade (``cascade_eager`` on that
    head's parameters: w cotangents per head, not H*w).  Coupling off: the cascade is linear and its Jacobian
    is its matrix (:func:`grt_model.cascade.materialize`), the same at every token.
    """
    n, H, w = x.shape[0], c.heads, c.width
    if not c.has_coupling:
        return materialize(c).unsqueeze(0).expand(n, H, w, w)
    xin = broadcast_input_heads(x, H, w).view(n, H, w)  # (n, H, w)

    def head_jac(xh, ang, raw, cpl):  # xh (w,), ang (S, P), raw (S, P, 2), cpl (S, 4P, P)
        def f(t):
            return cascade_eager(t.unsqueeze(0), ang.unsqueeze(0), raw.unsqueeze(0), cpl.unsqueeze(0), w,
                                 c.first_stage, c.feature_norm).squeeze(0)

        return torch.func.jacrev(f)(xh)  # (w, w)

    over_heads = torch.func.vmap(head_jac, in_dims=(0, 0, 0, 0))
    return torch.func.vmap(over_heads, in_dims=(0, None, None, None))(xin, c.angles, c.raw_scales, c.coupling)


def ffn_jacobian(blk: GRTBlock, z: torch.Tensor) -> torch.Tensor:
    r"""``z [n, D] -> [n, D, D]``: the FFN sublayer's Jacobian :math:`\Pi M_2 J_{RG}(h) M_1 \Pi^\top` at each
    token, :math:`h = M_1\Pi^\top z`, with the RadialGELU Jacobian in closed form per adjacent pair
    :math:`J_{RG} = \Phi(r)I + \varphi(r)\,x x^\top / r` (:mod:`grt_model.radial_gelu`).  Coupling-off FFN
    cascades (the text's) are the matrices :math:`M_1, M_2`; with coupling on, ``vmap(jacrev)`` of the composition.
    """
    if blk.ffn.expand.has_coupling or blk.ffn.contract.has_coupling:
        return per_token_jacobian(lambda t: ffn_composed(blk, t), z)
    n, D = z.shape
    d_ff = blk.ffn.d_ff
    M1, M2 = materialize(blk.ffn.expand)[0], materialize(blk.ffn.contract)[0]  # (d_ff, d_ff) each
    A = M1[:, :D]  # (d_ff, D): zero padding keeps the first D columns
    h = (z @ A.T).view(n, d_ff // 2, 2)  # (n, P, 2) adjacent pairs
    r = torch.linalg.vector_norm(h, dim=-1, keepdim=True)  # (n, P, 1)
    cdf = 0.5 * (1.0 + torch.erf(r / math.sqrt(2.0)))
    pdf_over_r = torch.where(r > 0, torch.exp(-r * r / 2.0) / math.sqrt(2.0 * math.pi) / torch.where(r > 0, r, 1.0),
                             0.0)  # phi(r)/r; the x x^T term vanishes at r = 0
    Ap = A.view(d_ff // 2, 2, D)  # (P, 2, D)
    JA = cdf.unsqueeze(-1) * Ap + pdf_over_r.unsqueeze(-1) * h.unsqueeze(-1) * torch.einsum("npi,pid->npd", h, Ap
                                                                                          ).unsqueeze(-2)
    return M2[:D] @ JA.reshape(n, d_ff, D)  # (n, D, D): truncation keeps the first D rows


def ffn_composed(blk: GRTBlock, z: torch.Tensor) -> torch.Tensor:
    r"""``[N, D] -> [N, D]``: :math:`\Pi C_2(\operatorname{RadialGELU}(C_1(\Pi^\top z)))` through the cascade
    modules themselves (the fused FFN computes the same function; the claim records the difference)."""
    D = z.shape[-1]
    h = blk.ffn.expand(F.pad(z, (0, blk.ffn.d_ff - D)))
    return blk.ffn.contract(radial_gelu(h))[..., :D]


def grt_record(model: GRT, ids: torch.Tensor, cache: dict | None = None) -> dict[str, Any]:
    """The float64 copy and its :func:`~grt_model.trace.trace_model` on ``ids [B, T]``."""

    def run() -> dict[str, Any]:
        m = float64_copy(model)
        return {"model": m, "trace": trace_model(m, ids)}

    return memo(cache, ("grt", id(model)), run)


def dense_attention(attn: nn.Module, z: torch.Tensor) -> dict[str, torch.Tensor]:
    """The dense baseline's attention, unrolled to expose its weights (duck-typed: ``q_proj``, ``k_proj``,
    ``v_proj``, ``o_proj``, optional ``q_norm``/``k_norm``, ``cfg.rope``; the same function as its forward,
    checked in the claim's details).  ``z [B, T, D]``."""
    B, T, D = z.shape
    H = attn.cfg.n_heads
    hd = D // H
    q, k, v = (p(z).view(B, T, H, hd).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    raw = {"q": q.transpose(1, 2), "k": k.transpose(1, 2), "v": v.transpose(1, 2)}  # (B, T, H, hd) each
    if attn.q_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    if attn.cfg.rope:
        ang = rope_angles(T, hd, dtype=z.dtype, device=z.device)  # (T, hd/2)
        q, k = apply_rope(q, ang), apply_rope(k, ang)
    a, w = causal_attention_with_weights(q, k, v)  # (B, H, T, hd), (B, H, T, T)
    a = a.transpose(1, 2).reshape(B, T, D)
    return {**raw, "weights": w, "values": a, "out": attn.o_proj(a)}


def dense_record(model: nn.Module, ids: torch.Tensor, cache: dict | None = None) -> dict[str, Any]:
    """Float64 copy of the dense baseline and, per block, its intermediates on ``ids [B, T]``."""

    def run() -> dict[str, Any]:
        m = float64_copy(model)
        with torch.no_grad():
            x = m.tok_emb(ids)  # (B, T, D)
            blocks, replica_err = [], 0.0
            for blk in m.blocks:
                z = blk.norm1(x)
                att = dense_attention(blk.attn, z)
                replica_err = max(replica_err, float((att["out"] - blk.attn(z)).abs().max()))
                after = x + att["out"]
                z2 = blk.norm2(after)
                mlp = blk.mlp(z2)
                out = after + mlp
                blocks.append({"stream_in": x, "attn_in": z, **att, "after_attn": after, "mlp_in": z2,
                               "mlp_out": mlp, "stream_out": out})
                x = out
        return {"model": m, "blocks": blocks, "replica_err": replica_err}

    return memo(cache, ("dense", id(model)), run)


def models_by_state(grt: GRT, dense: nn.Module | None, grt_init: GRT | None, dense_init: nn.Module | None
            ) -> list[tuple[str, str, nn.Module]]:
    """``(kind, state, model)`` for every model given: trained first, then init."""
    given = [("grt", "trained", grt), ("dense", "trained", dense), ("grt", "init", grt_init),
             ("dense", "init", dense_init)]
    return [(kind, state, m) for kind, state, m in given if m is not None]


def check_held_out_ids(grt: GRT, ids: torch.Tensor) -> torch.Tensor:
    if not isinstance(grt, GRT):
        raise TypeError(f"the trained claims need a grt_model.GRT, got {type(grt).__name__}")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
        raise ValueError("held_out_ids must be a [B, T] long tensor of held-out token ids")
    if ids.shape[0] < 2 or ids.shape[1] < 2:
        raise ValueError(f"held_out_ids needs at least 2 sequences of 2 tokens (standard errors, attention), "
                         f"got shape {tuple(ids.shape)}")
    return ids


def projection_inputs(blk: GRTBlock, bt) -> dict[str, tuple[RotationCascade, torch.Tensor]]:
    """Each cascade of a block with its held-out input ``[N, Hin*w]`` (from the block's trace ``bt``)."""
    D = bt.attn_in.shape[-1]
    return {
        "qkv": (blk.attn.qkv, bt.attn_in.reshape(-1, D)),
        "o": (blk.attn.o, bt.attn_values.reshape(-1, D)),
        "mixer": (blk.mixer.cascade, bt.mixer_in.reshape(-1, D)),
        "ffn_expand": (blk.ffn.expand, F.pad(bt.ffn_in, (0, blk.ffn.d_ff - D)).reshape(-1, blk.ffn.d_ff)),
        "ffn_contract": (blk.ffn.contract, bt.gelu_out.reshape(-1, blk.ffn.d_ff)),
    }


def _projection_jacobians(model: GRT, ids: torch.Tensor, jac_tokens: int, cache: dict | None,
                          names: tuple[str, ...], ffn: bool) -> list[dict[str, torch.Tensor]]:
    """Per block, the per-head Jacobians of the cascades ``names`` (and the FFN sublayer's when ``ffn``)."""
    rec = grt_record(model, ids, cache)
    m, tr = rec["model"], rec["trace"]
    out = []
    for blk, bt in zip(m.blocks, tr.blocks):
        inp = projection_inputs(blk, bt)
        sel = jacobian_token_index(inp["qkv"][1].shape[0], jac_tokens)
        js: dict[str, torch.Tensor] = {}
        for name in names:
            c, x = inp[name]
            # (n, H, w, w); a coupling-off cascade is linear: its one matrix serves every token
            J = cascade_head_jacobians(c, x[sel] if c.has_coupling else x[sel[:1]])
            js.update(split_qkv(J, m.config.n_heads) if name == "qkv" else {name: J})
        if ffn:
            z = bt.ffn_in.reshape(-1, bt.ffn_in.shape[-1])[sel]  # (n, D)
            js["ffn"] = ffn_jacobian(blk, z)  # (n, D, D)
        out.append(js)
    return out


def det_sign_rows(jacobians: list[dict[str, torch.Tensor]]) -> list[dict[str, dict[str, Any]]]:
    """Per block and projection of :data:`COUPLED`: how many of its (token, head) Jacobians have det < 0, by
    ``slogdet``, and the range of log|det|."""
    out = []
    for js in jacobians:
        row = {}
        for k in COUPLED:
            sign, logabs = torch.linalg.slogdet(js[k])  # (n, heads)
            row[k] = {"fraction_negative": float((sign < 0).to(torch.float64).mean()),
                      "negative": int((sign < 0).sum()), "of": int(sign.numel()),
                      "log|det| range": [float(logabs.min()), float(logabs.max())]}
        out.append(row)
    return out


def negative_det_fraction(model: GRT, ids: torch.Tensor, jac_tokens: int = JAC_TOKENS) -> dict[str, Any]:
    """The fraction of (token, head) Jacobians of the coupled projections with det < 0 (float64), over every
    block, without the FFN Jacobians of :func:`grt_jacobians`: ``{"fraction", "negative", "of", "per_block":
    [{projection: fraction}]}``."""
    rows = det_sign_rows(_projection_jacobians(model, ids, jac_tokens, None, ("qkv", "o", "mixer"), ffn=False))
    neg, of = (sum(r[k][n] for r in rows for k in COUPLED) for n in ("negative", "of"))
    return {"fraction": neg / max(1, of), "negative": neg, "of": of,
            "per_block": [{k: r[k]["fraction_negative"] for k in COUPLED} for r in rows]}


def split_qkv(t: torch.Tensor, n_heads: int) -> dict[str, torch.Tensor]:
    """``[n, 3H, ...] -> {q, k, v}: [n, H, ...]`` (cascade head j*H + h is projection j of head h)."""
    return dict(zip("qkv", t.unflatten(1, (3, n_heads)).unbind(1)))


def grt_jacobians(model: GRT, ids: torch.Tensor, jac_tokens: int, cache: dict | None = None
                  ) -> list[dict[str, torch.Tensor]]:
    """Per block: each projection's per-head Jacobians ``[n, heads, w, w]`` at ``n`` held-out tokens, plus the
    whole FFN sublayer's ``[n, D, D]`` (cached: signal propagation and the det sign share them)."""
    names = ("qkv", "o", "mixer", "ffn_expand", "ffn_contract")
    return memo(cache, ("grt_jac", id(model), jac_tokens),
                lambda: _projection_jacobians(model, ids, jac_tokens, cache, names, ffn=True))


def pairwise_js_bits(w: torch.Tensor) -> torch.Tensor:
    r"""``w [B, H, T, T]`` attention rows -> ``[B, H, H, T]`` Jensen-Shannon divergence (bits) between every
    pair of heads' distributions of each query:
    :math:`\tfrac12\mathrm{KL}(p\Vert m) + \tfrac12\mathrm{KL}(q\Vert m)`, :math:`m = (p+q)/2`, :math:`0\log0 = 0`.

    The ratio :math:`a/m` is taken as :math:`2a/(p+q)`: a near one-hot head has subnormal weights, and halving
    the smallest subnormal rounds to 0, which made :math:`a/m` infinite (a trained 12-block GRT hit it)."""
    p, q = w.unsqueeze(2), w.unsqueeze(1)  # (B, H, 1, T, T), (B, 1, H, T, T)
    total = p + q  # (B, H, H, T, T); >= a wherever a > 0, so never 0 there

    def kl(a: torch.Tensor) -> torch.Tensor:
        ratio = 2 * torch.where(a > 0, a, 1.0) / torch.where(a > 0, total, 2.0)  # in (0, 2]
        return torch.where(a > 0, a * torch.log2(ratio), 0.0).sum(-1)

    return 0.5 * kl(p.expand_as(total)) + 0.5 * kl(q.expand_as(total))


def linear_cka(x: torch.Tensor) -> torch.Tensor:
    r"""``x [N, H, d] -> [H, H]`` linear CKA between heads' representations (Kornblith et al. 2019):
    :math:`\lVert Y^\top X\rVert_F^2 / (\lVert X^\top X\rVert_F \lVert Y^\top Y\rVert_F)` on centred columns."""
    x = x - x.mean(0, keepdim=True)
    cross = torch.einsum("nhi,ngj->hgij", x, x).pow(2).sum((-1, -2))  # (H, H)
    d = cross.diagonal().sqrt()
    return cross / (d[:, None] * d[None, :])


def cosine_matrix(v: torch.Tensor) -> torch.Tensor:
    """``[H, n] -> [H, H]`` cosine similarity of rows."""
    v = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    return v @ v.T


def grt_head_parameters(m: GRT, b: int) -> dict[str, torch.Tensor]:
    """``{q, k, v, o}: [H, n]`` per head: (cos θ, sin θ, log s, coupling W) of its cascade, flattened."""
    H = m.config.n_heads

    def flat(c: RotationCascade) -> torch.Tensor:
        parts = [torch.cos(c.angles), torch.sin(c.angles), c.scales().log().flatten(2)]
        if c.coupling is not None:
            parts.append(c.coupling.flatten(2))
        return torch.cat([p.flatten(1) for p in parts], dim=1)  # (heads, n)

    attn = m.blocks[b].attn
    return {**dict(zip("qkv", flat(attn.qkv).unflatten(0, (3, H)).unbind(0))), "o": flat(attn.o)}


def head_stats(w: torch.Tensor, outs: dict[str, torch.Tensor], params: dict[str, torch.Tensor], sigmas: float
               ) -> dict[str, Any]:
    """Everything head_diversity reports for one block: ``w [B, H, T, T]``; ``outs`` {q,k,v}: ``[B, T, H, d]``; a
    head pair is distinct when its mean JS exceeds ``sigmas`` standard errors (the claim's verdict threshold)."""
    B, H, T, _ = w.shape
    js = pairwise_js_bits(w)[..., 1:]  # (B, H, H, T-1): query 0 has one key, identical for every head
    per_seq = js.mean(-1)  # (B, H, H)
    mean = per_seq.mean(0)  # (H, H)
    se = per_seq.std(0, unbiased=True) / math.sqrt(B)  # (H, H) over independent windows
    iu = torch.triu_indices(H, H, 1)
    js_pairs, se_pairs = mean[iu[0], iu[1]], se[iu[0], iu[1]]
    distinct = js_pairs > sigmas * se_pairs  # (pairs,)
    cos = cosine_matrix(w.permute(1, 0, 2, 3).reshape(H, -1))
    ent = -torch.where(w > 0, w * torch.log(torch.where(w > 0, w, 1.0)), 0.0).sum(-1)  # (B, H, T) nats
    norm_ent = ent[..., 1:] / torch.log(torch.arange(2, T + 1, dtype=w.dtype))  # (B, H, T-1): 1 = uniform
    self_w = w.diagonal(dim1=-2, dim2=-1)[..., 1:]  # (B, H, T-1)
    cka = {k: linear_cka(o.reshape(-1, H, o.shape[-1])) for k, o in outs.items()}
    par = {k: cosine_matrix(p) for k, p in params.items()}
    off = lambda M: M[iu[0], iu[1]]  # noqa: E731 (upper triangle, the distinct head pairs)
    return {
        "js_bits_pairs": js_pairs.tolist(), "js_se_pairs": se_pairs.tolist(),
        "min_js_bits": float(js_pairs.min()), "all_pairs_distinct": bool(distinct.all()),
        "map_cosine_pairs": off(cos).tolist(),
        "self_weight_per_head": self_w.mean((0, 2)).tolist(),
        "normalized_entropy_per_head": norm_ent.mean((0, 2)).tolist(),
        "cka_max_offdiag": {k: float(off(M).max()) for k, M in cka.items()},
        "param_cosine_max_abs_offdiag": {k: float(off(M).abs().max()) for k, M in par.items()},
    }


def _span(t: torch.Tensor) -> list[float]:
    return [float(t.min()), float(t.max())]


def grt_signal(model: GRT, ids: torch.Tensor, jac_tokens: int, cache: dict | None) -> dict[str, Any]:
    """Per block of the GRT: each projection's gains and Jacobian singular values against its scale bound, the
    FFN sublayer's against its upper bounds, and the sublayer and block RMS gains; ``ok``: every bound that
    holds by construction held (float64 round-off from :func:`rmsgauge.tolerance`)."""
    rec = grt_record(model, ids, cache)
    m, tr = rec["model"], rec["trace"]
    H = m.config.n_heads
    jac = grt_jacobians(model, ids, jac_tokens, cache)
    g_rg = radial_gelu_jacobian_max()
    blocks, ok_all, worst = [], True, {}
    for b, (blk, bt, js) in enumerate(zip(m.blocks, tr.blocks, jac)):
        inp = projection_inputs(blk, bt)
        proj: dict[str, Any] = {}
        for name, (c, x) in inp.items():
            gain, (lo, hi) = cascade_gain(c, x), (b.unsqueeze(0) for b in cascade_bounds(c))  # (N, Hc), (1, Hc) each
            parts = ({k: (gain_k, split_qkv(lo, H)[k], split_qkv(hi, H)[k]) for k, gain_k in split_qkv(gain, H).items()}
                     if name == "qkv" else {name: (gain, lo, hi)})
            tol = tolerance(torch.float64, size=c.width, depth=c.n_stages)
            for k, (gk, lo_k, hi_k) in parts.items():  # (N, heads), (1, heads), (1, heads)
                valid = torch.isfinite(gk)  # a zero input slice has no gain
                inside = (gk >= lo_k * (1 - tol.rtol)) & (gk <= hi_k * (1 + tol.rtol))
                gain_ok = bool((inside | ~valid).all())
                sv = torch.linalg.svdvals(js[k])  # (n, heads, w)
                sv_lo_ratio = float((sv.amin(-1) / lo_k).min())  # >= 1 inside the bound
                sv_hi_ratio = float((sv.amax(-1) / hi_k).max())  # <= 1 inside the bound
                linear = not c.has_coupling
                jac_ok = (not linear) or (sv_lo_ratio >= 1 - tol.rtol and sv_hi_ratio <= 1 + tol.rtol)
                ok_all &= gain_ok and jac_ok
                proj[k] = {"gain": summary_stats(gk[valid]), "bound": [float(lo_k.min()), float(hi_k.max())],
                           "gain_in_bound": gain_ok, "jacobian_sv": _span(sv),
                           "sv_max / bound_hi": sv_hi_ratio, "sv_min / bound_lo": sv_lo_ratio,
                           "jacobian_bounded_by_construction": linear, "jacobian_in_bound": bool(jac_ok)}
                if not linear:
                    worst[f"block{b}.{k}"] = sv_hi_ratio
        # the whole FFN sublayer's processing: upper bounds only (truncation has a null space)
        z = bt.ffn_in.reshape(-1, bt.ffn_in.shape[-1])
        y = ffn_composed(blk, z)
        fused_err = float((y - blk.ffn(z)).abs().max())
        g_ffn = torch.linalg.vector_norm(y, dim=-1) / torch.linalg.vector_norm(z, dim=-1)  # (N,)
        hi_val = float(cascade_bounds(blk.ffn.expand)[1].max() * cascade_bounds(blk.ffn.contract)[1].max())
        hi_jac = hi_val * g_rg
        sv_ffn = torch.linalg.svdvals(js["ffn"])  # (n, D)
        tol = tolerance(torch.float64, size=blk.ffn.d_ff, depth=2 * blk.ffn.expand.n_stages + 1)
        gain_ok = bool(g_ffn.max() <= hi_val * (1 + tol.rtol))
        jac_ok = bool(sv_ffn.max() <= hi_jac * (1 + tol.rtol))
        ok_all &= gain_ok and jac_ok
        proj["ffn"] = {"gain": summary_stats(g_ffn), "bound": [0.0, hi_val], "gain_in_bound": gain_ok,
                       "jacobian_sv": _span(sv_ffn), "jacobian_upper_bound": hi_jac,
                       "jacobian_in_bound": jac_ok, "fused_vs_composed_max_diff": fused_err}
        # sublayer and block RMS gains on the stream: (stream in, stream out, normed input) per sublayer
        sides = {"attn": (bt.stream_in, bt.after_attn, bt.attn_in),
                 "mixer": (bt.after_attn, bt.after_mixer, bt.mixer_in),
                 "ffn": (bt.after_mixer, bt.stream_out, bt.ffn_in)}
        gates = dict(zip(GATE_NAMES, blk.gates().tolist()))
        sub = {n: {"process_gain rms(f(PN x))/rms(PN x)": summary_stats(rms(y - x) / gates[n] / rms(normed)),
                   "write_gain rms(g f)/rms(x)": summary_stats(rms(y - x) / rms(x))}
               for n, (x, y, normed) in sides.items()}
        blocks.append({"projections": proj, "sublayers": sub,
                       "block_gain rms(out)/rms(in)": summary_stats(rms(bt.stream_out) / rms(bt.stream_in))})
    return {"blocks": blocks, "ok": bool(ok_all), "worst_coupled_sv_over_bound": max(worst.values(), default=None)}


def dense_signal(model: nn.Module, ids: torch.Tensor, jac_tokens: int, cache: dict | None) -> dict[str, Any]:
    """The same numbers for the dense baseline, reported beside the GRT's: no structural bound to check."""
    rec = dense_record(model, ids, cache)
    m = rec["model"]
    blocks = []
    for blk, r in zip(m.blocks, rec["blocks"]):
        D = r["attn_in"].shape[-1]
        z = r["attn_in"].reshape(-1, D)
        proj = {}
        for name, lin, x in (("q", blk.attn.q_proj, z), ("k", blk.attn.k_proj, z), ("v", blk.attn.v_proj, z),
                             ("o", blk.attn.o_proj, r["values"].reshape(-1, D))):
            gain = torch.linalg.vector_norm(lin(x), dim=-1) / torch.linalg.vector_norm(x, dim=-1)
            proj[name] = {"gain": summary_stats(gain), "jacobian_sv": _span(torch.linalg.svdvals(lin.weight))}
        z2 = r["mlp_in"].reshape(-1, D)
        sel = jacobian_token_index(z2.shape[0], jac_tokens)
        svm = torch.linalg.svdvals(per_token_jacobian(blk.mlp, z2[sel]))  # of the (n, D, D) Jacobians
        gm = torch.linalg.vector_norm(blk.mlp(z2), dim=-1) / torch.linalg.vector_norm(z2, dim=-1)
        proj["mlp"] = {"gain": summary_stats(gm), "jacobian_sv": _span(svm)}
        for name, lin in (("mlp_up", blk.mlp.up), ("mlp_down", blk.mlp.down)):
            proj[name] = {"jacobian_sv": _span(torch.linalg.svdvals(lin.weight))}
        sub = {"attn": {"process_gain rms(f(N x))/rms(N x)": summary_stats(rms(r["out"]) / rms(r["attn_in"])),
                        "write_gain rms(f)/rms(x)": summary_stats(rms(r["out"]) / rms(r["stream_in"]))},
               "mlp": {"process_gain rms(f(N x))/rms(N x)": summary_stats(rms(r["mlp_out"]) / rms(r["mlp_in"])),
                       "write_gain rms(f)/rms(x)": summary_stats(rms(r["mlp_out"]) / rms(r["after_attn"]))}}
        blocks.append({"projections": proj, "sublayers": sub,
                       "block_gain rms(out)/rms(in)": summary_stats(rms(r["stream_out"]) / rms(r["stream_in"]))})
    return {"blocks": blocks, "attention_replica_max_diff": rec["replica_err"]}
