r"""Numba kernels of the fused rotation cascade (imported only through :mod:`grt_model.fused`).

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
Parameter gradients are summed per call (one call per thread, :mod:`grt_model.fused` adds them up).

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
:class:`grt_model.backend.KernelRuntime`: a BLAS call that fans out over cores busy with other tiles was
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

import math

import numba as nb
import numpy as np

# contract: FMA fusion (IEEE-allowed, more accurate); reassoc: lets LLVM vectorize the per-tile parameter-gradient
# sums (a float reduction is only vectorized when its order may change). No nnan/ninf: NaN and inf still propagate.
_JIT = {"cache": True, "nogil": True, "fastmath": {"contract", "reassoc"}, "error_model": "numpy"}
# scalar helpers are inlined at numba-IR level: a call left to LLVM's inliner carries numba's status-code
# convention into the loop and blocks its vectorization
_INLINE = {**_JIT, "inline": "always"}

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_EXP_C = tuple((-1.0) ** k / math.factorial(k) for k in range(15))  # e^{-w} Taylor, w in [0, 0.625]
# erf(x) ~ x A(x^2) / B(x^2) on [0, 4], max abs error 1.6e-9 (fit described in the module docstring; tested)
_ERF_CLAMP = 4.0
_ERF_A = (1.1283791820810398, 0.1847113905797342, 0.05433295067541318, 0.0038396039483453086,
          0.0003827026771911278, 4.780770017445676e-06, -1.36679621752983e-08)
_ERF_B = (1.0, 0.4970297530380674, 0.11382693077330491, 0.015453696181950501, 0.001309609089147815,
          6.401155728925638e-05)
# tanh(x) ~ x A(x^2) / B(x^2) on [0, 9], max abs error 1.6e-9 (same fit)
_TANH_CLAMP = 9.0
_TANH_A = (0.9999999983040371, 0.13796739757349505, 0.004022915274590924, 3.1895384470705705e-05,
           5.179055396197285e-08)
_TANH_B = (1.0, 0.47130072314364857, 0.027789833613869098, 0.00042332323758714996, 1.6407682829681713e-06,
           7.575042626937351e-10)
# float32 Taylor coefficients of sin(d)/d and cos(d) in d^2 for |d| < 1 (truncation below 2e-10)
_SIN32 = tuple(np.float32((-1.0) ** k / math.factorial(2 * k + 1)) for k in range(6))
_COS32 = tuple(np.float32((-1.0) ** k / math.factorial(2 * k)) for k in range(7))


# ---------------------------------------------------------------------------------------------------
# Straight-line scalar helpers; LLVM vectorizes the loops they are inlined into.
# ---------------------------------------------------------------------------------------------------


@nb.njit(**_INLINE)
def exp_neg(u):
    """:math:`e^{-u}` for ``u`` in [0, 40] (callers clamp), float64: Taylor at u/64, then six squarings."""
    w = u * 0.015625  # the coefficients carry the alternating sign
    p = _EXP_C[0] + w * (_EXP_C[1] + w * (_EXP_C[2] + w * (_EXP_C[3] + w * (_EXP_C[4] + w * (
        _EXP_C[5] + w * (_EXP_C[6] + w * (_EXP_C[7] + w * (_EXP_C[8] + w * (_EXP_C[9] + w * (
            _EXP_C[10] + w * (_EXP_C[11] + w * (_EXP_C[12] + w * (_EXP_C[13] + w * _EXP_C[14])))))))))))))
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    return p * p


@nb.njit(**_INLINE)
def tanh_rational(a):
    """``(numerator, denominator)`` of the tanh fit at ``0 <= a <= 9`` (float64)."""
    q = a * a
    num = a * (_TANH_A[0] + q * (_TANH_A[1] + q * (_TANH_A[2] + q * (_TANH_A[3] + q * _TANH_A[4]))))
    den = _TANH_B[0] + q * (_TANH_B[1] + q * (_TANH_B[2] + q * (_TANH_B[3] + q * (_TANH_B[4] + q * _TANH_B[5]))))
    return num, den


@nb.njit(**_INLINE)
def tanh_fast32(z):
    """float32 tanh: the fitted rational in float64, its one division in float32."""
    num, den = tanh_rational(min(abs(np.float64(z)), _TANH_CLAMP))
    return math.copysign(np.float32(num) / np.float32(den), np.float32(z))


@nb.njit(**_INLINE)
def erf_rational(c):
    """``(numerator, denominator)`` of the erf fit at ``0 <= c <= 4`` (float64)."""
    q = c * c
    num = c * (_ERF_A[0] + q * (_ERF_A[1] + q * (_ERF_A[2] + q * (_ERF_A[3] + q * (_ERF_A[4] + q * (
        _ERF_A[5] + q * _ERF_A[6]))))))
    den = _ERF_B[0] + q * (_ERF_B[1] + q * (_ERF_B[2] + q * (_ERF_B[3] + q * (_ERF_B[4] + q * _ERF_B[5]))))
    return num, den


@nb.njit(**_INLINE)
def erf_fast32(x):
    """float32 erf on ``x >= 0``: the fitted rational, its one division in float32; 1 beyond 4."""
    num, den = erf_rational(min(x, _ERF_CLAMP))
    e = np.float32(num) / np.float32(den)
    return np.float32(1.0) if x >= _ERF_CLAMP else e


@nb.njit(**_INLINE)
def sin_small32(d):
    q = d * d
    return d * (_SIN32[0] + q * (_SIN32[1] + q * (_SIN32[2] + q * (_SIN32[3] + q * (_SIN32[4] + q * _SIN32[5])))))


@nb.njit(**_INLINE)
def cos_small32(d):
    q = d * d
    return _COS32[0] + q * (_COS32[1] + q * (_COS32[2] + q * (_COS32[3] + q * (_COS32[4] + q * (
        _COS32[5] + q * _COS32[6])))))


@nb.njit(**_INLINE)
def cdf_pdf_fast32(r):
    """``(Phi(r), phi(r))`` in float32 for a float32 ``r >= 0``."""
    rd = np.float64(r)
    cdf = np.float32(0.5) + np.float32(0.5) * erf_fast32(rd * _INV_SQRT2)
    return cdf, np.float32(exp_neg(min(0.5 * rd * rd, 40.0)) * _INV_SQRT_2PI)


@nb.njit(**_INLINE)
def cdf_pdf_exact(r):
    return 0.5 * (1.0 + math.erf(r * _INV_SQRT2)), math.exp(-0.5 * r * r) * _INV_SQRT_2PI


# ---------------------------------------------------------------------------------------------------
# Tile moves: token-major rows <-> coordinate-major tile buf[i, t]
# ---------------------------------------------------------------------------------------------------


@nb.njit(**_JIT)
def _load(x, n0, cnt, col0, ncols, buf):
    """``buf[:ncols, :cnt] = x[n0:n0+cnt, col0:col0+ncols].T``; tokens past ``cnt`` are zero (a partial tile)."""
    tt = buf.shape[1]
    for t in range(cnt):
        for i in range(ncols):
            buf[i, t] = x[n0 + t, col0 + i]
    for i in range(ncols):
        for t in range(cnt, tt):
            buf[i, t] = 0.0


@nb.njit(**_JIT)
def _zero_rows(buf, lo, hi):
    for i in range(lo, hi):
        for t in range(buf.shape[1]):
            buf[i, t] = 0.0


@nb.njit(**_JIT)
def _store(buf, n0, cnt, col0, ncols, y):
    for t in range(cnt):
        for i in range(ncols):
            y[n0 + t, col0 + i] = buf[i, t]


@nb.njit(**_JIT)
def _store_add(buf, n0, cnt, col0, ncols, y):
    """``y[n0:n0+cnt, col0:col0+ncols] += buf[:ncols, :cnt].T`` (an input head shared by several cascade heads)."""
    for t in range(cnt):
        for i in range(ncols):
            y[n0 + t, col0 + i] += buf[i, t]


# ---------------------------------------------------------------------------------------------------
# One stage, src -> dst (different arrays), and its backward in place on the gradient g.
# ---------------------------------------------------------------------------------------------------


@nb.njit(**_JIT)
def _copy(src, dst):
    for i in range(src.shape[0]):
        for t in range(src.shape[1]):
            dst[i, t] = src[i, t]


@nb.njit(**_JIT)
def _rot(buf, i0s, i1s, cf, act):
    """Coupling-off stage in place, with each pair's 2x2 map ``cf[p] = (a, b, c, d)`` (rows of
    :math:`D R(\\theta)`): ``x0 <- a x0 + b x1``, ``x1 <- c x0 + d x1``.  Pairs with ``act[p] == 0`` are
    skipped: in place, a pair holding zeros stays zero and an unused pair keeps values nobody reads."""
    tt = buf.shape[1]
    for p in range(i0s.shape[0]):
        if act[p] == 0:
            continue
        i0 = i0s[p]
        i1 = i1s[p]
        a = cf[p, 0]
        b = cf[p, 1]
        c = cf[p, 2]
        d = cf[p, 3]
        for t in range(tt):
            x0 = buf[i0, t]
            x1 = buf[i1, t]
            buf[i0, t] = a * x0 + b * x1
            buf[i1, t] = c * x0 + d * x1


@nb.njit(**_JIT)
def _rot_to(src, dst, i0s, i1s, cf, act):
    """:func:`_rot` out of place (the storing path keeps every stage input); skipped pairs are copied."""
    tt = src.shape[1]
    for p in range(i0s.shape[0]):
        i0 = i0s[p]
        i1 = i1s[p]
        if act[p] == 0:
            for t in range(tt):
                dst[i0, t] = src[i0, t]
                dst[i1, t] = src[i1, t]
            continue
        a = cf[p, 0]
        b = cf[p, 1]
        c = cf[p, 2]
        d = cf[p, 3]
        for t in range(tt):
            x0 = src[i0, t]
            x1 = src[i1, t]
            dst[i0, t] = a * x0 + b * x1
            dst[i1, t] = c * x0 + d * x1


@nb.njit(**_JIT)
def _rot_bwd(g, xs, i0s, i1s, cf, act, gm):
    """Backward of a stage given its input ``xs``, in place on ``g`` (grad of the output -> of the input):
    ``g <- M^T g`` and ``gm[p] += sum_t g x^T`` (the 2x2 map's gradient, row-major; autograd on the four
    coefficients takes it on to the angle and the scales)."""
    tt = g.shape[1]
    for p in range(i0s.shape[0]):
        if act[p] == 0:
            continue
        i0 = i0s[p]
        i1 = i1s[p]
        a = cf[p, 0]
        b = cf[p, 1]
        c = cf[p, 2]
        d = cf[p, 3]
        s00 = np.float32(0.0)  # numba widens these to float64 in the float64 kernel; float32 sums vectorize
        s01 = np.float32(0.0)
        s10 = np.float32(0.0)
        s11 = np.float32(0.0)
        for t in range(tt):
            x0 = xs[i0, t]
            x1 = xs[i1, t]
            g0 = g[i0, t]
            g1 = g[i1, t]
            s00 += g0 * x0
            s01 += g0 * x1
            s10 += g1 * x0
            s11 += g1 * x1
            g[i0, t] = a * g0 + c * g1
            g[i1, t] = b * g0 + d * g1
        gm[p, 0] += s00
        gm[p, 1] += s01
        gm[p, 2] += s10
        gm[p, 3] += s11


@nb.njit(**_JIT)
def _rot_inv_bwd(x, g, i0s, i1s, cf, icf, act, gmt):
    """The inversion backward of a stage, in place on both buffers: ``x`` goes from the stage's output to its
    input by ``M^{-1} = R^T D^{-1}`` (``icf``), ``g`` from the output's gradient to the input's, and
    ``gmt[p] = sum_t g x^T`` is *assigned* (the tile's own partial, added to the totals once the tile's
    inversion drift is checked).  Two loops per pair: a loop that writes four rows is left scalar by LLVM."""
    tt = g.shape[1]
    for p in range(i0s.shape[0]):
        if act[p] == 0:
            continue
        i0 = i0s[p]
        i1 = i1s[p]
        ia = icf[p, 0]
        ib = icf[p, 1]
        ic = icf[p, 2]
        id_ = icf[p, 3]
        for t in range(tt):
            y0 = x[i0, t]
            y1 = x[i1, t]
            x[i0, t] = ia * y0 + ib * y1
            x[i1, t] = ic * y0 + id_ * y1
        a = cf[p, 0]
        b = cf[p, 1]
        c = cf[p, 2]
        d = cf[p, 3]
        s00 = np.float32(0.0)
        s01 = np.float32(0.0)
        s10 = np.float32(0.0)
        s11 = np.float32(0.0)
        for t in range(tt):
            x0 = x[i0, t]
            x1 = x[i1, t]
            g0 = g[i0, t]
            g1 = g[i1, t]
            s00 += g0 * x0
            s01 += g0 * x1
            s10 += g1 * x0
            s11 += g1 * x1
            g[i0, t] = a * g0 + c * g1
            g[i1, t] = b * g0 + d * g1
        gmt[p, 0] = s00
        gmt[p, 1] = s01
        gmt[p, 2] = s10
        gmt[p, 3] = s11


@nb.njit(**_JIT)
def _add_live(gmt, gm, act):
    """``gm += gmt`` on the live pairs of every stage (``gmt, gm [S, P, 4]``, ``act [S, P]``)."""
    for s in range(gmt.shape[0]):
        for p in range(gmt.shape[1]):
            if act[s, p] != 0:
                for k in range(4):
                    gm[s, p, k] += gmt[s, p, k]


@nb.njit(**_JIT)
def _stages_fwd(buf, i0, i1, cf, act):
    for s in range(cf.shape[0]):
        _rot(buf, i0[s], i1[s], cf[s], act[s])


@nb.njit(**_JIT)
def _stages_inv_bwd(x, g, i0, i1, cf, icf, act, gmt):
    for s in range(cf.shape[0] - 1, -1, -1):
        _rot_inv_bwd(x, g, i0[s], i1[s], cf[s], icf[s], act[s], gmt[s])


@nb.njit(**_JIT)
def _stages_bwd_store(xin, g, i0, i1, cf, act, seg, ck, xs, gm):
    """The storing backward of a stage sequence from its input ``xin``: checkpoints every ``seg`` stages,
    each segment re-run keeping its stage inputs (``ck [>= nseg, W, tt]``, ``xs [seg + 1, W, tt]``)."""
    S = cf.shape[0]
    nseg = (S + seg - 1) // seg
    work = xs[seg]
    _copy(xin, work)
    for s in range((nseg - 1) * seg):
        if s % seg == 0:
            _copy(work, ck[s // seg])
        _rot(work, i0[s], i1[s], cf[s], act[s])
    if nseg > 1:
        _copy(work, ck[nseg - 1])
    else:
        _copy(xin, ck[0])
    for sg in range(nseg - 1, -1, -1):
        s0 = sg * seg
        n = min(seg, S - s0)
        _copy(ck[sg], xs[0])
        for k in range(n - 1):
            _rot_to(xs[k], xs[k + 1], i0[s0 + k], i1[s0 + k], cf[s0 + k], act[s0 + k])
        for k in range(n - 1, -1, -1):
            _rot_bwd(g, xs[k], i0[s0 + k], i1[s0 + k], cf[s0 + k], act[s0 + k], gm[s0 + k])


@nb.njit(**_JIT)
def _drift(x, ref):
    """``(||x - ref||, ||ref||)`` over a tile (Frobenius norms: sums vectorize, maxima would not)."""
    err = 0.0
    mag = 0.0
    for i in range(x.shape[0]):
        for t in range(x.shape[1]):
            d = np.float64(x[i, t]) - np.float64(ref[i, t])
            err += d * d
            mag += np.float64(ref[i, t]) * np.float64(ref[i, t])
    return math.sqrt(err), math.sqrt(mag)


@nb.njit(**_JIT)
def _gather(src, i0s, i1s, X):
    """The stage's pairs, pair-major: ``X[0, p] = src[i0[p]]``, ``X[1, p] = src[i1[p]]`` (``X [2, P, tt]``).
    Every later loop of the stage then runs over distinct contiguous arrays: LLVM checks their overlap once
    per loop nest instead of once per pair, and vectorizes."""
    tt = src.shape[1]
    X0 = X[0]
    X1 = X[1]
    for p in range(i0s.shape[0]):
        r0 = i0s[p]
        r1 = i1s[p]
        for t in range(tt):
            X0[p, t] = src[r0, t]
        for t in range(tt):
            X1[p, t] = src[r1, t]


@nb.njit(**_JIT)
def _features(X, tiny, F, M):
    """The Clifford features of the gathered pairs ``X [2, P, tt]`` into ``F [4P, tt]`` and
    ``M [3, tt]`` = (1/m, 1/sqrt(m), whether m is above its floor)."""
    tt = X.shape[2]
    P = X.shape[1]
    X0 = X[0]
    X1 = X[1]
    m0 = M[0]
    m1 = M[1]
    m2 = M[2]
    for t in range(tt):
        m0[t] = 0.0
    for p in range(P):
        for t in range(tt):
            m0[t] += X0[p, t] * X0[p, t] + X1[p, t] * X1[p, t]
    for t in range(tt):
        m = m0[t] / P  # mean pair energy of the token
        above = m >= tiny
        m = m if above else tiny
        m0[t] = 1.0 / m
        m1[t] = 1.0 / math.sqrt(m)
        m2[t] = 1.0 if above else 0.0
    for p in range(P):
        for t in range(tt):
            F[p, t] = (X0[p, t] * X0[p, t] + X1[p, t] * X1[p, t]) * m0[t]
    for p in range(P):
        for t in range(tt):
            F[P + p, t] = X0[p, t] * m1[t]
    for p in range(P):
        for t in range(tt):
            F[2 * P + p, t] = X1[p, t] * m1[t]
    for p in range(P - 1):  # signed area with the next pair; the last wraps to pair 0
        for t in range(tt):
            F[3 * P + p, t] = (X0[p, t] * X1[p + 1, t] - X1[p, t] * X0[p + 1, t]) * m0[t]
    for t in range(tt):
        F[4 * P - 1, t] = (X0[P - 1, t] * X1[0, t] - X1[P - 1, t] * X0[0, t]) * m0[t]


@nb.njit(**_JIT)
def _nudge(wt, F, exact, Z, D):
    """``D = tanh(W^T F)`` (``wt [P, 4P]``, the coupling transposed): the tile's angle nudges ``[P, tt]``; the
    product is one BLAS call into the preallocated ``Z``."""
    np.dot(wt, F, Z)
    P, tt = Z.shape
    if exact:
        for p in range(P):
            for t in range(tt):
                D[p, t] = math.tanh(Z[p, t])
    else:
        for p in range(P):
            for t in range(tt):
                D[p, t] = tanh_fast32(Z[p, t])


@nb.njit(**_JIT)
def _trig(D, th, cs, sn, exact, T):
    """From the nudges ``D [P, tt]``: ``T [3, P, tt]`` = (cos, sin of the used angle theta + delta,
    1 - tanh^2).  The forward and the backward's rebuild both call this, so a rebuilt stage computes
    bit-for-bit the forward's values."""
    P, tt = D.shape
    CC = T[0]
    SS = T[1]
    DD = T[2]
    if exact:
        for p in range(P):
            base = th[p]
            for t in range(tt):
                d = D[p, t]
                DD[p, t] = 1.0 - d * d
                CC[p, t] = math.cos(base + d)
                SS[p, t] = math.sin(base + d)
    else:  # the float32 kernel: every value here is float32; angle addition from cos, sin of the base
        for p in range(P):
            ct = cs[p]
            st = sn[p]
            for t in range(tt):
                cd = cos_small32(D[p, t])
                sd = sin_small32(D[p, t])
                CC[p, t] = ct * cd - st * sd
                SS[p, t] = st * cd + ct * sd
        for p in range(P):
            for t in range(tt):
                DD[p, t] = np.float32(1.0) - D[p, t] * D[p, t]


