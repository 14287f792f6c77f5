"""RadialGELU on a tile, forward, drift check and backward."""

from __future__ import annotations

import math

import numpy as np

from grt_model.kernels.jit import inline_kernel, kernel
from grt_model.kernels.scalar import cdf_pdf_exact, cdf_pdf_fast32


@inline_kernel
def _radial_exact(u0, u1):
    """``(Phi(r), phi(r)/r)`` of the pair ``(u0, u1)`` in float64 (phi/r = 0 at r = 0)."""
    rr = math.sqrt(u0 * u0 + u1 * u1)
    cdf64, pdf64 = cdf_pdf_exact(rr)
    return cdf64, pdf64 / rr if rr > 0.0 else 0.0


@inline_kernel
def _radial_fast32(x0, x1):
    """:func:`_radial_exact` in float32: r and 1/r in float32 (as the eager path takes them), the polynomials in
    float64, Phi and phi rounded once."""
    r = math.sqrt(x0 * x0 + x1 * x1)
    ir = np.float32(1.0) / r if r > 0.0 else np.float32(0.0)
    cdf, pdf = cdf_pdf_fast32(r)
    return cdf, pdf * ir


@kernel
def _gelu(buf, ev, od, exact, rec):
    """RadialGELU in place on the adjacent pairs ``(ev[q], od[q]) = (2q, 2q+1)``: ``x <- Phi(r) x``; records
    ``rec[0] = Phi`` and ``rec[1] = phi(r)/r`` for the backward.  (Rows come from index arrays on purpose: rows
    affine in the loop counter make LLVM hoist its overlap check over the whole loop nest, where neighbouring
    rows do overlap, and run the scalar loop.)"""
    tt = buf.shape[1]
    for q in range(ev.shape[0]):
        i0 = ev[q]
        i1 = od[q]
        if exact:
            for t in range(tt):
                rec[0, q, t], rec[1, q, t] = _radial_exact(buf[i0, t], buf[i1, t])
        else:
            for t in range(tt):
                rec[0, q, t], rec[1, q, t] = _radial_fast32(buf[i0, t], buf[i1, t])
    _gelu_apply(buf, ev, od, rec)


@kernel
def _gelu_pdf(h, ev, od, exact, rec):
    """``rec[1] = phi(r)/r`` from the GELU input ``h``, exactly as :func:`_gelu` computes it (the backward
    recomputes it rather than keep it: half the FFN's saved memory)."""
    tt = h.shape[1]
    for q in range(ev.shape[0]):
        i0 = ev[q]
        i1 = od[q]
        if exact:
            for t in range(tt):
                rec[1, q, t] = _radial_exact(h[i0, t], h[i1, t])[1]
        else:
            for t in range(tt):
                rec[1, q, t] = _radial_fast32(h[i0, t], h[i1, t])[1]


@kernel
def _gelu_apply(buf, ev, od, rec):
    """``x <- Phi x`` in place from recorded ``Phi`` (the backward's recompute: no transcendental)."""
    tt = buf.shape[1]
    for q in range(ev.shape[0]):
        i0 = ev[q]
        i1 = od[q]
        for t in range(tt):
            cdf = rec[0, q, t]
            buf[i0, t] = cdf * buf[i0, t]
            buf[i1, t] = cdf * buf[i1, t]


@kernel
def _gelu_drift(x, h, ev, od, rec):
    """``(||x - Phi h||, ||Phi h||)``: the contract inversion's drift against the recorded GELU output."""
    err = 0.0
    mag = 0.0
    for q in range(ev.shape[0]):
        for i in (ev[q], od[q]):
            for t in range(x.shape[1]):
                ref = np.float64(rec[0, q, t]) * np.float64(h[i, t])
                d = np.float64(x[i, t]) - ref
                err += d * d
                mag += ref * ref
    return math.sqrt(err), math.sqrt(mag)


@kernel
def _gelu_bwd(g, xs, ev, od, rec, tmp):
    """``g <- Phi g + (phi/r) (g . x) x`` per pair (the Jacobian ``Phi I + phi x x^T / r`` is symmetric);
    ``tmp [tt]`` scratch (split loops: see :func:`_gelu`)."""
    tt = g.shape[1]
    for q in range(ev.shape[0]):
        i0 = ev[q]
        i1 = od[q]
        for t in range(tt):
            tmp[t] = rec[1, q, t] * (g[i0, t] * xs[i0, t] + g[i1, t] * xs[i1, t])
        for t in range(tt):
            g[i0, t] = rec[0, q, t] * g[i0, t] + tmp[t] * xs[i0, t]
        for t in range(tt):
            g[i1, t] = rec[0, q, t] * g[i1, t] + tmp[t] * xs[i1, t]
