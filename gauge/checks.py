r"""Claims 1-4 of the gauge (forward invariance, Euler, Jacobian null space, eps breaking), one function each,
measured in one precision on :class:`gauge.model.GaugeSetup`; claims 5-6 are :mod:`gauge.scope`.  :data:`CLAIMS`
runs all six, in order, in each precision.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import torch

from gauge.laws import break_scales, mean_square, predicted_deviation, predicted_radial_eps
from gauge.measure import (
    SOURCE,
    grad_of,
    loss_change,
    loss_tolerance,
    measured_tensor,
    output_tolerance,
    q_norm_output,
    radial_tolerance,
    scale_deviation,
)
from gauge.model import DTYPES, GaugeConfig, GaugeSetup, build_setup, capture_q_path, loss_of, qk_eps, scaled
from gauge.scope import check_census, check_per_row_scaling
from lm import rms_norm, rms_norm_jacobian
from rmsgauge import Claim, ClaimGroup, eps_of, tolerance

QUICK_TRAIN_STEPS = 10  # quick runs: enough steps to leave the symmetric initialization


def check_forward_invariance(setup: GaugeSetup, dtype: str) -> Claim:
    """Max output deviation of the QK-norm over ``c`` in ``[c_min, c_max]`` (eps = 0), and of the loss."""
    cfg, model = setup.config, setup.model(dtype)
    W, gain = setup.weight(dtype), model.blocks[cfg.layer].attn.q_norm.weight
    with torch.no_grad():
        cap = capture_q_path(model, cfg.layer, setup.idx, setup.targets)
        x = cap.x.flatten(0, 1)  # (N, D) tokens of the held-out batch
        cs = cfg.c_grid()
        dev, ref = scale_deviation(x, W, cfg.n_heads, 0.0, gain, cs)  # (C,), (N, H, hd)
        worst = int(dev.argmax())
        y_worst = q_norm_output(x, cs[worst].to(W.dtype) * W, cfg.n_heads, 0.0, gain)
        a = ref.abs()  # (N, H, hd): the deviation in units of the spacing of floats at |ref|
        ulps = (y_worst - ref).abs() / (torch.nextafter(a, torch.full_like(a, math.inf)) - a)
        y2 = q_norm_output(x, 2.0 * W, cfg.n_heads, 0.0, gain)  # power of two: exact in floats
        L0 = float(cap.loss)
        loss_cs = cs[torch.linspace(0, len(cs) - 1, 7).round().long()]  # 7 scales across the range, ends included
        loss = partial(loss_of, model, setup.idx, setup.targets)
        loss_dev = [loss_change(loss, L0, (W, c)) for c in loss_cs.tolist()]
    max_dev = float(dev.max())
    tol = output_tolerance(dtype, cfg, float(ref.abs().max())).bound()
    ltol = loss_tolerance(dtype, cfg, L0).bound()
    eps = eps_of(dtype)
    holds = max_dev <= tol and max(loss_dev) <= ltol
    return Claim(
        id="gauge.forward_invariance", statement=SOURCE["forward"], stated=3e-15 if dtype == "float64" else None,
        measured=max_dev, tolerance=tol, holds=holds, summary=f"max dev {max_dev:.2g}", dtype=dtype,
        exact_law="RMSNorm(cz) = RMSNorm(z) exactly for c > 0 (eps = 0); in floats only the rounding of cW and of "
        "the matmul remains, O(eps_mach sqrt(d_model)) relative.",
        source_status="exact", details={
            **measured_tensor(setup, dtype),
            "c_points": len(cs), "c_min": cfg.c_min, "c_max": cfg.c_max, "eps": 0.0,  # log-spaced grid
            "max_dev_ulps_of_1": max_dev / eps,  # the output's scale: RMS = gain RMS, about 1
            "worst_c": float(cs[worst]),
            "worst_c_entry_ulps": {"median": float(ulps.median()), "max": float(ulps.max())},
            "bitwise_equal_at_c_2": bool(torch.equal(y2, ref)),  # power-of-two scaling is exact in floats
            "loss": L0, "loss_c_points": len(loss_dev), "max_loss_change": max(loss_dev), "loss_tol": ltol,
        },
    )


def check_euler_radial_gradient(setup: GaugeSetup, dtype: str) -> Claim:
    r""":math:`\langle g, W\rangle`, its relative size, :math:`\lVert g\rVert`; and :math:`g(cW) = g(W)/c`."""
    cfg, model = setup.config, setup.model(dtype)
    W = setup.weight(dtype)
    loss = partial(loss_of, model, setup.idx, setup.targets)
    differentiated = [W]  # the record names this tensor, read off the model: what autograd measured, not a label
    (g,) = grad_of(loss, differentiated)
    radial, gn, wn = float((g * W).sum()), float(g.norm()), float(W.norm())
    rel = radial / (gn * wn)
    ratios, vec_err = {}, 0.0
    for c in (2.0, 3.0):  # 2: bit-exact scaling; 3: a scale with rounding, so the law is not a float artifact
        with scaled(W, c):
            (gc,) = grad_of(loss, [W])
        ratios[c] = float(gc.norm()) / gn
        vec_err = max(vec_err, float((c * gc - g).norm()) / gn)
    tol = radial_tolerance(dtype, cfg, 1.0)
    holds = (abs(rel) <= tol.rtol and vec_err <= tol.rtol
             and all(abs(r * c - 1.0) <= tol.rtol for c, r in ratios.items()))
    return Claim(
        id="gauge.euler_radial_gradient", statement=SOURCE["euler"],
        stated={"||g||": 3.6, "<g,W>": 1e-15} if dtype == "float64" else None,
        measured={"<g,W>": radial, "<g,W>/(||g|| ||W||)": rel, "||g||": gn}, tolerance=tol.rtol, holds=holds,
        summary=f"<g,W>/(|g||W|) {rel:.2g}", dtype=dtype,
        exact_law="<g,W> = d/dc L(cW)|_{c=1} = 0 exactly (Euler, degree 0). Differentiating L(cW) = L(W) gives "
        "c g(cW) = g(W): the gradient is homogeneous of degree -1, so ||g|| scales as 1/||W|| and a bare "
        "||g|| (the source's 3.6) says nothing without ||W||; ||g||*||W|| is the scale-free number.",
        source_status="exact", details={
            **measured_tensor(setup, dtype, differentiated[0]),
            # the loss: next-byte cross-entropy on a held-out batch after train_steps AdamW steps
            "batch_size": cfg.batch_size, "seq_len": cfg.block_size, "train_steps": cfg.train_steps, "||W||": wn,
            "||g|| ||W||": gn * wn,  # the scale-free number
            "||g(2W)||/||g(W)||": ratios[2.0],  # law 1/2
            "||g(3W)||/||g(W)||": ratios[3.0],  # law 1/3
            "max_c ||c g(cW) - g(W)||/||g||": vec_err,  # law 0
        },
    )


def check_jacobian_null_space(setup: GaugeSetup, dtype: str) -> Claim:
    r""":math:`J(z)z = 0` on the real QK-norm inputs (autograd forward and reverse mode, closed form), and
    :math:`J(z)z = \frac{\epsilon}{\rho^3}z` for each eps of the config."""
    cfg, model = setup.config, setup.model(dtype)
    with torch.no_grad():
        cap = capture_q_path(model, cfg.layer, setup.idx, setup.targets)
    z = cap.z.detach().reshape(-1, cfg.d_model // cfg.n_heads)  # (R, hd): every token's every head
    n = z.shape[-1]
    rho = mean_square(z).sqrt()  # (R, 1)
    unit = z.norm(dim=-1, keepdim=True) / rho  # (R, 1): ||J||_2 ||z|| = ||z|| / rho
    # J z as a Jacobian-vector product by the double-backward trick (torch.func's forward mode would load
    # torch.jit-scripted decompositions, deprecated in torch 2.13); rms_norm's eps defaults to 0
    _, jz_fwd = torch.autograd.functional.jvp(rms_norm, z, z)  # (R, hd)
    J_auto = torch.func.vmap(torch.func.jacrev(rms_norm))(z)  # (R, hd, hd) reverse mode, per row
    J_closed = rms_norm_jacobian(z)  # (R, hd, hd)
    jz_closed = (J_closed @ z.unsqueeze(-1)).squeeze(-1)  # (R, hd)
    u = torch.randn(z.shape, dtype=z.dtype, generator=torch.Generator().manual_seed(cfg.seed))  # upstream grads
    _, vjp = torch.func.vjp(rms_norm, z)
    (gz,) = vjp(u)  # (R, hd): the backward pass, J^T u
    back = ((gz * z).sum(-1, keepdim=True).abs() / (u.norm(dim=-1, keepdim=True) * unit)).max()
    rel_fwd = float((jz_fwd.norm(dim=-1, keepdim=True) / unit).max())
    rel_closed = float((jz_closed.norm(dim=-1, keepdim=True) / unit).max())
    rel_auto = float(((J_auto @ z.unsqueeze(-1)).squeeze(-1).norm(dim=-1, keepdim=True) / unit).max())
    J_diff = float(((J_auto - J_closed).abs().amax(dim=(-1, -2)) * rho.squeeze(-1)).max())
    eps_rows = []
    for eps in cfg.eps_values(DTYPES[dtype]):
        rho_e = (mean_square(z) + eps).sqrt()  # (R, 1)
        law = eps / rho_e**3 * z  # (R, hd)
        _, jz_e = torch.autograd.functional.jvp(lambda t, e=eps: rms_norm(t, e), z, z)
        jz_ec = (rms_norm_jacobian(z, eps) @ z.unsqueeze(-1)).squeeze(-1)
        scale_e = z.norm(dim=-1, keepdim=True) / rho_e
        err = max(float(((jz_e - law).norm(dim=-1, keepdim=True) / scale_e).max()),
                  float(((jz_ec - law).norm(dim=-1, keepdim=True) / scale_e).max()))
        eps_rows.append({"eps": eps,  # the law: J z = (eps/rho^3) z
                         "max ||Jz||/(||J|| ||z||)": float((law.norm(dim=-1, keepdim=True) / scale_e).max()),
                         "max_error_vs_law": err})
    tol = tolerance(dtype, size=n, depth=3).rtol  # per-row J z against ||J|| ||z||: n-term products, ~3 operations
    worst = max(rel_fwd, rel_closed, rel_auto, float(back), J_diff)
    holds = worst <= tol and all(r["max_error_vs_law"] <= tol for r in eps_rows)
    return Claim(
        id="gauge.jacobian_null_space", statement=SOURCE["jacobian"], stated=0.0,
        measured={"autograd jvp": rel_fwd, "autograd jacrev": rel_auto, "closed form": rel_closed,
                  "backward <J^T u, z>": float(back)},
        tolerance=tol, holds=holds, summary=f"|Jz| rel {max(rel_fwd, rel_auto, rel_closed):.2g}", dtype=dtype,
        exact_law="J(z) = (I - z z^T/(n rho^2))/rho, rho^2 = ms(z) + eps, so J(z) z = (eps/rho^3) z: exactly 0 "
        "at eps = 0; J is symmetric, so every back-propagated gradient J^T u is orthogonal to z.",
        source_status="exact", details={
            **measured_tensor(setup, dtype),
            "rows": z.shape[0], "row_width": n,  # QK-norm input rows (tokens x heads); each measure is the max
            # over rows of ||J z|| / (||J||_2 ||z||) = ||J z|| rho / ||z||
            "max |J_autograd - J_closed| rho": J_diff, "by_eps": eps_rows,
        },
    )


def check_epsilon_breaking(setup: GaugeSetup, dtype: str) -> Claim:
    r"""Predicted (exact and first-order) vs measured deviation with eps > 0; break scales; the eps radial law."""
    cfg, model = setup.config, setup.model(dtype)
    W, gain = setup.weight(dtype), model.blocks[cfg.layer].attn.q_norm.weight
    cs = cfg.c_grid()
    with torch.no_grad():
        x = capture_q_path(model, cfg.layer, setup.idx, setup.targets).x.flatten(0, 1)  # (N, D)
    per_eps, dev_at_c_min, ok = {}, {}, []  # ok: the measured curve and the radial gradient each on its law
    for eps in cfg.eps_values(DTYPES[dtype]):
        with torch.no_grad():
            dev, ref = scale_deviation(x, W, cfg.n_heads, eps, gain, cs)  # (C,), (N, H, hd)
            z = torch.matmul(x, W.T).unflatten(-1, (cfg.n_heads, -1)).reshape(-1, ref.shape[-1]).double()  # (R, hd)
            y = ref.reshape(z.shape).double()
            c_used = cs.to(W.dtype).double()
            exact = predicted_deviation(c_used, z, y, eps)  # (C,)
            lead = predicted_deviation(c_used, z, y, eps, leading=True)
        tol = output_tolerance(dtype, cfg, float(ref.abs().max())).bound()
        law_err = float((dev.double() - exact).abs().max())
        ok.append(law_err <= tol)
        c_lo, c_hi = break_scales(z, y, eps, tol)
        at_lo = None
        if cfg.c_min <= c_lo < 1.0:  # confirm the predicted break scale by measuring there
            with torch.no_grad():
                d_lo, _ = scale_deviation(x, W, cfg.n_heads, eps, gain, torch.tensor([c_lo], dtype=torch.float64))
            at_lo = float(d_lo[0]) / tol
        # the radial gradient with eps in every QK-norm of the model
        with qk_eps(model, eps):
            W.requires_grad_(True)
            try:
                cap = capture_q_path(model, cfg.layer, setup.idx, setup.targets)
                g, u = torch.autograd.grad(cap.loss, [W, cap.y])
            finally:
                W.requires_grad_(False)
        radial = float((g * W).sum())
        pred = float(predicted_radial_eps(u.double(), cap.y.detach().double(), cap.z.double(), eps))
        rtol = radial_tolerance(dtype, cfg, float(g.norm() * W.norm())).bound()
        ok.append(abs(radial - pred) <= rtol)
        key = f"{eps:.3g}"  # eps, as the name of its entry
        dev_at_c_min[key] = float(dev[0])
        per_eps[key] = {
            **{f"dev_at_c_{e}": {"measured": float(dev[i]), "exact_law": float(exact[i]), "first_order": float(lead[i])}
               for e, i in (("min", 0), ("max", -1))},
            "max_c |measured - exact law|": law_err,
            "eps/(c_min^2 min_rows m)": eps / (cfg.c_min**2 * float(mean_square(z).min())),  # the expansion parameter
            # the gauge is broken (dev > tol) below c_lo and above c_hi
            "break_scales": {"c_lo": c_lo, "c_hi": c_hi, "1 - c_lo": 1.0 - c_lo, "c_hi - 1": c_hi - 1.0},
            "dev_at_c_lo/tol": at_lo,  # law: 1
            "<g,W>": {"measured": radial, "law": pred, "tol": rtol},  # law eps sum <dL/dy, y>/rho^2
        }
    return Claim(
        id="gauge.epsilon_breaking", statement=SOURCE["eps"], stated="exact invariance",
        measured={"c": float(cs[0]), "dev_by_eps": dev_at_c_min},
        tolerance=output_tolerance(dtype, cfg, 1.0).rtol,  # the dtype round-off bound of the eps = 0 check
        holds=all(ok), summary=f"law err {max(v['max_c |measured - exact law|'] for v in per_eps.values()):.2g}",
        dtype=dtype,
        exact_law="RMSNorm_eps(cz) = r(c) RMSNorm_eps(z), r(c) - 1 = eps (c^2 - 1)/((c^2 m + eps)(1 + r)) "
        "= (eps/2m)(1 - 1/c^2) + O(eps^2/(c^4 m^2)), m = row mean square; <g,W> = eps sum_rows <dL/dy, y>/(m + eps).",
        source_status="approximate",
        details={**measured_tensor(setup, dtype), "c_min": cfg.c_min, "c_max": cfg.c_max, "by_eps": per_eps},
    )


@contextmanager
def gauge_context(cfg: GaugeConfig | None = None, dtypes: Sequence[str] = ("float64", "float32"), *,
                  seed: int | None = None, quick: bool = False, progress: Callable[[str], None] | None = None
                  ) -> Iterator[list[dict[str, object]]]:
    """The QK-norm model (its plain twin beside it, for the census) that every claim is measured on, once per
    precision in ``dtypes``, side by side.  ``seed`` overrides ``cfg.seed``; ``quick`` trains
    ``QUICK_TRAIN_STEPS`` steps instead of ``cfg.train_steps`` (the c grid keeps its >= 100 points: that is part
    of the claim)."""
    cfg = cfg or GaugeConfig()
    if seed is not None:
        cfg = dataclasses.replace(cfg, seed=seed)
    if quick:
        cfg = dataclasses.replace(cfg, train_steps=min(cfg.train_steps, QUICK_TRAIN_STEPS))
    for dt in dtypes:
        if dt not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dt!r}")
    say = progress or (lambda _msg: None)
    say("building the QK-norm model")
    qk = build_setup(cfg, qk_norm=True, progress=progress)
    say("building the same model without QK-norm (census)")
    qk.plain = build_setup(cfg, qk_norm=False, progress=progress)
    yield [{"setup": qk, "dtype": dt} for dt in dtypes]


CLAIMS = ClaimGroup(context=gauge_context, checks={
    "gauge.forward_invariance": check_forward_invariance,
    "gauge.euler_radial_gradient": check_euler_radial_gradient,
    "gauge.jacobian_null_space": check_jacobian_null_space,
    "gauge.epsilon_breaking": check_epsilon_breaking,
    "gauge.per_row_scaling": check_per_row_scaling,
    "gauge.census": check_census,
})
