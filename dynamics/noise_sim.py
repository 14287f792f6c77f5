r"""Float64 simulations of the random-walk gauge model under any torch optimizer: the check of every monitor law.

:class:`dynamics.problems.NoiseToy`'s model with the gradient in closed form (the same vector, no graph): each gauge
group :math:`W_r` (a row of one ``(R, n)`` parameter, or its own ``(m, k)`` matrix for optimizers that couple a
matrix's entries: Muon, Adafactor) gets, every step,

.. math::  g_r = \frac{\xi_r - \langle\xi_r,\hat W_r\rangle\hat W_r}{\lVert W_r\rVert},\qquad \xi_r\sim\mathcal N(0,I),

tangent, of size :math:`G/\lVert W\rVert` with :math:`\mathbb E\,G^2 = n-1`, uncorrelated across steps.  The
optimizer's own ``step`` moves the weights, so the laws are checked against torch's implementations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from rmsgauge import check_range


@dataclass
class NoiseRun:
    """Per step and group (``(T+1, R)``: ``x`` the squared norms; ``(T, R)``: the rest), float64 numpy."""

    x: np.ndarray  # ||W_t||^2, t = 0..T
    ww: np.ndarray  # <W_t, W_{t+1}>
    uw: np.ndarray  # <u_t, W_t> with u_t = (q W_t - W_{t+1}) / lr_eff (q = 1 - decay, see noise_run)
    uu: np.ndarray  # ||u_t||^2
    n: int  # entries per group

    def mean_x(self) -> np.ndarray:
        """Replica-mean squared norm ``(T+1,)``."""
        return self.x.mean(axis=1)


def noise_run(make_opt: Callable[[list[torch.Tensor]], torch.optim.Optimizer], *, n: int, replicas: int,
              steps: int, x0: float, seed: int = 0, matrix: tuple[int, int] | None = None, decay: float = 0.0,
              q: float = 1.0, lr_eff: float = 1.0) -> NoiseRun:
    """Run ``make_opt(params)`` on the random-walk gauge model for ``steps`` steps from ``||W_r||^2 = x0``.

    Groups: ``replicas`` rows of one ``(replicas, n)`` parameter, or (``matrix=(m, k)``, ``n = m k``) one
    ``(m, k)`` parameter per replica.  ``decay``: a decoupled decay applied before the optimizer's step (SGD-W).
    ``q``, ``lr_eff``: how the update direction is read back, ``u_t = (q W_t - W_{t+1})/lr_eff``.
    """
    check_range("steps", steps, 1, None)
    check_range("x0", x0, 0.0, None, lo_open=True)
    gen = torch.Generator().manual_seed(seed)
    shape = (replicas, n) if matrix is None else (replicas, *matrix)
    if matrix is not None and matrix[0] * matrix[1] != n:
        raise ValueError(f"matrix {matrix} must hold n = {n} entries")
    w = torch.randn(shape, generator=gen, dtype=torch.float64)
    w *= (x0 / w.reshape(replicas, -1).pow(2).sum(-1)).sqrt().reshape((-1,) + (1,) * (len(shape) - 1))
    params = [torch.nn.Parameter(w)] if matrix is None else [torch.nn.Parameter(w[r].clone()) for r in range(replicas)]
    opt = make_opt(params)
    x = np.empty((steps + 1, replicas))
    ww, uw, uu = (np.empty((steps, replicas)) for _ in range(3))
    for t in range(steps):
        W = _flat(params, replicas)  # (R, n) float64 copy
        wn2 = W.pow(2).sum(-1, keepdim=True)
        xi = torch.randn(replicas, n, generator=gen, dtype=torch.float64)
        g = (xi - W * ((xi * W).sum(-1, keepdim=True) / wn2)) / wn2.sqrt()  # tangent, size G/||W||
        if matrix is None:
            params[0].grad = g
        else:
            for r, p in enumerate(params):
                p.grad = g[r].reshape(matrix)
        if decay:
            with torch.no_grad():
                for p in params:
                    p.mul_(1.0 - decay)
        opt.step()
        W1 = _flat(params, replicas)
        u = (q * W - W1) / lr_eff
        x[t] = wn2.squeeze(-1).numpy()
        ww[t] = (W * W1).sum(-1).numpy()
        uw[t] = (u * W).sum(-1).numpy()
        uu[t] = u.pow(2).sum(-1).numpy()
    x[steps] = _flat(params, replicas).pow(2).sum(-1).numpy()
    return NoiseRun(x=x, ww=ww, uw=uw, uu=uu, n=n)


def _flat(params: list[torch.Tensor], replicas: int) -> torch.Tensor:
    if len(params) == 1:
        return params[0].detach().reshape(replicas, -1).to(torch.float64, copy=True)
    return torch.stack([p.detach().reshape(-1) for p in params]).to(torch.float64)


def settle_step(x_mean: np.ndarray, x_star: float, band: float) -> int:
    """First step from which ``|x_mean/x* - 1| <= band`` holds to the end of the run (``len`` when never)."""
    out = np.nonzero(np.abs(np.asarray(x_mean) / x_star - 1.0) > band)[0]
    return int(out[-1]) + 1 if len(out) else 0


def tail_stats(values: np.ndarray, start: int) -> tuple[float, float]:
    """Mean over steps ``start..`` and replicas, and its standard error from the replica means (independent)."""
    per_rep = np.asarray(values)[start:].mean(axis=0)  # (R,)
    return float(per_rep.mean()), float(per_rep.std(ddof=1) / np.sqrt(len(per_rep)))
