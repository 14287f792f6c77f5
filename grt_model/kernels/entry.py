r"""Numba kernels of the fused rotation cascade (loaded by :class:`grt_model.kernels.runtime.KernelRuntime`).

Why a kernel and not more PyTorch ops: a stage is ~8 flops per pair per token, so an eager stage is
bound by its trip to memory (read the activation, write it back, plus autograd's saved copies).  These
kernels keep a tile of ``tt`` tokens in cache while *all* stages run over it, and save nothing for the
backward but the cascade's input (and, for the FFN, the GELU's two records per pair).

Backward.  Coupling-off stages are invertible 2x2 maps, so the backward re-runs the forward over the tile
and walks back *inverting* each stage (:math:`M^{-1} = R^\top D^{-1}`) to recover its input -- no stage
input is stored.  Rounding makes the recovered input drift from the true one; the kernel measures the
drift at the end of the walk (recovered cascade input vs. the real one, relative Frobenius norm) and, past
``drift_tol`` (the suite's tolerance for the depth, :func:`rmsgauge.tolerance`), redoes the tile by
*storing*: stage inputs kept per segment of ``seg`` stages, with checkpoints at the segment starts (and
keeps storing for the rest of the call).  Coupled stages are not invertible without their angle, which
depends on the input: their backward rebuilds the stage inputs forward from the cascade's input (segments as
above, keeping each stage's pairs and cos, sin, 1 - tanh^2), then walks back recomputing the features from
the pairs.  The forward may keep the angle nudges ``tanh(F W)`` of the last ``keep`` stages (``rec``); the
rebuild of a kept stage then skips its features and its coupling GEMM, which makes a training step 3
coupling GEMMs per stage instead of 4.  Kept or rebuilt, a stage's angle comes out of the same function
(:func:`_trig`) from the same nudge, so the backward sees bit-for-bit the forward's values.
Parameter gradients are summed per call (one call per thread, :mod:`grt_model.kernels.fused` adds them up).

Layout and loops.  A tile is coordinate-major, ``buf[i, t]`` (``[width, tt]``): every inner loop runs
over the tile's tokens with unit stride whatever the butterfly stride is.  What LLVM vectorizes, learnt
the hard way and kept as rules here (numba arrays may alias, so LLVM guards a vector loop with run-time
overlap checks and runs the scalar loop when one fails): (1) a stage never reads one array while writing
another view of the same memory (in place on one array, or between distinct arrays); (2) a loop writes at
most two rows: more needs more than the eight checks LLVM allows; (3) rows whose index is an affine
function of the outer loop counter (``2q``, ``2q+1``) get their check hoisted over the whole loop nest,
where neighbouring rows overlap, so such rows come from index arrays -- or, for the coupled stage, the
pairs are gathered into contiguous pair-major arrays first.  Each (pair, loop) still pays a fixed set-up,
which long tiles amortize.  The coupling product :math:`z = W^\top F` of a tile is one BLAS call into a
preallocated output (scipy's OpenBLAS, limited to one thread per kernel thread by
:class:`grt_model.kernels.runtime.KernelRuntime`: a BLAS call that fans out over cores busy with other tiles was
10x slower at 128-token tiles).

Transcendentals.  ``exact=True`` (the float64 kernels, used for verification) calls
``math.tanh/cos/sin/erf/exp`` per element, the functions the eager path uses.  The float32 kernels use
straight-line polynomials so the loops vectorize (LLVM has no vector ``tanh``/``erf`` without SVML);
each is below float32 round-off (tested against ``math`` in ``tests/test_fast_cascade.py``):

* :math:`\tanh z \approx z\,A(z^2)/B(z^2)` on :math:`[0, 9]` (degrees 4/5) and
  :math:`\operatorname{erf} x \approx x\,A(x^2)/B(x^2)` on :math:`[0, 4]` (degrees 6/5): rationals fitted by
  us (weighted least squares with Lawson reweighting toward the minimax error; maximum errors
  :math:`1.6\cdot10^{-9}` and :math:`1.6\cdot10^{-9}`), evaluated in float64 with one float32 division; 1
  beyond the interval (:math:`1-\tanh 9 = 3\cdot10^{-8}`, :math:`1-\operatorname{erf}4 = 1.5\cdot10^{-8}`:
  below float32's half-ulp at 1);
* :math:`e^{-u}`, :math:`u\in[0, 40]`: Taylor of degree 14 at :math:`u/64`, squared six times (float64,
  relative error below :math:`10^{-13}`);
* :math:`\cos(\theta+\delta), \sin(\theta+\delta)` by angle addition from :math:`\cos\theta, \sin\theta` and
  float32 Taylor series of :math:`\cos\delta, \sin\delta` to degree 12/11 (:math:`|\delta| < 1` since
  :math:`\delta = \tanh z`; truncation below :math:`2\cdot10^{-10}`);
* :math:`\Phi(r) = \tfrac12(1+\operatorname{erf}(r/\sqrt2))`, :math:`\varphi(r) = e^{-r^2/2}/\sqrt{2\pi}`.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from grt_model.kernels.coupled import _cstage_bwd, _cstage_fwd, _features
from grt_model.kernels.gelu import _gelu, _gelu_apply, _gelu_bwd, _gelu_drift, _gelu_pdf
from grt_model.kernels.jit import kernel
from grt_model.kernels.rotate import (
    _add_live,
    _copy,
    _drift,
    _load,
    _stages_bwd_store,
    _stages_fwd,
    _stages_inv_bwd,
    _store,
    _store_add,
)
from grt_model.kernels.scalar import (  # the scalar helpers are re-exported: tests check them against math
    cdf_pdf_fast32,
    cos_small32,
    erf_fast32,
    erf_rational,
    exp_neg,
    sin_small32,
    tanh_fast32,
    tanh_rational,
)

# Whole cascades (heads stacked along the columns), forward and backward


@kernel
def rot_cascade_fwd(x, out, i0, i1, cf, tt, tile_lo, tile_hi):
    """Coupling-off ``out = C(x)`` over tiles ``[tile_lo, tile_hi)``; ``cf [H, S, P, 4]``; ``x [N, Hin*W]`` with
    ``Hin`` dividing ``H`` (cascade head ``h`` reads input head ``h % Hin``), ``out [N, H*W]``."""
    N = x.shape[0]
    H, S, P = cf.shape[:3]
    W = 2 * P
    hin = x.shape[1] // W  # input heads: cascade head h reads input head h % hin
    act = np.ones((S, P), np.uint8)
    buf = np.empty((W, tt), x.dtype)
    for tile in range(tile_lo, tile_hi):
        n0 = tile * tt
        cnt = min(tt, N - n0)
        for h in range(H):
            _load(x, n0, cnt, (h % hin) * W, W, buf)
            _stages_fwd(buf, i0, i1, cf[h], act)
            _store(buf, n0, cnt, h * W, W, out)


@kernel
def rot_cascade_bwd(x, gy, gx, i0, i1, cf, icf, tt, seg, drift_tol, try_inv, tile_lo, tile_hi, gm):
    """Backward of :func:`rot_cascade_fwd` by inversion, or by storing past ``drift_tol`` (the module docstring;
    ``try_inv=False``: store from the start).  Adds ``sum_t g x^T`` per pair into ``gm [H, S, P, 4]`` (this call's
    own) and the input gradient into ``gx`` (zeros on entry: heads sharing an input head add up); returns the
    number of (tile, head) passes that took the storing path."""
    N = x.shape[0]
    H, S, P = cf.shape[:3]
    W = 2 * P
    hin = x.shape[1] // W  # input heads: cascade head h reads input head h % hin
    act = np.ones((S, P), np.uint8)
    nseg = (S + seg - 1) // seg
    buf = np.empty((W, tt), x.dtype)
    xin = np.empty((W, tt), x.dtype)
    g = np.empty((W, tt), x.dtype)
    gmt = np.empty((S, P, 4), x.dtype)
    ck = np.empty((nseg, W, tt), x.dtype)  # storing path only (pages never touched otherwise)
    xs = np.empty((seg + 1, W, tt), x.dtype)
    use_inv = try_inv
    stored = 0
    for tile in range(tile_lo, tile_hi):
        n0 = tile * tt
        cnt = min(tt, N - n0)
        for h in range(H):
            _load(x, n0, cnt, (h % hin) * W, W, xin)
            _load(gy, n0, cnt, h * W, W, g)
            done = False
            if use_inv:
                _copy(xin, buf)
                _stages_fwd(buf, i0, i1, cf[h], act)
                _stages_inv_bwd(buf, g, i0, i1, cf[h], icf[h], act, gmt)
                err, mag = _drift(buf, xin)
                if err <= drift_tol * mag:
                    _add_live(gmt, gm[h], act)
                    done = True
                else:
                    use_inv = False
                    _load(gy, n0, cnt, h * W, W, g)
            if not done:
                stored += 1
                _stages_bwd_store(xin, g, i0, i1, cf[h], act, seg, ck, xs, gm[h])
            _store_add(g, n0, cnt, (h % hin) * W, W, gx)
    return stored


@kernel
def coupled_cascade_fwd(x, out, i0, i1, th, cs, sn, sc, wt, exact, tiny, tt, keep, rec, tile_lo, tile_hi):
    """Coupling-on ``out = C(x)``; parameters per head ``th, cs, sn [H, S, P]`` (angle, cos, sin),
    ``sc [H, S, P, 2]`` (scales), ``wt [H, S, P, 4P]`` (the coupling transposed).  The last ``keep`` stages
    write their nudges to ``rec [n_tiles, H, keep, P, tt]`` for the backward (``keep = 0``: nothing kept)."""
    N = x.shape[0]
    H, S, P = th.shape
    W = 2 * P
    hin = x.shape[1] // W  # input heads: cascade head h reads input head h % hin
    buf = np.empty((2, W, tt), x.dtype)
    X = np.empty((2, P, tt), x.dtype)
    F = np.empty((4 * P, tt), x.dtype)
    T = np.empty((3, P, tt), x.dtype)
    M = np.empty((3, tt), x.dtype)
    Y = np.empty((2, P, tt), x.dtype)
    Z = np.empty((P, tt), x.dtype)
    D = np.empty((P, tt), x.dtype)
    for tile in range(tile_lo, tile_hi):
        n0 = tile * tt
        cnt = min(tt, N - n0)
        for h in range(H):
            _load(x, n0, cnt, (h % hin) * W, W, buf[0])
            for s in range(S):
                k = s - (S - keep)
                _cstage_fwd(buf[s % 2], buf[1 - s % 2], i0[s], i1[s], th[h, s], cs[h, s], sn[h, s], sc[h, s],
                            wt[h, s], exact, tiny, X, F, T, M, Y, Z, rec[tile, h, k] if k >= 0 else D, False)
            _store(buf[S % 2], n0, cnt, h * W, W, out)


@kernel
def coupled_cascade_bwd(x, rec, gy, gx, i0, i1, th, cs, sn, sc, w, wt, exact, tiny, tt, seg, keep, tile_lo,
                        tile_hi, gth, gsc, gw):
    """Backward of :func:`coupled_cascade_fwd` by rebuilding the stage inputs (the module docstring).  Adds the
    parameter gradients into ``gth [H,S,P]``, ``gsc [H,S,P,2]``, ``gw [H,S,4P,P]`` (this call's own) and the input
    gradient into ``gx`` (zeros on entry)."""
    N = x.shape[0]
    H, S, P = th.shape
    W = 2 * P
    hin = x.shape[1] // W  # input heads: cascade head h reads input head h % hin
    nseg = (S + seg - 1) // seg
    ck = np.empty((nseg, W, tt), x.dtype)  # stage inputs at the segment starts
    work = np.empty((2, W, tt), x.dtype)
    g = np.empty((W, tt), x.dtype)
    X = np.empty((seg, 2, P, tt), x.dtype)  # per-stage records of the segment: pairs and angles
    T = np.empty((seg, 3, P, tt), x.dtype)
    F = np.empty((4 * P, tt), x.dtype)
    M = np.empty((3, tt), x.dtype)
    Y = np.empty((2, P, tt), x.dtype)
    Z = np.empty((P, tt), x.dtype)
    D = np.empty((P, tt), x.dtype)
    Gb = np.empty((2, P, tt), x.dtype)
    GZ = np.empty((P, tt), x.dtype)
    gf = np.empty((4 * P, tt), x.dtype)
    dw = np.empty((4 * P, P), x.dtype)
    accm = np.empty(tt, x.dtype)
    first_kept = S - keep
    for tile in range(tile_lo, tile_hi):
        n0 = tile * tt
        cnt = min(tt, N - n0)
        for h in range(H):
            _load(x, n0, cnt, (h % hin) * W, W, ck[0])
            src = ck[0]
            j = 0
            for s in range((nseg - 1) * seg):  # fill the checkpoints (no pass at all with one segment)
                if (s + 1) % seg == 0:
                    dst = ck[(s + 1) // seg]
                else:
                    dst = work[j]
                    j = 1 - j
                kept = s >= first_kept
                _cstage_fwd(src, dst, i0[s], i1[s], th[h, s], cs[h, s], sn[h, s], sc[h, s], wt[h, s], exact, tiny,
                            X[0], F, T[0], M, Y, Z, rec[tile, h, s - first_kept] if kept else D, kept)
                src = dst
            _load(gy, n0, cnt, h * W, W, g)
            for sg in range(nseg - 1, -1, -1):
                s0 = sg * seg
                n = min(seg, S - s0)
                for k in range(n):  # every stage of the segment, the last included: its backward needs its records
                    s = s0 + k
                    src = ck[sg] if k == 0 else work[(k - 1) % 2]
                    kept = s >= first_kept
                    _cstage_fwd(src, work[k % 2], i0[s], i1[s], th[h, s], cs[h, s], sn[h, s], sc[h, s], wt[h, s],
                                exact, tiny, X[k], F, T[k], M, Y, Z, rec[tile, h, s - first_kept] if kept else D, kept)
                for k in range(n - 1, -1, -1):
                    s = s0 + k
                    _features(X[k], tiny, F, M)
                    _cstage_bwd(g, i0[s], i1[s], sc[h, s], w[h, s], X[k], F, T[k], M, Gb, GZ, accm, gf, dw,
                                gth[h, s], gsc[h, s], gw[h, s])
            _store_add(g, n0, cnt, (h % hin) * W, W, gx)


# The coupling-off FFN: zero-pad -> expand cascade -> RadialGELU -> contract cascade -> keep the first d_out.
# Steps 0..S1-1 are the expand stages, step S1 the GELU, steps S1+1..S1+S2 the contract stages.


@kernel
def ffn_fwd(z, out, ei0, ei1, ecf, eact, ci0, ci1, ccf, cact, exact, save, cdf_all, tt, tile_lo, tile_hi):
    """``out = Pi C2(RadialGELU(C1(Pi^T z)))``.  ``eact [S1, P]`` marks the expand pairs that can be nonzero
    (the zero padding stays zero through the first stages); ``cact [S2, P]`` the contract pairs that reach
    the kept coordinates.  Skipped pairs are exactly the ones whose values are zero or unused.  With
    ``save``, the GELU's ``Phi`` goes to ``cdf_all [n_tiles, P, tt]`` for the backward."""
    N, din = z.shape
    dout = out.shape[1]
    P = ecf.shape[1]
    W = 2 * P
    buf = np.empty((W, tt), z.dtype)
    rec = np.empty((2, P, tt), z.dtype)
    ev = np.arange(0, W, 2)
    od = ev + 1
    for tile in range(tile_lo, tile_hi):
        n0 = tile * tt
        cnt = min(tt, N - n0)
        _load(z, n0, cnt, 0, din, buf)
        _stages_fwd(buf, ei0, ei1, ecf, eact)
        _gelu(buf, ev, od, exact, rec)
        if save:
            _copy(rec[0], cdf_all[tile])
        _stages_fwd(buf, ci0, ci1, ccf, cact)
        _store(buf, n0, cnt, 0, dout, out)


@kernel
def ffn_bwd(z, cdf_all, gy, gz, ei0, ei1, ecf, eicf, eact, ci0, ci1, ccf, cicf, cact, exact, tt, seg, drift_tol,
            try_inv, tile_lo, tile_hi, egm, cgm):
    """Backward of :func:`ffn_fwd`: re-run the forward (the GELU from its saved ``Phi``), then walk back through
    the contract stages, the GELU and the expand stages, each cascade as :func:`rot_cascade_bwd` does.
    ``egm [S1, P, 4]``, ``cgm [S2, P, 4]`` collect ``sum_t g x^T`` per pair.  Returns the number of cascade
    passes that took the storing path."""
    N, din = z.shape
    dout = gy.shape[1]
    S1, P = ecf.shape[:2]
    S2 = ccf.shape[0]
    W = 2 * P
    nseg = (max(S1, S2) + seg - 1) // seg
    buf = np.empty((W, tt), z.dtype)
    hb = np.empty((W, tt), z.dtype)  # the GELU input h (then the expand inversion's working buffer)
    zt = np.empty((W, tt), z.dtype)  # the padded input tile
    g = np.empty((W, tt), z.dtype)
    gs = np.empty((W, tt), z.dtype)  # the GELU input's gradient, kept in case the expand inversion drifts
    rec = np.empty((2, P, tt), z.dtype)
    tmp = np.empty(tt, z.dtype)
    egt = np.empty((S1, P, 4), z.dtype)
    cgt = np.empty((S2, P, 4), z.dtype)
    ck = np.empty((nseg, W, tt), z.dtype)  # storing path only (its pages stay untouched otherwise)
    xs = np.empty((seg + 1, W, tt), z.dtype)
    ev = np.arange(0, W, 2)
    od = ev + 1
    use_inv = try_inv
    stored = 0
    for tile in range(tile_lo, tile_hi):
        n0 = tile * tt
        cnt = min(tt, N - n0)
        _load(z, n0, cnt, 0, din, zt)
        _copy(zt, hb)
        _stages_fwd(hb, ei0, ei1, ecf, eact)
        _copy(cdf_all[tile], rec[0])
        _gelu_pdf(hb, ev, od, exact, rec)
        _load(gy, n0, cnt, 0, dout, g)
        done = False
        if use_inv:
            _copy(hb, buf)
            _gelu_apply(buf, ev, od, rec)
            _stages_fwd(buf, ci0, ci1, ccf, cact)
            _stages_inv_bwd(buf, g, ci0, ci1, ccf, cicf, cact, cgt)
            err, mag = _gelu_drift(buf, hb, ev, od, rec)
            if err <= drift_tol * mag:
                _add_live(cgt, cgm, cact)
                done = True
            else:
                use_inv = False
                _load(gy, n0, cnt, 0, dout, g)
        if not done:
            stored += 1
            _copy(hb, buf)
            _gelu_apply(buf, ev, od, rec)
            _stages_bwd_store(buf, g, ci0, ci1, ccf, cact, seg, ck, xs, cgm)
        _gelu_bwd(g, hb, ev, od, rec, tmp)
        done = False
        if use_inv:
            _copy(g, gs)
            _stages_inv_bwd(hb, g, ei0, ei1, ecf, eicf, eact, egt)
            err, mag = _drift(hb, zt)
            if err <= drift_tol * mag:
                _add_live(egt, egm, eact)
                done = True
            else:
                use_inv = False
                _copy(gs, g)
        if not done:
            stored += 1
            _stages_bwd_store(zt, g, ei0, ei1, ecf, eact, seg, ck, xs, egm)
        _store(g, n0, cnt, 0, din, gz)
    return stored


__all__ = [
    "cdf_pdf_fast32",
    "cos_small32",
    "coupled_cascade_bwd",
    "coupled_cascade_fwd",
    "erf_fast32",
    "erf_rational",
    "exp_neg",
    "ffn_bwd",
    "ffn_fwd",
    "nb",
    "rot_cascade_bwd",
    "rot_cascade_fwd",
    "sin_small32",
    "tanh_fast32",
    "tanh_rational",
]
