"""One coupled (Clifford-feature) stage: gather the pairs, features, nudge, trig, rotate-scale-scatter,
forward, replay from stored nudges, and backward."""

from __future__ import annotations

import math

import numpy as np

from grt_model.kernels.jit import kernel
from grt_model.kernels.scalar import cos_small32, sin_small32, tanh_fast32


@kernel
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


@kernel
def _scatter(X, i0s, i1s, dst):
    """The inverse of :func:`_gather`: ``dst[i0[p]] = X[0, p]``, ``dst[i1[p]] = X[1, p]``."""
    tt = dst.shape[1]
    X0 = X[0]
    X1 = X[1]
    for p in range(i0s.shape[0]):
        r0 = i0s[p]
        r1 = i1s[p]
        for t in range(tt):
            dst[r0, t] = X0[p, t]
        for t in range(tt):
            dst[r1, t] = X1[p, t]


@kernel
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


@kernel
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


@kernel
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


@kernel
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
    _scatter(Y, i0s, i1s, dst)


@kernel
def _cstage_fwd(src, dst, i0s, i1s, th, cs, sn, sc, wt, exact, tiny, X, F, T, M, Y, Z, D, replay):
    """Coupling-on stage ``src -> dst`` (different arrays): gather the pairs, features, the nudges
    ``D = tanh(W^T F)`` (kept by the caller when it stores them), the rotation.  Leaves the stage's records
    ``X [2, P, tt]``, ``F [4P, tt]``, ``M [3, tt]``, ``T [3, P, tt]`` (see :func:`_trig`).  ``replay``: the stage
    from its kept nudges ``D``, no features, no coupling GEMM (the backward's rebuild; ``F`` and ``M`` untouched)."""
    _gather(src, i0s, i1s, X)
    if not replay:
        _features(X, tiny, F, M)
        _nudge(wt, F, exact, Z, D)
    _trig(D, th, cs, sn, exact, T)
    _rotate_scatter(X, T, sc, i0s, i1s, Y, dst)


@kernel
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
    _scatter(Gb, i0s, i1s, g)