@nb.njit(**_JIT)
def _rotate_scatter(X, T, sc, i0s, i1s, Y, dst):
    """``dst[i0, i1] = D R(theta + delta) (x0, x1)`` per pair (``Y [2, P, tt]`` scratch)."""
    P = X.shape[1]
    tt = X.shape[2]
    X0 = X[0]
    X1 = X[1]
    CC = T[0]
    SS = T[1]
    Y0 = Y[0]
    Y1 = Y[1]
    for p in range(P):
        a0 = sc[p, 0]
        for t in range(tt):
            Y0[p, t] = (CC[p, t] * X0[p, t] - SS[p, t] * X1[p, t]) * a0
    for p in range(P):
        a1 = sc[p, 1]
        for t in range(tt):
            Y1[p, t] = (SS[p, t] * X0[p, t] + CC[p, t] * X1[p, t]) * a1
    for p in range(P):
        r0 = i0s[p]
        r1 = i1s[p]
        for t in range(tt):
            dst[r0, t] = Y0[p, t]
        for t in range(tt):
            dst[r1, t] = Y1[p, t]


@nb.njit(**_JIT)
def _cstage_fwd(src, dst, i0s, i1s, th, cs, sn, sc, wt, exact, tiny, X, F, T, M, Y, Z, D):
    """Coupling-on stage ``src -> dst`` (different arrays): gather the pairs, features, the nudges
    ``D = tanh(W^T F)`` (kept by the caller when it stores them), the rotation.  Leaves the stage's records
    ``X [2, P, tt]``, ``F [4P, tt]``, ``M [3, tt]``, ``T [3, P, tt]`` (see :func:`_trig`)."""
    _gather(src, i0s, i1s, X)
    _features(X, tiny, F, M)
    _nudge(wt, F, exact, Z, D)
    _trig(D, th, cs, sn, exact, T)
    _rotate_scatter(X, T, sc, i0s, i1s, Y, dst)


