"""Coupling-off kernel pieces: tile moves between token-major rows and a coordinate-major tile, Givens
stages forward, by inversion and stored backward, and the drift check of the inversion."""

from __future__ import annotations

import math

import numpy as np

from grt_model.kernels.jit import inline_kernel, kernel

# Tile moves: token-major rows <-> coordinate-major tile buf[i, t]


@kernel
def _load(x, n0, cnt, col0, ncols, buf):
    """``buf[:ncols, :cnt] = x[n0:n0+cnt, col0:col0+ncols].T``; the rest of ``buf`` is zero (the tokens of a
    partial tile, the rows of the FFN's zero padding)."""
    tt = buf.shape[1]
    for t in range(cnt):
        for i in range(ncols):
            buf[i, t] = x[n0 + t, col0 + i]
    for i in range(buf.shape[0]):
        for t in range(cnt if i < ncols else 0, tt):
            buf[i, t] = 0.0


@kernel
def _store(buf, n0, cnt, col0, ncols, y):
    for t in range(cnt):
        for i in range(ncols):
            y[n0 + t, col0 + i] = buf[i, t]


@kernel
def _store_add(buf, n0, cnt, col0, ncols, y):
    """``y[n0:n0+cnt, col0:col0+ncols] += buf[:ncols, :cnt].T`` (an input head shared by several cascade heads)."""
    for t in range(cnt):
        for i in range(ncols):
            y[n0 + t, col0 + i] += buf[i, t]


# One stage, src -> dst (different arrays), and its backward in place on the gradient g.


@kernel
def _copy(src, dst):
    for i in range(src.shape[0]):
        for t in range(src.shape[1]):
            dst[i, t] = src[i, t]


@inline_kernel
def _pair_map(src, dst, i0, i1, m):
    """One pair through its 2x2 map ``m = (a, b, c, d)`` as in :func:`_rot`, from ``src`` into ``dst`` (which may be
    ``src``)."""
    a = m[0]
    b = m[1]
    c = m[2]
    d = m[3]
    for t in range(src.shape[1]):
        x0 = src[i0, t]
        x1 = src[i1, t]
        dst[i0, t] = a * x0 + b * x1
        dst[i1, t] = c * x0 + d * x1


@inline_kernel
def _pair_bwd(g, xs, i0, i1, m):
    """Backward of :func:`_pair_map` given its input ``xs``, in place on ``g``: ``g <- M^T g``; returns
    ``sum_t g x^T`` (the 2x2 map's gradient, row-major)."""
    a = m[0]
    b = m[1]
    c = m[2]
    d = m[3]
    s00 = np.float32(0.0)  # numba widens these to float64 in the float64 kernel; float32 sums vectorize
    s01 = np.float32(0.0)
    s10 = np.float32(0.0)
    s11 = np.float32(0.0)
    for t in range(g.shape[1]):
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
    return s00, s01, s10, s11


@kernel
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


@kernel
def _rot_to(src, dst, i0s, i1s, cf, act):
    """:func:`_rot` out of place (the storing path keeps every stage input); skipped pairs are copied."""
    for p in range(i0s.shape[0]):
        i0 = i0s[p]
        i1 = i1s[p]
        if act[p] != 0:
            _pair_map(src, dst, i0, i1, cf[p])
            continue
        for t in range(src.shape[1]):
            dst[i0, t] = src[i0, t]
            dst[i1, t] = src[i1, t]


@kernel
def _rot_bwd(g, xs, i0s, i1s, cf, act, gm):
    """Backward of a stage given its input ``xs``, in place on ``g`` (grad of the output -> of the input):
    ``g <- M^T g`` and ``gm[p] += sum_t g x^T`` (autograd on the four coefficients takes it on to the angle
    and the scales)."""
    for p in range(i0s.shape[0]):
        if act[p] != 0:
            s = _pair_bwd(g, xs, i0s[p], i1s[p], cf[p])
            for k in range(4):
                gm[p, k] += s[k]


@kernel
def _rot_inv_bwd(x, g, i0s, i1s, cf, icf, act, gmt):
    """The inversion backward of a stage, in place on both buffers: ``x`` goes from the stage's output to its
    input by ``M^{-1} = R^T D^{-1}`` (``icf``), ``g`` from the output's gradient to the input's, and
    ``gmt[p] = sum_t g x^T`` is *assigned* (the tile's own partial, added to the totals once the tile's
    inversion drift is checked).  Two loops per pair: a loop that writes four rows is left scalar by LLVM."""
    for p in range(i0s.shape[0]):
        if act[p] != 0:
            _pair_map(x, x, i0s[p], i1s[p], icf[p])
            s = _pair_bwd(g, x, i0s[p], i1s[p], cf[p])
            for k in range(4):
                gmt[p, k] = s[k]


@kernel
def _add_live(gmt, gm, act):
    """``gm += gmt`` on the live pairs of every stage (``gmt, gm [S, P, 4]``, ``act [S, P]``)."""
    for s in range(gmt.shape[0]):
        for p in range(gmt.shape[1]):
            if act[s, p] != 0:
                for k in range(4):
                    gm[s, p, k] += gmt[s, p, k]


@kernel
def _stages_fwd(buf, i0, i1, cf, act):
    for s in range(cf.shape[0]):
        _rot(buf, i0[s], i1[s], cf[s], act[s])


@kernel
def _stages_inv_bwd(x, g, i0, i1, cf, icf, act, gmt):
    for s in range(cf.shape[0] - 1, -1, -1):
        _rot_inv_bwd(x, g, i0[s], i1[s], cf[s], icf[s], act[s], gmt[s])


@kernel
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


@kernel
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


