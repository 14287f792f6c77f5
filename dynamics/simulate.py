r"""Training loops that record, at every step, what the norm laws need.

:class:`Stepper` runs each rule with torch's own optimizer: ``torch.optim.SGD`` (its ``weight_decay`` is the coupled
``l2`` convention, identical to ``torch`` for plain SGD), ``torch.optim.AdamW`` (``source``: ``weight_decay=wd/lr``),
and for a decoupled decay torch lacks (SGD/SGD-momentum ``source``, SGD-momentum ``torch``, i.e. SGD-W) a
``W.mul_(1 - d)`` before the step.  The decay comes before the step and the gradient is taken at the undecayed
``W_t``, as in ``torch.optim.AdamW``, so every rule is :math:`W_{t+1} = qW_t - \eta u_t`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

import dynamics.laws as laws
from dynamics.problems import GaugeProblem
from rmsgauge import check_choice, check_range


@dataclass
class OptimConfig:
    optimizer: str = "sgd"  # sgd | sgdm | adamw
    decay: str = "source"  # source: W <- W - lr g - wd W; torch: decay lr*wd per step; l2: coupled (sgd/sgdm)
    lr: float = 0.1
    wd: float = 0.02  # source convention: d = wd = 0.02 puts the (1-2wd) form's one-step error at wd^2 = 4e-4
    momentum: float = 0.9  # sgdm only
    betas: tuple[float, float] = (0.9, 0.999)  # adamw only (torch defaults)
    eps: float = 1e-8  # adamw only (torch default)

    def __post_init__(self) -> None:
        check_choice("optimizer", self.optimizer, laws.OPTIMIZERS)
        check_choice("decay", self.decay, laws.DECAYS)
        check_range("lr", self.lr, 0.0, None, lo_open=True)
        check_range("wd", self.wd, 0.0, 1.0, hi_open=True)
        check_range("momentum", self.momentum, 0.0, 1.0, hi_open=True)
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        check_range("betas[0]", self.betas[0], 0.0, 1.0, hi_open=True)
        check_range("betas[1]", self.betas[1], 0.0, 1.0, hi_open=True)
        if self.optimizer == "adamw" and self.decay == "l2":
            raise ValueError("decay 'l2' applies to sgd/sgdm only (torch.optim.SGD's coupled weight_decay); "
                             "AdamW's decay is decoupled by definition: use 'source' or 'torch'")
        if self.decay == "torch" and self.lr * self.wd >= 1.0:
            raise ValueError(f"torch convention needs lr*wd < 1 (per-step decay), got lr*wd = {self.lr * self.wd:g}")

    @property
    def d(self) -> float:
        """Decoupled per-step decay (0 for coupled l2 with momentum; plain SGD's l2 is the torch rule)."""
        if self.decay == "l2" and self.optimizer == "sgd":
            return self.lr * self.wd  # W - lr (g + wd W) = (1 - lr wd) W - lr g: identical to decoupled lr*wd
        return laws.decoupled_decay(self.lr, self.wd, self.decay)

    @property
    def q(self) -> float:
        return 1.0 - self.d

    @property
    def mu(self) -> float:
        return laws.momentum_of(self.optimizer, self.momentum, self.betas)

    def label(self) -> str:
        b1, b2 = self.betas
        extra = {"sgd": "", "sgdm": f", mu={self.momentum:g}", "adamw": f", betas=({b1:g},{b2:g})"}
        return f"{self.optimizer}/{self.decay} lr={self.lr:g} wd={self.wd:g}{extra[self.optimizer]}"

    def replace(self, **kw: Any) -> OptimConfig:
        return OptimConfig(**{**asdict(self), **kw})


class Stepper:
    """One optimizer step with the convention's decay, and the update direction ``u`` it applied."""

    def __init__(self, param: torch.Tensor, cfg: OptimConfig) -> None:
        self.p, self.cfg = param, cfg
        self.manual_decay = 0.0  # multiplicative decay we apply before torch's step
        if cfg.optimizer == "adamw":
            wd = cfg.wd / cfg.lr if cfg.decay == "source" else cfg.wd
            self.opt = torch.optim.AdamW([param], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=wd)
            return
        # torch.optim.SGD's weight_decay is the coupled l2 rule, which for plain SGD is torch's decoupled lr*wd too
        coupled = cfg.decay == "l2" or (cfg.optimizer == "sgd" and cfg.decay == "torch")
        self.manual_decay = 0.0 if coupled else cfg.d
        self.opt = torch.optim.SGD([param], lr=cfg.lr, momentum=cfg.momentum if cfg.optimizer == "sgdm" else 0.0,
                                   weight_decay=cfg.wd if coupled else 0.0)

    def step(self) -> None:
        if self.manual_decay:
            with torch.no_grad():
                self.p.mul_(1.0 - self.manual_decay)
        self.opt.step()

    def update_direction(self) -> torch.Tensor:
        """``u_t`` (float64) with ``W_{t+1} = q W_t - lr u_t``, read back from the optimizer's state."""
        cfg, p = self.cfg, self.p
        if cfg.optimizer == "sgd":
            return p.grad.detach().double()
        st = self.opt.state[p]
        if cfg.optimizer == "sgdm":
            return st["momentum_buffer"].detach().double()
        return st["exp_avg"].detach().double() / (1.0 - cfg.betas[0] ** float(st["step"])) / self._adam_denom()

    def _adam_denom(self) -> torch.Tensor:
        st = self.opt.state[self.p]
        t = float(st["step"])
        return st["exp_avg_sq"].detach().double().sqrt() / math.sqrt(1.0 - self.cfg.betas[1] ** t) + self.cfg.eps

    def adam_nu(self) -> float:
        """:math:`\\lVert g/(\\sqrt{\\hat v}+\\epsilon)\\rVert^2` at the current step (AdamW only)."""
        return float((self.p.grad.detach().double() / self._adam_denom()).pow(2).sum())


@dataclass
class Trace:
    """Per-step, per-gauge-group records of one run (numpy float64, shape ``(T, R)`` unless noted)."""

    problem: str  # problem.describe()
    problem_name: str
    dtype: str
    cfg: OptimConfig
    group_size: int
    x: np.ndarray  # ||W_t||^2
    x_next: np.ndarray  # ||W_{t+1}||^2
    g2: np.ndarray  # ||g_t||^2
    gw: np.ndarray  # <g_t, W_t>
    u2: np.ndarray  # ||u_t||^2
    uw: np.ndarray  # <u_t, W_t>
    ww: np.ndarray  # <W_t, W_{t+1}>
    angle: np.ndarray  # per-step angle between W_t and W_{t+1} (radians)
    loss: np.ndarray  # (T,)
    nu: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (T,) Adam's ||g/sqrt(v)||^2, whole weight

    @property
    def steps(self) -> int:
        return self.x.shape[0]

    @property
    def traj(self) -> np.ndarray:
        """``(T+1, R)`` squared norms ``x_0 .. x_T``."""
        return np.concatenate([self.x, self.x_next[-1:]], axis=0)

    @property
    def G2(self) -> np.ndarray:
        """Squared gradient norm at unit weight norm, per step and group: ``||g||^2 ||W||^2``."""
        return self.g2 * self.x

    def radial_relative(self) -> np.ndarray:
        return np.abs(self.gw) / np.sqrt(self.g2 * self.x)

    def window(self, frac: float = 0.5) -> slice:
        """The last ``frac`` of the run (the stationary window once the run is past equilibration)."""
        return slice(int(self.steps * (1.0 - frac)), self.steps)

    def identity_residuals(self) -> dict[str, np.ndarray]:
        """Relative residuals of the exact identity, its zero-radial form and the source's first-order form."""
        c = self.cfg
        forms = {"exact": laws.norm_step(self.x, self.u2, c.lr, c.d, self.uw),
                 "zero_radial": laws.norm_step(self.x, self.u2, c.lr, c.d),
                 "first_order": laws.norm_step_first_order(self.x, self.u2, c.lr, c.d)}
        return {k: np.abs(self.x_next - v) / self.x_next for k, v in forms.items()}


Progress = Callable[[str], None]


def stderr_progress(msg: str) -> None:
    print(f"[dynamics] {msg}", file=sys.stderr, flush=True)


def run(problem: GaugeProblem, cfg: OptimConfig, steps: int, *, progress: Progress | None = None,
        every: int = 0) -> Trace:
    """Train ``problem.weight`` for ``steps`` steps with ``cfg`` and record every step."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    W = problem.weight
    stepper = Stepper(W, cfg)
    R = problem.groups(W).shape[0]
    gram = torch.empty(steps, R, 4, 4, dtype=torch.float64)  # inner products of (W_t, W_{t+1}, g_t, u_t)
    ang = torch.empty(steps, R, dtype=torch.float64)
    losses = torch.empty(steps, dtype=torch.float64)
    nus = torch.empty(steps if cfg.optimizer == "adamw" else 0, dtype=torch.float64)
    for t in range(steps):
        loss = problem.loss(t)
        (g,) = torch.autograd.grad(loss, W)
        W.grad = g
        w_old = W.detach().to(torch.float64, copy=True)  # a copy: the step mutates W in place (lossless cast)
        stepper.step()
        w_new = W.detach().double()
        u = stepper.update_direction()
        stack = torch.stack([problem.groups(w_old), problem.groups(w_new), problem.groups(g.detach().double()),
                             problem.groups(u)])  # (4, R, m)
        gram[t] = torch.einsum("irm,jrm->rij", stack, stack)
        ang[t] = angle_between(stack[0], stack[1])
        losses[t] = float(loss.detach())
        if cfg.optimizer == "adamw":
            nus[t] = stepper.adam_nu()
        if progress and every and (t + 1) % every == 0:
            progress(f"  {problem.name} {cfg.label()}: step {t + 1}/{steps}, loss {float(loss.detach()):.4g}")
    G = gram.numpy()
    return Trace(problem=problem.describe(), problem_name=problem.name, dtype=problem.dtype, cfg=cfg,
                 group_size=problem.groups(W).shape[1], x=G[:, :, 0, 0].copy(), x_next=G[:, :, 1, 1].copy(),
                 g2=G[:, :, 2, 2].copy(), gw=G[:, :, 0, 2].copy(), u2=G[:, :, 3, 3].copy(), uw=G[:, :, 0, 3].copy(),
                 ww=G[:, :, 0, 1].copy(), angle=ang.numpy(), loss=losses.numpy(), nu=nus.numpy())


def angle_between(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    r"""Angle between rows, :math:`2\operatorname{atan2}(\lVert\hat a-\hat b\rVert, \lVert\hat a+\hat b\rVert)`.

    Kahan's form: accurate for tiny angles, where :math:`\arccos` of a cosine near 1 loses half the digits.
    """
    a = a / a.norm(dim=-1, keepdim=True)
    b = b / b.norm(dim=-1, keepdim=True)
    return 2.0 * torch.atan2((a - b).norm(dim=-1), (a + b).norm(dim=-1))