@nb.njit(**_JIT)
def _cstage_replay(src, dst, i0s, i1s, th, cs, sn, sc, exact, X, T, Y, D):
    """A coupled stage from its kept nudges ``D``: no features, no coupling GEMM (the backward's rebuild)."""
    _gather(src, i0s, i1s, X)
    _trig(D, th, cs, sn, exact, T)
    _rotate_scatter(X, T, sc, i0s, i1s, Y, dst)


@nb.njit(**_JIT)
def _cstage_bwd(g, i0s, i1s, sc, w, X, F, T, M, Gb, GZ, accm, gf, dw, gth, gsc, gw):
    r"""Backward of :func:`_cstage_fwd` from its records, in place on ``g`` (pair-major as there; ``Gb [2, P, tt]``,
    ``GZ [P, tt]``, ``accm [tt]``, ``gf [4P, tt]``, ``dw [4P, P]`` scratch).

    Rotation: :math:`u = R x`, :math:`\partial s_k \mathrel{+}= \sum_t g_k u_k`,
    :math:`g_\vartheta = s_1 g_1 u_0 - s_0 g_0 u_1`, :math:`g_x = R^\top (s\odot g)`; coupling:
    :math:`g_z = g_\vartheta (1-\tanh^2)`, :math:`\partial W \mathrel{+}= F g_z^\top`, :math:`g_F = W g_z`; features
    (:math:`m` the mean pair energy, :math:`F_0 = e/m, F_{1,2} = x_{0,1}/\sqrt m, F_3 = a/m`):
    :math:`\partial m = -\tfrac1m\sum_p (F_0 g_{F_0} + F_3 g_{F_3} + \tfrac12(F_1 g_{F_1} + F_2 g_{F_2}))`,
    :math:`\partial m/\partial x_i = 2x_i/P` (zero where :math:`m` sat on its floor).
    """
    tt = g.shape[1]
    P = i0s.shape[0]
    X0 = X[0]
    X1 = X[1]
    CC = T[0]
    SS = T[1]
    DD = T[2]
    G0 = Gb[0]
    G1 = Gb[1]
    _gather(g, i0s, i1s, Gb)
    for p in range(P):
        a0 = sc[p, 0]
        a1 = sc[p, 1]
        acc_t = np.float32(0.0)  # widened to float64 in the float64 kernel
        acc_0 = np.float32(0.0)
        acc_1 = np.float32(0.0)
        for t in range(tt):
            u0 = CC[p, t] * X0[p, t] - SS[p, t] * X1[p, t]
            u1 = SS[p, t] * X0[p, t] + CC[p, t] * X1[p, t]
            acc_0 += G0[p, t] * u0
            acc_1 += G1[p, t] * u1
            gt = a1 * G1[p, t] * u0 - a0 * G0[p, t] * u1
            acc_t += gt
            GZ[p, t] = gt * DD[p, t]
        gth[p] += acc_t
        gsc[p, 0] += acc_0
        gsc[p, 1] += acc_1
    for p in range(P):
        a0 = sc[p, 0]
        a1 = sc[p, 1]
        for t in range(tt):
            v0 = a0 * G0[p, t]
            v1 = a1 * G1[p, t]
            G0[p, t] = CC[p, t] * v0 + SS[p, t] * v1
            G1[p, t] = CC[p, t] * v1 - SS[p, t] * v0
    np.dot(w, GZ, gf)  # (4P, tt)
    np.dot(F, GZ.T, dw)  # (4P, P)
    for f in range(4 * P):
        for p in range(P):
            gw[f, p] += dw[f, p]
    m0 = M[0]
    m1 = M[1]
    for p in range(P):
        for t in range(tt):
            G0[p, t] += 2.0 * X0[p, t] * gf[p, t] * m0[t] + gf[P + p, t] * m1[t]
    for p in range(P):
        for t in range(tt):
            G1[p, t] += 2.0 * X1[p, t] * gf[p, t] * m0[t] + gf[2 * P + p, t] * m1[t]
    # the signed area a_p = x0[p] x1[p+1] - x1[p] x0[p+1] (indices mod P), scaled by 1/m
    for p in range(P - 1):
        for t in range(tt):
            G0[p, t] += gf[3 * P + p, t] * m0[t] * X1[p + 1, t]
    for p in range(P - 1):
        for t in range(tt):
            G1[p, t] -= gf[3 * P + p, t] * m0[t] * X0[p + 1, t]
    for p in range(P - 1):
        for t in range(tt):
            G1[p + 1, t] += gf[3 * P + p, t] * m0[t] * X0[p, t]
    for p in range(P - 1):
        for t in range(tt):
            G0[p + 1, t] -= gf[3 * P + p, t] * m0[t] * X1[p, t]
    for t in range(tt):  # the wrapped term p = P - 1 (at P = 1 it cancels, as the area is 0)
        a3 = gf[4 * P - 1, t] * m0[t]
        G0[P - 1, t] += a3 * X1[0, t]
        G1[P - 1, t] -= a3 * X0[0, t]
        G1[0, t] += a3 * X0[P - 1, t]
        G0[0, t] -= a3 * X1[P - 1, t]
    for t in range(tt):
        accm[t] = 0.0
    for p in range(P):
        for t in range(tt):
            accm[t] += (F[p, t] * gf[p, t] + F[3 * P + p, t] * gf[3 * P + p, t]
                        + 0.5 * (F[P + p, t] * gf[P + p, t] + F[2 * P + p, t] * gf[2 * P + p, t]))
    for t in range(tt):
        accm[t] = -accm[t] * m0[t] * M[2, t] * (2.0 / P)  # dL/dm * dm/dx_i / x_i
    for p in range(P):
        for t in range(tt):
            G0[p, t] += accm[t] * X0[p, t]
    for p in range(P):
        for t in range(tt):
            G1[p, t] += accm[t] * X1[p, t]
    for p in range(P):
        r0 = i0s[p]
        r1 = i1s[p]
        for t in range(tt):
            g[r0, t] = G0[p, t]
        for t in range(tt):
            g[r1, t] = G1[p, t]


