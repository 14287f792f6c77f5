r"""The one tolerance helper: every numerical threshold in the suite comes from here.

A computation of ``size`` accumulated terms through ``depth`` sequential
operations in a floating type with unit round-off :math:`u = \varepsilon/2`
has a worst-case relative error of order :math:`\text{depth}\cdot\text{size}\cdot u`
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1) and a
typical (random-walk) error of order :math:`\sqrt{\text{depth}\cdot\text{size}}\;u`.
We use the typical bound times a safety factor:

.. math::  \text{rtol} = \text{safety}\cdot\varepsilon\cdot\sqrt{\text{depth}\cdot\text{size}},
           \qquad \text{atol} = \text{rtol}\cdot\text{scale}.

``scale`` is the magnitude of the quantity compared (so ``atol`` is meaningful for
values that should be zero, e.g. a radial gradient :math:`\langle g, W\rangle`
whose natural scale is :math:`\lVert g\rVert\,\lVert W\rVert`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_SAFETY = 16.0  # typical-error bound times 16: margin for reductions whose order we do not control (BLAS)


def eps_of(dtype: Any) -> float:
    """Machine epsilon of a numpy or torch floating dtype (or its name)."""
    name = str(dtype).replace("torch.", "")
    try:
        return float(np.finfo(np.dtype(name)).eps)
    except TypeError:
        if name == "bfloat16":
            return 2.0**-7
        raise ValueError(f"unknown floating dtype {dtype!r}; use float16, bfloat16, float32 or float64") from None


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    dtype: str

    def bound(self, expected_magnitude: float = 0.0) -> float:
        """The allowed absolute error for a value of this magnitude."""
        return self.atol + self.rtol * abs(expected_magnitude)

    def holds(self, error: float, expected_magnitude: float = 0.0) -> bool:
        return bool(math.isfinite(error) and abs(error) <= self.bound(expected_magnitude))


def tolerance(
    dtype: Any,
    *,
    size: int = 1,
    depth: int = 1,
    scale: float = 1.0,
    safety: float = DEFAULT_SAFETY,
    rtol: float | None = None,
    atol: float | None = None,
) -> Tolerance:
    """Tolerance for a result computed in ``dtype`` from ``size`` terms through ``depth`` steps.

    Explicit ``rtol``/``atol`` override the derived values (keyword-only on purpose:
    a bare number in a call site is the magic constant this helper exists to remove).
    """
    if size < 1 or depth < 1:
        raise ValueError(f"size and depth must be >= 1, got size={size}, depth={depth}")
    derived = safety * eps_of(dtype) * math.sqrt(size * depth)
    r = derived if rtol is None else float(rtol)
    a = derived * float(scale) if atol is None else float(atol)
    return Tolerance(rtol=r, atol=a, dtype=str(dtype).replace("torch.", ""))


def assert_close(actual: Any, expected: Any, *, dtype: Any = None, size: int | None = None, depth: int = 1,
                 rtol: float | None = None, atol: float | None = None, scale: float | None = None,
                 what: str = "value") -> None:
    """Assert elementwise closeness with a dtype-derived tolerance; the message names the worst entry."""
    a = _to_numpy(actual)
    e = _to_numpy(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{what}: shape {a.shape} != expected {e.shape}")
    dt = dtype if dtype is not None else getattr(actual, "dtype", np.asarray(actual).dtype)
    n = size if size is not None else max(1, a.size)
    sc = float(np.max(np.abs(e))) if scale is None and e.size else (scale or 1.0)
    tol = tolerance(dt, size=n, depth=depth, scale=max(sc, 1e-300), rtol=rtol, atol=atol)
    err = np.abs(a.astype(np.float64) - e.astype(np.float64))
    bound = tol.atol + tol.rtol * np.abs(e.astype(np.float64))
    bad = ~(err <= bound)
    if bad.any():
        i = np.unravel_index(int(np.argmax(np.where(bad, err - bound, -np.inf))), err.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {a.size} entries differ beyond tolerance "
            f"(rtol={tol.rtol:.3g}, atol={tol.atol:.3g}, {tol.dtype}); worst at {tuple(int(j) for j in i)}: "
            f"actual={a[i]!r} expected={e[i]!r} |diff|={err[i]:.3g}"
        )


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.numpy()
    return np.asarray(x)
