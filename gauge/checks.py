r"""One function per gauge claim, each returning a :class:`rmsgauge.Claim` measured in this run.

Every check runs on :class:`gauge.model.GaugeSetup` (the trained QK-norm transformer and
a held-out Shakespeare batch) in one precision, ``"float64"`` or ``"float32"``.  The
measured gauge weight is :math:`W` = ``blocks[layer].attn.q_proj.weight``, shape ``(D, D)``
(``nn.Linear``: :math:`z = x W^\top`).  ``run_all`` is what ``python gauge.py`` and the
figures/report call.

Tolerances all come from :func:`rmsgauge.tolerance` (``eps(dtype)`` times the square
root of the number of accumulated terms and sequential steps, times a safety factor);
the helpers below say which sizes each one counts.

Over 500 lines on purpose, for now: the six gauge claims share one setup (the trained QK-norm model, its
tolerances and the tensor-naming helper) and run in one order; the next split is sections 5-6 (per-row scaling
and the census records) into their own module once that setup moves to a module of its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gauge.laws import (
    break_scales,
    mean_square,
    predicted_deviation,
    predicted_radial_eps,
)
from gauge.model import DTYPES, GaugeConfig, GaugeSetup, build_setup, capture_q_path, loss_of, qk_eps, scaled
from lm import rms_norm, rms_norm_jacobian
from rmsgauge import Claim, Tolerance, claim, eps_of, registered, tolerance

Progress = Callable[[str], None] | None
CHUNK_ELEMENTS = 1 << 22  # per chunk of scales c: bounds the (C, N, D) temporaries to ~32 MB in float64
QUICK_TRAIN_STEPS = 10  # run_all(quick=True): enough steps to leave the symmetric initialization

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


# --------------------------------------------------------------------------- tolerances


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


def jacobian_tolerance(dtype: str, n: int) -> Tolerance:
    """Per-row ``J z`` relative to ``||J|| ||z||``: ``n``-term products through ~3 operations."""
    return tolerance(dtype, size=n, depth=3)


# --------------------------------------------------------------------------- the query path


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
    devs = []
    for cc in cs.to(W.dtype).split(chunk):  # a few chunks of scales, each one batched matmul
        Wc = cc[:, None, None] * W  # (c, D, D)
        y = q_norm_output(x, Wc, n_heads, eps, gain)  # (c, N, H, hd)
        devs.append((y - ref).abs().flatten(1).amax(dim=1))
    return torch.cat(devs), ref


def _ulps(dev: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``|dev|`` in units of the spacing of floats at ``|ref|`` (elementwise)."""
    a = ref.abs()
    return dev.abs() / (torch.nextafter(a, torch.full_like(a, math.inf)) - a)