@nb.njit(**_JIT)
def _gelu(buf, ev, od, exact, rec):
    """RadialGELU in place on the adjacent pairs ``(ev[q], od[q]) = (2q, 2q+1)``: ``x <- Phi(r) x``; records
    ``rec[0] = Phi`` and ``rec[1] = phi(r)/r`` (0 at r = 0) for the backward.  The float32 path takes r and 1/r
    in float32 (as the eager path does), the polynomials in float64, and rounds Phi and phi once.  (Rows come
    from index arrays on purpose: rows affine in the loop counter make LLVM hoist its overlap check over the
    whole loop nest, where neighbouring rows do overlap, and run the scalar loop.)"""
    tt = buf.shape[1]
    for q in range(ev.shape[0]):
        i0 = ev[q]
        i1 = od[q]
        if exact:
            for t in range(tt):
                u0 = buf[i0, t]
                u1 = buf[i1, t]
                rr = math.sqrt(u0 * u0 + u1 * u1)
                cdf64, pdf64 = cdf_pdf_exact(rr)
                rec[0, q, t] = cdf64
                rec[1, q, t] = pdf64 / rr if rr > 0.0 else 0.0
        else:
            for t in range(tt):
                x0 = buf[i0, t]
                x1 = buf[i1, t]
                r = math.sqrt(x0 * x0 + x1 * x1)
                ir = np.float32(1.0) / r if r > 0.0 else np.float32(0.0)
                cdf, pdf = cdf_pdf_fast32(r)
                rec[0, q, t] = cdf
                rec[1, q, t] = pdf * ir
        for t in range(tt):
            cdf = rec[0, q, t]
            buf[i0, t] = cdf * buf[i0, t]
            buf[i1, t] = cdf * buf[i1, t]


