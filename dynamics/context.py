"""What every dynamics check shares: the run plan, the defaults, the memoized training runs (:class:`Context`),
the identity tolerance and the laws' predictions the checks compare against."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import dynamics.adamw_window as aw
import dynamics.laws as laws
from dynamics.problems import NoiseToy, QKNormProblem, RegressionToy
from dynamics.simulate import OptimConfig, Progress, Trace, run
from rmsgauge import Claim, check_choice, check_range, tolerance
from rmsgauge.corpus import ByteCorpus

SOURCE_ANGLES = (0.0025, 0.010, 0.040)  # the source's per-step rotations at norm scales 1, 1/2, 1/4
SOURCE_SCALES = (1.0, 0.5, 0.25)
SOURCE_TRACKING = 4e-4  # "tracks this zero-radial prediction to a relative 4e-4"
SMALL_NOISE_N = 32  # noise toys below this size document finite-dimension effects (not in round-off verdicts)
SE_SIGMAS = 4.0  # statistical verdicts allow 4 standard errors (two-sided p ~ 6e-5 per check)
UNINFORMATIVE_TOL = 0.5  # a training-window row whose own allowance exceeds 50% is "not stationary", not a verdict


@dataclass
class DynamicsPlan:
    """What to run. ``single=False`` is the default reproduction; otherwise one setting for every record."""

    single: bool = False
    optimizer: str = "sgd"
    decay: str = "source"
    lr: float | None = None  # None: per problem (calibrated on the model, 0.1 on the toys; adamw 1e-3)
    wd: float = 0.02  # the source convention's d = 0.02 puts the (1-2wd) one-step error at wd^2 = 4e-4
    momentum: float = 0.9
    betas: tuple[float, float] = (0.9, 0.999)
    steps: int | None = None  # None: per problem (enough to reach equilibrium where it matters)
    seed: int = 0
    dtype: str | None = None  # None: float64 toys, float32 model (plus one run of each in the other dtype)
    quick: bool = False  # shorter runs and grids (for the report's quick mode)

    def __post_init__(self) -> None:
        """Every value checked once, here: a ``ValueError`` names it and its range."""
        self.cfg(OptimConfig.lr if self.lr is None else self.lr)  # the optimizer's checks (lr None: chosen per run)
        if self.steps is not None:
            check_range("steps", self.steps, 1)
        check_range("seed", self.seed, 0, 2**32 - 1)
        if self.dtype is not None:
            check_choice("dtype", self.dtype, ("float32", "float64"))
        if self.quick and self.single:
            raise ValueError("quick shortens the default reproduction; with one setting, give steps instead")

    def cfg(self, lr: float) -> OptimConfig:
        return OptimConfig(optimizer=self.optimizer, decay=self.decay, lr=lr, wd=self.wd, momentum=self.momentum,
                           betas=self.betas)

    def describe(self) -> str:
        if not self.single:
            return "default reproduction (SGD, source decay W <- W - lr g - wd W, wd=0.02) plus optimizer grids"
        lr = "per problem" if self.lr is None else f"{self.lr:g}"
        return (f"one setting: {self.optimizer}/{self.decay} lr={lr} wd={self.wd:g} momentum={self.momentum:g} "
                f"betas={self.betas} steps={self.steps or 'per problem'} dtype={self.dtype or 'per problem'} "
                f"seed={self.seed}")


@dataclass
class Defaults:
    """Sizes of the default reproduction (``quick`` halves the long ones)."""

    toy_lr: float = 0.1
    toy_steps: int = 600
    model_steps: int = 240  # lr calibrated to 0.0025 rad: the norm falls ~9x in ~110 steps, then equilibrates
    model64_steps: int = 12  # a short float64 model run for the radial gradient in both precisions
    sweep_wds: tuple[float, ...] = (1e-3, 3e-3, 1e-2, 2e-2, 5e-2)
    sweep_steps: int = 500
    phase_grid: tuple[tuple[str, float, float], ...] = (  # (decay, lr, wd) for the exact phase toy
        ("source", 0.1, 0.01), ("source", 0.2, 0.1), ("source", 1.0, 0.25), ("torch", 0.5, 0.1))
    noise_n: int = 256
    noise_replicas: int = 8
    measure_steps: int = 600  # stationary window per noise-toy run
    angle_grid: tuple[dict[str, Any], ...] = (
        {"optimizer": "sgd", "decay": "source", "lr": 0.1, "wd": 0.01},
        {"optimizer": "sgd", "decay": "source", "lr": 0.1, "wd": 0.2},
        {"optimizer": "sgd", "decay": "torch", "lr": 0.1, "wd": 0.1},
        {"optimizer": "sgdm", "decay": "source", "lr": 0.1, "wd": 0.01},
        {"optimizer": "sgdm", "decay": "source", "lr": 0.1, "wd": 0.2},
        {"optimizer": "sgdm", "decay": "torch", "lr": 0.1, "wd": 0.1},
        {"optimizer": "sgdm", "decay": "l2", "lr": 0.1, "wd": 0.1},
        {"optimizer": "adamw", "decay": "torch", "lr": 0.01, "wd": 0.5},  # d = 5e-3: relaxes in ~100 steps
        {"optimizer": "adamw", "decay": "source", "lr": 0.01, "wd": 0.01},
        {"optimizer": "adamw", "decay": "torch", "lr": 0.01, "wd": 0.5, "n": 4},  # finite dimension
    )


def identity_tolerance(dtype: str, group_size: int) -> float:
    """Relative round-off of one recorded step: the stored ``W_{t+1}`` (a few roundings in ``dtype``)
    plus the float64 reductions over ``group_size`` entries that form the norms."""
    return tolerance(dtype, depth=4).rtol + tolerance("float64", size=group_size, depth=4).rtol


class Context:
    """Memoized runs shared by the checks of one run of :data:`dynamics.checks.CLAIMS`."""

    def __init__(self, plan: DynamicsPlan, progress: Progress | None = None) -> None:
        self.plan = plan
        self.progress = progress or (lambda msg: None)
        self.defaults = Defaults()
        if plan.quick:
            d = self.defaults
            d.toy_steps, d.model_steps, d.sweep_steps, d.measure_steps = 300, 160, 400, 400
            d.sweep_wds = (1e-3, 1e-2, 2e-2, 5e-2)
            d.angle_grid = tuple(d.angle_grid[i] for i in (0, 3, 6, 7))
        self._cache: dict[Any, Any] = {}
        self.traces: list[Trace] = []  # every training run, for the radial-gradient record

    def memo(self, key: Any, build: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def corpus(self) -> ByteCorpus:
        return self.memo("corpus", ByteCorpus.load)

    def _run(self, problem, cfg: OptimConfig, steps: int, every: int = 0) -> Trace:
        t0 = time.perf_counter()
        tr = run(problem, cfg, steps, progress=self.progress, every=every)
        self.progress(f"  ... {steps} steps in {time.perf_counter() - t0:.1f} s")
        self.traces.append(tr)
        return tr

    def dtype_for(self, default: str) -> str:
        return self.plan.dtype or default

    def lr_for(self, problem_name: str) -> float | None:
        """Explicit --lr wins; otherwise the per-problem default (None: calibrate on the model)."""
        p = self.plan
        if p.lr is not None:
            return p.lr
        if p.optimizer == "adamw":
            return 1e-3 if problem_name != "noise" else 1e-2
        return None if problem_name == "qknorm" else self.defaults.toy_lr

    def main_cfg(self, lr: float) -> OptimConfig:
        if self.plan.single:
            return self.plan.cfg(lr)
        return OptimConfig(optimizer="sgd", decay="source", lr=lr, wd=0.02)

    def model_calibration(self) -> dict[str, Any]:
        """A fresh QK-norm model, one corpus batch, and the SGD lr that turns ``W_q`` by 0.0025 rad on it."""
        dtype = self.dtype_for("float32")

        def build() -> dict[str, Any]:
            prob = QKNormProblem(seed=self.plan.seed, dtype=dtype, corpus=self.corpus())
            xb, yb = prob.batch()
            W = prob.weight
            (g,) = torch.autograd.grad(prob.loss_on(xb, yb), W)
            cfg = self.main_cfg(1.0)
            lr = laws.calibrate_lr(SOURCE_ANGLES[0], float(g.double().norm()), float(W.detach().double().norm()), cfg.d)
            return {"problem": prob, "batch": (xb, yb), "lr": lr, "w0": W.detach().clone()}

        return self.memo(("calib", dtype), build)

    def model_trace(self, dtype: str | None = None, steps: int | None = None) -> Trace:
        dtype = dtype or self.dtype_for("float32")
        steps = steps or self.plan.steps or self.defaults.model_steps

        def build() -> Trace:
            lr = self.lr_for("qknorm")
            if lr is None:  # the main model's calibration, so every precision trains with the same lr
                lr = self.model_calibration()["lr"]
            cfg = self.main_cfg(lr)
            self.progress(f"training the QK-norm W_q ({dtype}, {cfg.label()}, {steps} steps)")
            prob = QKNormProblem(seed=self.plan.seed, dtype=dtype, corpus=self.corpus())
            return self._run(prob, cfg, steps, every=max(1, steps // 4))

        return self.memo(("model", dtype, steps), build)

    def toy_trace(self, dtype: str | None = None, wd: float | None = None, steps: int | None = None) -> Trace:
        dtype = dtype or self.dtype_for("float64")
        steps = steps or self.plan.steps or self.defaults.toy_steps

        def build() -> Trace:
            cfg = self.main_cfg(self.lr_for("regression"))
            if wd is not None:
                cfg = cfg.replace(wd=wd)
            self.progress(f"training the regression toy ({dtype}, {cfg.label()}, {steps} steps)")
            return self._run(RegressionToy(seed=self.plan.seed, dtype=dtype), cfg, steps)

        return self.memo(("toy", dtype, wd, steps), build)

    def noise_trace(self, cfg: OptimConfig, n: int | None = None, start_factor: float = 1.0
                    ) -> tuple[Trace, dict[str, Any]]:
        """Noise toy started at ``start_factor`` x the predicted equilibrium, run past equilibration."""
        n = n or self.defaults.noise_n
        R = self.defaults.noise_replicas if n >= SMALL_NOISE_N else 8 * self.defaults.noise_replicas  # small n: more
        dtype = self.dtype_for("float64")
        x_pred = predicted_noise_equilibrium(cfg, n)
        burn = equilibration_steps(cfg, start_factor)
        total = self.plan.steps or (burn + self.defaults.measure_steps)

        def build() -> tuple[Trace, dict[str, Any]]:
            self.progress(f"noise toy n={n} x{R} ({dtype}, {cfg.label()}, {total} steps, start {start_factor:g} x*)")
            prob = NoiseToy(n=n, replicas=R, seed=self.plan.seed, dtype=dtype, norm_sq=start_factor * x_pred)
            tr = self._run(prob, cfg, total)
            return tr, {"burn": min(burn, total // 2), "burn_needed": burn, "x_pred_start": x_pred, "n": n,
                        "replicas": R, "short": total < burn + 100}

        return self.memo(("noise", cfg.label(), n, start_factor, total, dtype), build)


def predicted_noise_equilibrium(cfg: OptimConfig, n: int) -> float:
    """Predicted squared norm for the noise toy (E G^2 = n - 1; Adam: nu = n)."""
    if cfg.optimizer == "adamw":
        return float(aw.fixed_point_adamw(cfg.lr, cfg.d, cfg.betas[0], n))
    if cfg.decay == "l2":
        return float(laws.fixed_point_l2(cfg.lr, cfg.wd, n - 1.0, cfg.mu))
    return float(laws.fixed_point_sgd(cfg.lr, cfg.d, n - 1.0, cfg.mu))


def equilibration_steps(cfg: OptimConfig, start_factor: float) -> int:
    """Burn-in: the decay from ``start_factor`` x*, 6 relaxation times, 5 momentum times, and for Adam up to 2
    more relaxation times for its second moment (started at x*, v-hat tracks g^2 from its first steps)."""
    d = cfg.d if cfg.decay != "l2" else cfg.lr * cfg.wd / (1.0 - cfg.mu)  # l2: effective decoupled decay
    tau = laws.relaxation_time(laws.relaxation_factor(d, cfg.optimizer))
    far = math.log(max(start_factor, 1.0)) / (-math.log((1.0 - d) ** 2)) if start_factor > 1 else 0.0
    mom = 1.0 / (1.0 - cfg.mu) if cfg.mu else 0.0
    second = min(1.0 / (1.0 - cfg.betas[1]), 2.0 * tau) if cfg.optimizer == "adamw" else 0.0
    return math.ceil(far + 6.0 * tau + 5.0 * mom + second)


def _fmt_cfg(tr: Trace) -> str:
    return f"{tr.problem_name}/{tr.dtype} {tr.cfg.label()}"


def _weights_note(traces: list[Trace]) -> dict[str, str]:
    out: dict[str, str] = {}
    for tr in traces:
        out.setdefault(f"{tr.problem_name}/{tr.dtype}", tr.problem)
    return out


def no_decay_claim(ctx: Context, claim_id: str, statement: str, stated: Any) -> Claim:
    """With wd = 0 there is no equilibrium: the norm only grows and the per-step angle falls (measured)."""
    traces = [ctx.toy_trace(), ctx.model_trace()]
    rows = {}
    for tr in traces:
        x = tr.traj
        rows[_fmt_cfg(tr)] = {"x_T/x_0": (x[-1] / x[0]).tolist(), "phi_first": float(tr.angle[0].mean()),
                              "phi_last": float(tr.angle[-1].mean()), "holds": bool((x[-1] >= x[0]).all())}
    return Claim(
        id=claim_id, statement=statement, stated=stated,
        measured={k: v["x_T/x_0"] for k, v in rows.items()}, tolerance=None,
        holds=all(r["holds"] for r in rows.values()), dtype=", ".join(sorted({t.dtype for t in traces}, reverse=True)),
        exact_law="wd = 0: no fixed point; SGD x_(t+1) = x_t + lr^2 G^2/x_t, so x_t^2 grows like 2 lr^2 G^2 t and the "
                  "per-step angle falls like 1/sqrt(t) (AdamW: x grows like lr^2 nu t)",
        source_status="approximate", details={"data": rows, "mode": ctx.plan.describe()})


