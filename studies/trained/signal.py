r"""The measurements behind ``grt.signal_propagation`` for the GRT and the dense baseline (the laws:
:func:`studies.trained.claims.claim_signal_propagation`).  Shapes: ``N`` held-out tokens, ``n`` Jacobian tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from grt_model.model import GATE_NAMES, GRT
from rmsgauge import tolerance
from studies.trained.measure import (
    cascade_bounds,
    cascade_gain,
    dense_record,
    ffn_composed,
    grt_jacobians,
    grt_record,
    jacobian_token_index,
    per_token_jacobian,
    projection_inputs,
    radial_gelu_jacobian_max,
    rms,
    split_qkv,
    summary_stats,
)


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
        bnd: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, (c, x) in inp.items():
            lo, hi = cascade_bounds(c)  # (Hc,) each
            gain, lo, hi = cascade_gain(c, x), lo.unsqueeze(0), hi.unsqueeze(0)  # (N, Hc), (1, Hc), (1, Hc)
            parts = ({k: (gain_k, split_qkv(lo, H)[k], split_qkv(hi, H)[k]) for k, gain_k in split_qkv(gain, H).items()}
                     if name == "qkv" else {name: (gain, lo, hi)})
            tol = tolerance(torch.float64, size=c.width, depth=c.n_stages)
            for k, (gk, lo_k, hi_k) in parts.items():  # (N, heads), (1, heads), (1, heads)
                bnd[k] = (lo_k[0], hi_k[0])
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
        hi_val = float(bnd["ffn_expand"][1].max() * bnd["ffn_contract"][1].max())
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