@nb.njit(**_JIT)
def _gelu_pdf(h, ev, od, exact, rec):
    """``rec[1] = phi(r)/r`` (0 at r = 0) from the GELU input ``h``, exactly as :func:`_gelu` computes it (the
    backward recomputes it rather than keep it: half the FFN's saved memory)."""
    tt = h.shape[1]
    for q in range(ev.shape[0]):
        i0 = ev[q]
        i1 = od[q]
        if exact:
            for t in range(tt):
                u0 = h[i0, t]
                u1 = h[i1, t]
                rr = math.sqrt(u0 * u0 + u1 * u1)
                cdf64, pdf64 = cdf_pdf_exact(rr)
                rec[1, q, t] = pdf64 / rr if rr > 0.0 else 0.0
        else:
            for t in range(tt):
                x0 = h[i0, t]
                x1 = h[i1, t]
                r = math.sqrt(x0 * x0 + x1 * x1)
                ir = np.float32(1.0) / r if r > 0.0 else np.float32(0.0)
                cdf, pdf = cdf_pdf_fast32(r)
                rec[1, q, t] = pdf * ir


@nb.njit(**_JIT)
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


@nb.njit(**_JIT)
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


@nb.njit(**_JIT)
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


# ---------------------------------------------------------------------------------------------------
# Whole cascades (heads stacked along the columns), forward and backward
# ---------------------------------------------------------------------------------------------------