def _grad(loss_fn: Callable[[], torch.Tensor], params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients of ``loss_fn()`` w.r.t. ``params`` only (the model's parameters are frozen otherwise)."""
    for p in params:
        p.requires_grad_(True)
    try:
        return list(torch.autograd.grad(loss_fn(), list(params)))
    finally:
        for p in params:
            p.requires_grad_(False)


def measured_tensor(setup: GaugeSetup, dtype: str, tensor: torch.Tensor | None = None) -> dict[str, object]:
    """Which tensor a check measured, named from the model itself (the parameter that *is* ``tensor``, by default
    ``setup.weight``), so a record cannot say ``q_proj`` while measuring another tensor."""
    W = setup.weight(dtype) if tensor is None else tensor
    name = next((n for n, p in setup.model(dtype).named_parameters() if p is W), "<not a parameter of the model>")
    return {"tensor": name, "shape": list(W.shape), "n_heads": setup.config.n_heads}


# --------------------------------------------------------------------------- 1. forward invariance


@claim("gauge.forward_invariance")
def check_forward_invariance(setup: GaugeSetup, dtype: str) -> Claim:
    """Max output deviation of the QK-norm over ``c`` in ``[c_min, c_max]`` (eps = 0), and of the loss."""
    cfg, model = setup.config, setup.model(dtype)
    attn = model.blocks[cfg.layer].attn
    W = setup.weight(dtype)
    with torch.no_grad():
        cap = capture_q_path(model, cfg.layer, setup.idx, setup.targets)
        x = cap.x.flatten(0, 1)  # (N, D) tokens of the held-out batch
        cs = cfg.c_grid()
        dev, ref = scale_deviation(x, W, cfg.n_heads, 0.0, attn.q_norm.weight, cs)  # (C,), (N, H, hd)
        worst = int(dev.argmax())
        y_worst = q_norm_output(x, cs[worst].to(W.dtype) * W, cfg.n_heads, 0.0, attn.q_norm.weight)
        ulps = _ulps(y_worst - ref, ref)  # (N, H, hd)
        y2 = q_norm_output(x, 2.0 * W, cfg.n_heads, 0.0, attn.q_norm.weight)  # power of two: exact in floats
        L0 = float(cap.loss)
        loss_cs = cs[torch.linspace(0, len(cs) - 1, 7).round().long()]  # 7 scales across the range, ends included
        loss_dev = []
        for c in loss_cs.tolist():
            with scaled(W, c):
                loss_dev.append(abs(float(loss_of(model, setup.idx, setup.targets)) - L0))
    max_dev = float(dev.max())
    tol = output_tolerance(dtype, cfg, float(ref.abs().max())).bound()
    ltol = loss_tolerance(dtype, cfg, L0).bound()
    eps = eps_of(dtype)
    holds = max_dev <= tol and max(loss_dev) <= ltol
    return Claim(
        id="gauge.forward_invariance",
        statement=SOURCE["forward"],
        stated=3e-15 if dtype == "float64" else None,
        measured=max_dev,
        tolerance=tol,
        holds=holds,
        summary=f"max dev {max_dev:.2g}",
        dtype=dtype,
        exact_law="RMSNorm(cz) = RMSNorm(z) exactly for c > 0 (eps = 0); in floats only the rounding of cW and of "
        "the matmul remains, O(eps_mach sqrt(d_model)) relative.",
        source_status="exact",
        details={
            **measured_tensor(setup, dtype),
            "c_points": len(cs), "c_min": cfg.c_min, "c_max": cfg.c_max, "eps": 0.0,  # log-spaced grid
            "max_dev_ulps_of_1": max_dev / eps,  # the output's scale: RMS = gain RMS, about 1
            "worst_c": float(cs[worst]),
            "worst_c_entry_ulps": {"median": float(ulps.median()), "max": float(ulps.max())},
            "bitwise_equal_at_c_2": bool(torch.equal(y2, ref)),  # power-of-two scaling is exact in floats
            "loss": L0,
            "loss_c_points": len(loss_dev),
            "max_loss_change": max(loss_dev),
            "loss_tol": ltol,
        },
    )


# --------------------------------------------------------------------------- 2. Euler radial gradient


@claim("gauge.euler_radial_gradient")
def check_euler_radial_gradient(setup: GaugeSetup, dtype: str) -> Claim:
    r""":math:`\langle g, W\rangle`, its relative size, :math:`\lVert g\rVert`; and :math:`g(cW) = g(W)/c`."""
    cfg, model = setup.config, setup.model(dtype)
    W = setup.weight(dtype)

    def loss() -> torch.Tensor:
        return loss_of(model, setup.idx, setup.targets)

    differentiated = [W]  # the record names this tensor, read off the model: what autograd measured, not a label
    (g,) = _grad(loss, differentiated)
    radial, gn, wn = float((g * W).sum()), float(g.norm()), float(W.norm())
    rel = radial / (gn * wn)
    ratios, vec_err = {}, 0.0
    for c in (2.0, 3.0):  # 2: bit-exact scaling; 3: a scale with rounding, so the law is not a float artifact
        with scaled(W, c):
            (gc,) = _grad(loss, [W])
        ratios[c] = float(gc.norm()) / gn
        vec_err = max(vec_err, float((c * gc - g).norm()) / gn)
    tol = radial_tolerance(dtype, cfg, 1.0)
    holds = (abs(rel) <= tol.rtol and vec_err <= tol.rtol
             and all(abs(r * c - 1.0) <= tol.rtol for c, r in ratios.items()))
    return Claim(
        id="gauge.euler_radial_gradient",
        statement=SOURCE["euler"],
        stated={"||g||": 3.6, "<g,W>": 1e-15} if dtype == "float64" else None,
        measured={"<g,W>": radial, "<g,W>/(||g|| ||W||)": rel, "||g||": gn},
        tolerance=tol.rtol,
        holds=holds,
        summary=f"<g,W>/(|g||W|) {rel:.2g}",
        dtype=dtype,
        exact_law="<g,W> = d/dc L(cW)|_{c=1} = 0 exactly (Euler, degree 0). Differentiating L(cW) = L(W) gives "
        "c g(cW) = g(W): the gradient is homogeneous of degree -1, so ||g|| scales as 1/||W|| and a bare "
        "||g|| (the source's 3.6) says nothing without ||W||; ||g||*||W|| is the scale-free number.",
        source_status="exact",
        details={
            **measured_tensor(setup, dtype, differentiated[0]),
            # the loss: next-byte cross-entropy on a held-out batch after train_steps AdamW steps
            "batch_size": cfg.batch, "seq_len": cfg.block, "train_steps": cfg.train_steps,
            "||W||": wn,
            "||g|| ||W||": gn * wn,  # the scale-free number
            "||g(2W)||/||g(W)||": ratios[2.0],  # law 1/2
            "||g(3W)||/||g(W)||": ratios[3.0],  # law 1/3
            "max_c ||c g(cW) - g(W)||/||g||": vec_err,  # law 0
        },
    )


# --------------------------------------------------------------------------- 3. Jacobian null space


@claim("gauge.jacobian_null_space")
def check_jacobian_null_space(setup: GaugeSetup, dtype: str) -> Claim:
    r""":math:`J(z)z = 0` on the real QK-norm inputs (autograd forward and reverse mode, closed form), and
    :math:`J(z)z = \frac{\epsilon}{\rho^3}z` for each eps of the config."""
    cfg, model = setup.config, setup.model(dtype)
    with torch.no_grad():
        cap = capture_q_path(model, cfg.layer, setup.idx, setup.targets)
    z = cap.z.detach().reshape(-1, cfg.d_model // cfg.n_heads)  # (R, hd): every token's every head
    n = z.shape[-1]

    def norm0(t: torch.Tensor) -> torch.Tensor:
        return rms_norm(t, 0.0)

    rho = mean_square(z).sqrt()  # (R, 1)
    unit = z.norm(dim=-1, keepdim=True) / rho  # (R, 1): ||J||_2 ||z|| = ||z|| / rho
    # J z as a Jacobian-vector product by the double-backward trick (torch.func's forward mode would load
    # torch.jit-scripted decompositions, deprecated in torch 2.13)
    _, jz_fwd = torch.autograd.functional.jvp(norm0, z, z)  # (R, hd)
    J_auto = torch.func.vmap(torch.func.jacrev(norm0))(z)  # (R, hd, hd) reverse mode, per row
    J_closed = rms_norm_jacobian(z)  # (R, hd, hd)
    jz_closed = (J_closed @ z.unsqueeze(-1)).squeeze(-1)  # (R, hd)
    u = torch.randn(z.shape, dtype=z.dtype, generator=torch.Generator().manual_seed(cfg.seed))  # upstream grads
    _, vjp = torch.func.vjp(norm0, z)
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
    tol = jacobian_tolerance(dtype, n).rtol
    worst = max(rel_fwd, rel_closed, rel_auto, float(back), J_diff)
    holds = worst <= tol and all(r["max_error_vs_law"] <= tol for r in eps_rows)
    return Claim(
        id="gauge.jacobian_null_space",
        statement=SOURCE["jacobian"],
        stated=0.0,
        measured={"autograd jvp": rel_fwd, "autograd jacrev": rel_auto, "closed form": rel_closed,
                  "backward <J^T u, z>": float(back)},
        tolerance=tol,
        holds=holds,
        summary=f"|Jz| rel {max(rel_fwd, rel_auto, rel_closed):.2g}",
        dtype=dtype,
        exact_law="J(z) = (I - z z^T/(n rho^2))/rho, rho^2 = ms(z) + eps, so J(z) z = (eps/rho^3) z: exactly 0 "
        "at eps = 0; J is symmetric, so every back-propagated gradient J^T u is orthogonal to z.",
        source_status="exact",
        details={
            **measured_tensor(setup, dtype),
            "rows": z.shape[0], "row_width": n,  # QK-norm input rows (tokens x heads); each measure is the max
            # over rows of ||J z|| / (||J||_2 ||z||) = ||J z|| rho / ||z||
            "max |J_autograd - J_closed| rho": J_diff,
            "by_eps": eps_rows,
        },
    )


# --------------------------------------------------------------------------- 4. eps breaking


@claim("gauge.epsilon_breaking")
def check_epsilon_breaking(setup: GaugeSetup, dtype: str) -> Claim:
    r"""Predicted (exact and first-order) vs measured deviation with eps > 0; break scales; the eps radial law."""
    cfg, model = setup.config, setup.model(dtype)
    attn = model.blocks[cfg.layer].attn
    W = setup.weight(dtype)
    gain = attn.q_norm.weight
    cs = cfg.c_grid()
    with torch.no_grad():
        x = capture_q_path(model, cfg.layer, setup.idx, setup.targets).x.flatten(0, 1)  # (N, D)
    per_eps, dev_at_c_min, curve_ok, radial_ok = {}, {}, [], []
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
        curve_ok.append(law_err <= tol)
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
        radial_ok.append(abs(radial - pred) <= rtol)
        m_min = float(mean_square(z).min())
        key = f"{eps:.3g}"  # eps, as the name of its entry
        dev_at_c_min[key] = float(dev[0])
        per_eps[key] = {
            "dev_at_c_min": {"measured": float(dev[0]), "exact_law": float(exact[0]), "first_order": float(lead[0])},
            "dev_at_c_max": {"measured": float(dev[-1]), "exact_law": float(exact[-1]),
                             "first_order": float(lead[-1])},
            "max_c |measured - exact law|": law_err,
            "eps/(c_min^2 min_rows m)": eps / (cfg.c_min**2 * m_min),  # the expansion parameter
            # the gauge is broken (dev > tol) below c_lo and above c_hi
            "break_scales": {"c_lo": c_lo, "c_hi": c_hi, "1 - c_lo": 1.0 - c_lo, "c_hi - 1": c_hi - 1.0},
            "dev_at_c_lo/tol": at_lo,  # law: 1
            "<g,W>": {"measured": radial, "law": pred, "tol": rtol},  # law eps sum <dL/dy, y>/rho^2
        }
    holds = all(curve_ok) and all(radial_ok)
    return Claim(
        id="gauge.epsilon_breaking",
        statement=SOURCE["eps"],
        stated="exact invariance",
        measured={"c": float(cs[0]), "dev_by_eps": dev_at_c_min},
        tolerance=output_tolerance(dtype, cfg, 1.0).rtol,  # the dtype round-off bound of the eps = 0 check
        holds=holds,
        summary=f"law err {max(v['max_c |measured - exact law|'] for v in per_eps.values()):.2g}",
        dtype=dtype,
        exact_law="RMSNorm_eps(cz) = r(c) RMSNorm_eps(z), r(c) - 1 = eps (c^2 - 1)/((c^2 m + eps)(1 + r)) "
        "= (eps/2m)(1 - 1/c^2) + O(eps^2/(c^4 m^2)), m = row mean square; <g,W> = eps sum_rows <dL/dy, y>/(m + eps).",
        source_status="approximate",
        details={**measured_tensor(setup, dtype), "c_min": cfg.c_min, "c_max": cfg.c_max, "by_eps": per_eps},
    )


def deviation_curves(setup: GaugeSetup, dtype: str) -> dict[str, torch.Tensor | dict[str, torch.Tensor]]:
    """For figures: the c grid, the measured eps = 0 deviation, and per eps the measured deviation with the
    exact and first-order predictions (all ``(C,)`` float64 tensors)."""
    cfg, model = setup.config, setup.model(dtype)
    W, gain = setup.weight(dtype), model.blocks[cfg.layer].attn.q_norm.weight
    cs = cfg.c_grid()
    out: dict[str, torch.Tensor | dict[str, torch.Tensor]] = {"c": cs}
    with torch.no_grad():
        x = capture_q_path(model, cfg.layer, setup.idx, setup.targets).x.flatten(0, 1)  # (N, D)
        out["eps=0"] = scale_deviation(x, W, cfg.n_heads, 0.0, gain, cs)[0].double()
        for eps in cfg.eps_values(DTYPES[dtype]):
            dev, ref = scale_deviation(x, W, cfg.n_heads, eps, gain, cs)
            z = torch.matmul(x, W.T).unflatten(-1, (cfg.n_heads, -1)).reshape(-1, ref.shape[-1]).double()
            y = ref.reshape(z.shape).double()
            c_used = cs.to(W.dtype).double()
            out[f"eps={eps:.3g}"] = {"measured": dev.double(), "exact": predicted_deviation(c_used, z, y, eps),
                                    "first_order": predicted_deviation(c_used, z, y, eps, leading=True)}
    return out


# --------------------------------------------------------------------------- 5. per-row scaling


@dataclass
class RowRadials:
    """Per-row radial gradients of ``W`` (``D`` output neurons, ``H`` heads of ``hd`` rows)."""

    radial: torch.Tensor  # (D,) <g_j, W_j>
    nonzero: int  # rows whose <g_j, W_j> exceeds its own round-off (relative to ||g_j|| ||W_j||)
    per_head: torch.Tensor  # (H,) sum over each head's rows: Euler per head says 0
    first: torch.Tensor  # (H,) the first neuron of each head (an unselected choice)
    strongest: torch.Tensor  # (H,) the neuron of each head with the largest |<g_j, W_j>|
    scale: float  # ||g|| ||W||


def row_radials(setup: GaugeSetup, dtype: str, loss: Callable[[], torch.Tensor]) -> RowRadials:
    r"""Step 1 of :func:`check_per_row_scaling`: :math:`\langle g_j, W_j\rangle` per row, and per head."""
    cfg, W = setup.config, setup.weight(dtype)
    H, hd = cfg.n_heads, cfg.d_model // cfg.n_heads
    (g,) = _grad(loss, [W])
    radial = (g * W).sum(dim=1)  # (D,)
    row_scale = g.norm(dim=1) * W.norm(dim=1)  # (D,): each row's own ||g_j|| ||W_j||
    row_tol = radial_tolerance(dtype, cfg, 1.0).rtol
    first = torch.arange(H) * hd  # (H,)
    return RowRadials(radial=radial, nonzero=int((radial.abs() > row_tol * row_scale).sum()),
                      per_head=radial.view(H, hd).sum(dim=1), first=first,
                      strongest=radial.view(H, hd).abs().argmax(dim=1) + first, scale=float(g.norm() * W.norm()))


def row_loss_changes(setup: GaugeSetup, dtype: str, rr: RowRadials, loss: Callable[[], torch.Tensor],
                     L0: float) -> dict[str, list[float]]:
    """Step 2: ``|L(W') - L(W)|`` per scale ``c`` of the census, where ``W'`` scales one neuron (the first and the
    strongest of each head), one head's row block, or all of ``W`` (each a separate forward pass)."""
    cfg, W = setup.config, setup.weight(dtype)
    hd = cfg.d_model // cfg.n_heads
    out: dict[str, list[float]] = {"first": [], "strongest": [], "head": [], "whole": []}
    with torch.no_grad():
        for c in cfg.census_c:
            for h in range(cfg.n_heads):  # one forward pass per perturbed model: no batched form of this
                for j, key in ((int(rr.first[h]), "first"), (int(rr.strongest[h]), "strongest")):
                    with scaled(W, c, rows=slice(j, j + 1)):
                        out[key].append(abs(float(loss()) - L0))
                with scaled(W, c, rows=slice(h * hd, (h + 1) * hd)):
                    out["head"].append(abs(float(loss()) - L0))
            with scaled(W, c):
                out["whole"].append(abs(float(loss()) - L0))
    return out


def central_difference_excess(setup: GaugeSetup, dtype: str, rr: RowRadials, loss: Callable[[], torch.Tensor],
                              L0: float) -> float | None:
    r"""Step 3 (float64 only): the central difference :math:`dL/dc` of each strongest neuron against
    :math:`\langle g_j, W_j\rangle`, step :math:`\delta = \epsilon^{1/3}` (truncation :math:`O(\delta^2)` and
    round-off :math:`O(\epsilon/\delta)` balance); the worst excess over its tolerance (``<= 0`` passes)."""
    if dtype != "float64":
        return None
    W = setup.weight(dtype)
    delta = eps_of(dtype) ** (1.0 / 3.0)
    with torch.no_grad():
        fd = [(float(_scaled_loss(W, 1.0 + delta, j, loss)) - float(_scaled_loss(W, 1.0 - delta, j, loss)))
              / (2.0 * delta) for j in rr.strongest.tolist()]
    ref = rr.radial[rr.strongest].double()
    fd_tol = tolerance(dtype, rtol=delta, atol=loss_tolerance(dtype, setup.config, L0).bound() / delta)
    return float(((torch.tensor(fd, dtype=torch.float64) - ref).abs() - (fd_tol.atol + fd_tol.rtol * ref.abs())).max())


@claim("gauge.per_row_scaling")
def check_per_row_scaling(setup: GaugeSetup, dtype: str) -> Claim:
    r"""One output neuron (a row of ``nn.Linear.weight``) is not a gauge; one head's row block is.

    First order, scaling row :math:`j` by :math:`c` changes the loss by :math:`(c-1)\,\langle g_j, W_j\rangle`:
    every per-row radial gradient that is nonzero (beyond its own round-off, relative to
    :math:`\lVert g_j\rVert\lVert W_j\rVert`) proves that row is not a gauge; only their sum over each head
    vanishes (Euler per head).  The loss change is then measured directly for two neurons per head: the
    first row of the head (an unselected choice) and the row with the largest :math:`|\langle g_j, W_j\rangle|`
    (the first-order prediction of the most visible neuron; the verdict uses this one).  In float64 the
    per-row radial gradient is confirmed by a central difference (:func:`central_difference_excess`).
    """
    cfg, model = setup.config, setup.model(dtype)

    def loss() -> torch.Tensor:
        return loss_of(model, setup.idx, setup.targets)

    rr = row_radials(setup, dtype, loss)
    with torch.no_grad():
        L0 = float(loss())
    d = row_loss_changes(setup, dtype, rr, loss, L0)
    fd_excess = central_difference_excess(setup, dtype, rr, loss, L0)
    ltol = loss_tolerance(dtype, cfg, L0).bound()
    rtol = radial_tolerance(dtype, cfg, rr.scale).bound()
    # float64 (the verification precision) must also resolve the neuron's loss change directly; in float32 a
    # weakly used layer's neuron can move L by less than the loss round-off bound, and the scale-free per-row
    # radial test carries the verdict
    visible = min(d["strongest"]) > ltol or dtype != "float64"
    holds = (visible and max(d["head"]) <= ltol and max(d["whole"]) <= ltol
             and rr.nonzero == cfg.d_model and float(rr.per_head.abs().max()) <= rtol
             and (fd_excess is None or fd_excess <= 0.0))
    return Claim(
        id="gauge.per_row_scaling",
        statement=SOURCE["per_row"],
        stated=None,
        measured={"min |dL| one neuron": min(d["strongest"]), "max |dL| one head block": max(d["head"]),
                  "max |dL| whole W": max(d["whole"])},
        tolerance=ltol,
        holds=holds,
        summary=f"neuron {min(d['strongest']):.2g} head {max(d['head']):.2g}",
        dtype=dtype,
        exact_law="With per-head QK-norm the gauge group is (R_{>0})^H: each head's row block of W_q scales freely "
        "(Euler per head: sum_{j in head} <g_j, W_j> = 0), but one neuron (row) is not a gauge: dL = (c-1)<g_j,W_j> "
        "+ O((c-1)^2) with <g_j, W_j> != 0.",
        source_status="unstated",
        details={
            **measured_tensor(setup, dtype),
            "scales_c": list(cfg.census_c),
            "loss": L0,
            "rows": cfg.d_model,
            "rows_with_nonzero_radial": rr.nonzero,  # <g_j, W_j> != 0 beyond the row's own round-off
            "|<g_j,W_j>|/(||g|| ||W||)": {"median": float(rr.radial.abs().median()) / rr.scale,
                                          "max": float(rr.radial.abs().max()) / rr.scale},
            "max_h |sum_(j in head h) <g_j,W_j>|/(||g|| ||W||)": float(rr.per_head.abs().max()) / rr.scale,
            "|dL| most visible neuron per head, per c": d["strongest"],
            "|dL| first neuron per head, per c": d["first"],
            "central difference excess over tol": fd_excess,  # dL/dc vs <g_j, W_j>; <= 0 passes
        },
    )


def _scaled_loss(W: nn.Parameter, c: float, row: int, loss: Callable[[], torch.Tensor]) -> torch.Tensor:
    with scaled(W, c, rows=slice(row, row + 1)):
        return loss()


# --------------------------------------------------------------------------- 6. census


def predicted_gauges(setup: GaugeSetup) -> list[str]:
    """The theory's list: exactly the weights whose output feeds an RMSNorm with nothing in between."""
    if not setup.qk_norm:
        return []
    n = setup.config.n_layers
    return [f"blocks.{i}.attn.{p}_proj.weight" for i in range(n) for p in ("q", "k")]


def census_table(setup: GaugeSetup, dtype: str) -> list[dict]:
    r"""Scale each parameter tensor alone by each ``c`` in ``census_c``; one row per tensor.

    A tensor is classified a gauge when both tests pass: every ``|L(c p) - L(p)|`` stays within the loss
    round-off (:func:`loss_tolerance`; finite scales), and the radial cosine
    :math:`\langle\nabla_p L, p\rangle/(\lVert\nabla_p L\rVert\,\lVert p\rVert)` is zero within
    :func:`radial_tolerance` (Euler; scale-free, so it also resolves tensors that barely move the loss).
    """
    cfg, model = setup.config, setup.model(dtype)
    params = dict(model.named_parameters())
    grads = dict(zip(params, _grad(lambda: loss_of(model, setup.idx, setup.targets), list(params.values()))))
    with torch.no_grad():
        L0 = float(loss_of(model, setup.idx, setup.targets))
        tol = loss_tolerance(dtype, cfg, L0).bound()
        rtol = radial_tolerance(dtype, cfg, 1.0).rtol
        rows = []
        for name, p in params.items():
            d = []
            for c in cfg.census_c:
                with scaled(p, c):
                    d.append(abs(float(loss_of(model, setup.idx, setup.targets)) - L0))
            g = grads[name]
            cos = float((g * p).sum() / (g.norm() * p.norm()))  # <grad_p L, p>/(||grad|| ||p||): Euler says 0
            rows.append({"name": name, "shape": tuple(p.shape), "max |dL|": max(d), "tol": tol,
                         "radial cos": cos, "radial tol": rtol,
                         "gauge": max(d) <= tol and abs(cos) <= rtol, "loss": L0})
    return rows


def pair_symmetries(setup: GaugeSetup, dtype: str) -> dict[str, float]:
    """Two-tensor rescalings (c, 1/c) that leave the loss unchanged: symmetries, but not single-tensor gauges.

    Keys name the pair as ``<first>*c,<second>/c`` within ``blocks[layer].attn``; values are max |dL| over c."""
    cfg, model = setup.config, setup.model(dtype)
    attn = model.blocks[cfg.layer].attn
    pairs = {"v_proj*c,o_proj/c": (attn.v_proj.weight, attn.o_proj.weight)}
    if attn.q_norm is not None:
        pairs["q_norm*c,k_norm/c"] = (attn.q_norm.weight, attn.k_norm.weight)
    out = {}
    with torch.no_grad():
        L0 = float(loss_of(model, setup.idx, setup.targets))
        for label, (a, b) in pairs.items():
            worst = 0.0
            for c in cfg.census_c:
                with scaled(a, c), scaled(b, 1.0 / c):
                    worst = max(worst, abs(float(loss_of(model, setup.idx, setup.targets)) - L0))
            out[label] = worst
    return out


def is_power_of_two(c: float) -> bool:
    """``c = 2^k``: scaling by it is exact in binary floats, so a census at such scales cannot tell a gauge from
    a tensor that merely rescales exactly (every |dL| would be measured at zero round-off)."""
    return c > 0 and math.frexp(c)[0] == 0.5


def census_summary(setup: GaugeSetup, dtype: str) -> tuple[list[str], dict[str, object]]:
    """One model's census: the tensors found to be gauges, and the structured summary of the evidence."""
    rows = census_table(setup, dtype)
    gauges = [r["name"] for r in rows if r["gauge"]]
    non = [r for r in rows if not r["gauge"]]
    weakest = min(non, key=lambda r: r["max |dL|"]) if non else None
    summary: dict[str, object] = {
        "tensors_tested": len(rows),
        "largest |dL| among gauges": max((r["max |dL|"] for r in rows if r["gauge"]), default=None),
        "largest |radial cos| among gauges": max((abs(r["radial cos"]) for r in rows if r["gauge"]), default=None),
    }
    if weakest is not None:  # the non-gauge closest to passing, and how far it is from each tolerance
        summary["weakest non-gauge"] = {"tensor": weakest["name"], "|dL|": weakest["max |dL|"],
                                        "|dL|/tol": weakest["max |dL|"] / weakest["tol"],
                                        "|radial cos|/tol": abs(weakest["radial cos"]) / weakest["radial tol"]}
    summary["two-tensor symmetries |dL|"] = {"layer": setup.config.layer, **pair_symmetries(setup, dtype)}
    summary["loss_tol"] = rows[0]["tol"]
    summary["radial_cos_tol"] = rows[0]["radial tol"]
    summary["per_tensor"] = {r["name"]: {"max |dL|": r["max |dL|"], "radial cos": r["radial cos"],
                                         "gauge": r["gauge"]} for r in rows}
    return gauges, summary


@claim("gauge.census")
def check_census(setup: GaugeSetup, dtype: str) -> Claim:
    """Which tensors are exact scale gauges, with QK-norm (``setup``) and without (``setup.plain`` when it is
    set); compared with :func:`predicted_gauges`.  Scales that are powers of two make the census void."""
    found, details, ok = {}, {}, True
    for label, st in (("QK-norm", setup), ("no QK-norm", setup.plain)):
        if st is None:
            continue
        gauges, summary = census_summary(st, dtype)
        found[f"{label} gauges"] = gauges
        details[label] = summary
        ok &= sorted(gauges) == sorted(predicted_gauges(st))
    cfg = setup.config
    exact_scales = [c for c in cfg.census_c if is_power_of_two(c)]
    return Claim(
        id="gauge.census",
        statement=SOURCE["census"],
        stated="the weight producing z = xW in a pre-norm block",
        measured=found,
        tolerance=max(d["loss_tol"] for d in details.values()),  # loss round-off; the radial bound is in details
        holds=ok and not exact_scales,
        summary=(f"{len(found.get('QK-norm gauges', []))} gauges with QK-norm, "
                 f"{len(found.get('no QK-norm gauges', []))} without"),
        dtype=dtype,
        exact_law="A tensor is a scale gauge iff its output reaches the loss only through an RMSNorm with nothing "
        "added in between: with QK-norm that is W_q and W_k of every block (each per head); in a plain pre-norm "
        "block the norm comes BEFORE the weights and every weight writes into the residual stream, so no tensor "
        "is a gauge. Norm gains (q_norm/k_norm/pre-norm) and the tied embedding are not gauges (under QK-norm, "
        "scaling a block's pre-norm gain acts exactly like scaling its W_v: the q/k part of it is gauged).",
        source_status="approximate",
        details={"scales_c": list(cfg.census_c), "scales_exact_in_floats": exact_scales, **details},
    )


# --------------------------------------------------------------------------- all of it

CLAIM_IDS = tuple(spec.id for spec in registered("gauge"))  # read from the registry, in source order


def run_all(cfg: GaugeConfig | None = None, dtypes: Sequence[str] = ("float64", "float32"),
            progress: Progress = None, *, seed: int | None = None, quick: bool = False) -> list[Claim]:
    """Build the models (QK-norm and plain), then every registered gauge claim in each dtype, in source order.

    ``seed`` overrides ``cfg.seed``; ``quick`` trains ``QUICK_TRAIN_STEPS`` steps instead of ``cfg.train_steps``
    (the c grid keeps its >= 100 points: that is part of the claim).  Both exist for the figures/report runner.
    """
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
    claims: list[Claim] = []
    for spec in registered("gauge"):  # each claim in every dtype, side by side
        for dt in dtypes:
            say(f"{spec.id} ({dt})")
            claims.append(spec.fn(qk, dt))
    return claims
