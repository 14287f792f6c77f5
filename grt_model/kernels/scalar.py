r"""The straight-line scalar helpers (float32 polynomials for tanh, erf, exp, sin, cos;
the design and the error bounds are in :mod:`grt_model.kernels.entry`)."""

from __future__ import annotations

import math

import numpy as np

from grt_model.kernels.jit import inline_kernel

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


# Straight-line scalar helpers; LLVM vectorizes the loops they are inlined into.


@inline_kernel
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


@inline_kernel
def tanh_rational(a):
    """``(numerator, denominator)`` of the tanh fit at ``0 <= a <= 9`` (float64)."""
    q = a * a
    num = a * (_TANH_A[0] + q * (_TANH_A[1] + q * (_TANH_A[2] + q * (_TANH_A[3] + q * _TANH_A[4]))))
    den = _TANH_B[0] + q * (_TANH_B[1] + q * (_TANH_B[2] + q * (_TANH_B[3] + q * (_TANH_B[4] + q * _TANH_B[5]))))
    return num, den


@inline_kernel
def tanh_fast32(z):
    """float32 tanh: the fitted rational in float64, its one division in float32."""
    num, den = tanh_rational(min(abs(np.float64(z)), _TANH_CLAMP))
    return math.copysign(np.float32(num) / np.float32(den), np.float32(z))


@inline_kernel
def erf_rational(c):
    """``(numerator, denominator)`` of the erf fit at ``0 <= c <= 4`` (float64)."""
    q = c * c
    num = c * (_ERF_A[0] + q * (_ERF_A[1] + q * (_ERF_A[2] + q * (_ERF_A[3] + q * (_ERF_A[4] + q * (
        _ERF_A[5] + q * _ERF_A[6]))))))
    den = _ERF_B[0] + q * (_ERF_B[1] + q * (_ERF_B[2] + q * (_ERF_B[3] + q * (_ERF_B[4] + q * _ERF_B[5]))))
    return num, den


@inline_kernel
def erf_fast32(x):
    """float32 erf on ``x >= 0``: the fitted rational, its one division in float32; 1 beyond 4."""
    num, den = erf_rational(min(x, _ERF_CLAMP))
    e = np.float32(num) / np.float32(den)
    return np.float32(1.0) if x >= _ERF_CLAMP else e


@inline_kernel
def sin_small32(d):
    q = d * d
    return d * (_SIN32[0] + q * (_SIN32[1] + q * (_SIN32[2] + q * (_SIN32[3] + q * (_SIN32[4] + q * _SIN32[5])))))


@inline_kernel
def cos_small32(d):
    q = d * d
    return _COS32[0] + q * (_COS32[1] + q * (_COS32[2] + q * (_COS32[3] + q * (_COS32[4] + q * (
        _COS32[5] + q * _COS32[6])))))


@inline_kernel
def cdf_pdf_fast32(r):
    """``(Phi(r), phi(r))`` in float32 for a float32 ``r >= 0``."""
    rd = np.float64(r)
    cdf = np.float32(0.5) + np.float32(0.5) * erf_fast32(rd * _INV_SQRT2)
    return cdf, np.float32(exp_neg(min(0.5 * rd * rd, 40.0)) * _INV_SQRT_2PI)


@inline_kernel
def cdf_pdf_exact(r):
    return 0.5 * (1.0 + math.erf(r * _INV_SQRT2)), math.exp(-0.5 * r * r) * _INV_SQRT_2PI