@nb.njit(**_JIT)
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


@nb.njit(**_JIT)
def rot_cascade_bwd(x, gy, gx, i0, i1, cf, icf, tt, seg, drift_tol, try_inv, tile_lo, tile_hi, gm):
    """Backward of :func:`rot_cascade_fwd` over tiles ``[tile_lo, tile_hi)``: per tile and head, run the stages
    forward, then walk back *inverting* each stage (no stored activations); if the recovered input drifts from
    the true one by more than ``drift_tol`` (relative), redo the tile with the storing backward (checkpoints
    every ``seg`` stages) and keep storing for the rest of the call (``try_inv=False``: store from the start).
    Adds ``sum_t g x^T`` per pair into ``gm [H, S, P, 4]`` (this call's own) and the input gradient into
    ``gx`` (zeros on entry: heads sharing an input head add up); returns the number of (tile, head) passes
    that took the storing path."""
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


@nb.njit(**_JIT)
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
                            wt[h, s], exact, tiny, X, F, T, M, Y, Z, rec[tile, h, k] if k >= 0 else D)
            _store(buf[S % 2], n0, cnt, h * W, W, out)


@nb.njit(**_JIT)
def coupled_cascade_bwd(x, rec, gy, gx, i0, i1, th, cs, sn, sc, w, wt, exact, tiny, tt, seg, keep, tile_lo,
                        tile_hi, gth, gsc, gw):
    """Backward of :func:`coupled_cascade_fwd`: per tile and head, rebuild the stage inputs (a kept stage from
    its nudges in ``rec``, without its coupling GEMM; the others in full), checkpointed every ``seg`` stages,
    each segment re-run keeping its stages' pairs and angles, then walked back (features recomputed from the
    pairs).  Adds the parameter gradients into ``gth [H,S,P]``, ``gsc [H,S,P,2]``, ``gw [H,S,4P,P]`` (this
    call's own) and the input gradient into ``gx`` (zeros on entry)."""
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
                if s >= first_kept:
                    _cstage_replay(src, dst, i0[s], i1[s], th[h, s], cs[h, s], sn[h, s], sc[h, s], exact, X[0],
                                   T[0], Y, rec[tile, h, s - first_kept])
                else:
                    _cstage_fwd(src, dst, i0[s], i1[s], th[h, s], cs[h, s], sn[h, s], sc[h, s], wt[h, s], exact,
                                tiny, X[0], F, T[0], M, Y, Z, D)
                src = dst
            _load(gy, n0, cnt, h * W, W, g)
            for sg in range(nseg - 1, -1, -1):
                s0 = sg * seg
                n = min(seg, S - s0)
                for k in range(n):  # every stage of the segment, the last included: its backward needs its records
                    s = s0 + k
                    src = ck[sg] if k == 0 else work[(k - 1) % 2]
                    if s >= first_kept:
                        _cstage_replay(src, work[k % 2], i0[s], i1[s], th[h, s], cs[h, s], sn[h, s], sc[h, s],
                                       exact, X[k], T[k], Y, rec[tile, h, s - first_kept])
                    else:
                        _cstage_fwd(src, work[k % 2], i0[s], i1[s], th[h, s], cs[h, s], sn[h, s], sc[h, s],
                                    wt[h, s], exact, tiny, X[k], F, T[k], M, Y, Z, D)
                for k in range(n - 1, -1, -1):
                    s = s0 + k
                    _features(X[k], tiny, F, M)
                    _cstage_bwd(g, i0[s], i1[s], sc[h, s], w[h, s], X[k], F, T[k], M, Gb, GZ, accm, gf, dw,
                                gth[h, s], gsc[h, s], gw[h, s])
            _store_add(g, n0, cnt, (h % hin) * W, W, gx)


# ---------------------------------------------------------------------------------------------------
# The coupling-off FFN: zero-pad -> expand cascade -> RadialGELU -> contract cascade -> keep the first d_out.
# Steps 0..S1-1 are the expand stages, step S1 the GELU, steps S1+1..S1+S2 the contract stages.
# ---------------------------------------------------------------------------------------------------


@nb.njit(**_JIT)
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
        _zero_rows(buf, din, W)
        _stages_fwd(buf, ei0, ei1, ecf, eact)
        _gelu(buf, ev, od, exact, rec)
        if save:
            _copy(rec[0], cdf_all[tile])
        _stages_fwd(buf, ci0, ci1, ccf, cact)
        _store(buf, n0, cnt, 0, dout, out)


@nb.njit(**_JIT)
def ffn_bwd(z, cdf_all, gy, gz, ei0, ei1, ecf, eicf, eact, ci0, ci1, ccf, cicf, cact, exact, tt, seg, drift_tol,
            try_inv, tile_lo, tile_hi, egm, cgm):
    """Backward of :func:`ffn_fwd`: per tile, re-run the forward (the GELU from its saved ``Phi``), then
    walk back inverting the contract stages, through the GELU, and inverting the expand stages, checking
    each inversion's drift as :func:`rot_cascade_bwd` does (and falling back to the storing backward the
    same way).  ``egm [S1, P, 4]``, ``cgm [S2, P, 4]`` collect ``sum_t g x^T`` per pair.  Returns the number
    of cascade passes that took the storing path."""
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
        _zero_rows(zt, din, W)
        _copy(zt, hb)
        _stages_fwd(hb, ei0, ei1, ecf, eact)
        _copy(cdf_all[tile], rec[0])
        _gelu_pdf(hb, ev, od, exact, rec)
        _load(gy, n0, cnt, 0, dout, g)
        _zero_rows(g, dout, W)
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
                _zero_rows(g, dout, W)
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
