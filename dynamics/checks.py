r"""One function per dynamics claim, each returning a :class:`rmsgauge.Claim` measured in this run.

``run_all(plan)`` runs them in order over a shared :class:`Context` that memoizes the training runs, so
the six records describe the same trajectories.  Two modes:

* default reproduction (``plan.single`` is False): SGD with the source's decay on the real QK-norm
  ``W_q`` (float32, learning rate calibrated so the first step turns ``W_q`` by the source's 0.0025 rad)
  and on the float64 regression toy, plus the grids that the laws need (a wd sweep for the 4e-4 figure,
  the phase toy for exact fixed points and relaxation, the noise toy for each optimizer's equilibrium
  angle against Kosson et al. / Wan et al.);
* one setting (``plan.single``): every run uses that optimizer, decay, lr, wd, momentum, betas, steps and
  dtype, and every record reflects it.

Every tolerance comes from :func:`rmsgauge.tolerance` (round-off) or from a stated statistical bound
computed from the run itself (standard errors over independent replicas).
"""


from __future__ import annotations

from collections.abc import Callable

import torch

from dynamics.checks_angle import noise_angle_row, rate_row
from dynamics.checks_norm import phase_fixed_point, tracking
from dynamics.context import (
    SOURCE_ANGLES,
    SOURCE_SCALES,
    Context,
    Defaults,
    DynamicsPlan,
    equilibration_steps,
    identity_tolerance,
    predicted_noise_equilibrium,
)
from dynamics.simulate import Progress, stderr_progress
from rmsgauge import Claim, registered, seed_everything

# the order the records are printed in (the issue's); importing the two modules above registered them
CLAIM_ORDER = ("dynamics.norm_identity", "dynamics.trajectory_tracking", "dynamics.equilibrium_norm",
               "dynamics.equilibrium_angle", "dynamics.angular_rate_scaling",
               "dynamics.radial_gradient_during_training")


def ordered_specs() -> list:
    specs = {spec.id: spec for spec in registered("dynamics")}
    if set(specs) != set(CLAIM_ORDER):
        raise RuntimeError(f"dynamics checks registered {sorted(specs)} but CLAIM_ORDER lists {sorted(CLAIM_ORDER)}")
    return [specs[i] for i in CLAIM_ORDER]


CHECKS: tuple[Callable[[Context], Claim], ...] = tuple(spec.fn for spec in ordered_specs())


def run_all(plan: DynamicsPlan | None = None, *, quick: bool = False, seed: int | None = None,
            progress: Progress | None = stderr_progress) -> list[Claim]:
    """Run every dynamics check and return the claim records (in the issue's order)."""
    plan = plan or DynamicsPlan()
    if quick:
        plan.quick = True
    if seed is not None:
        plan.seed = seed
    seed_everything(plan.seed)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: threads only add overhead, and the machine is shared
    try:
        ctx = Context(plan, progress)
        claims = []
        for spec in ordered_specs():
            ctx.log(f"{spec.id} ...")
            claims.append(spec.fn(ctx))
        return claims
    finally:
        torch.set_num_threads(prev_threads)


__all__ = ["CHECKS", "CLAIM_ORDER", "SOURCE_ANGLES", "SOURCE_SCALES", "Context", "Defaults", "DynamicsPlan",
           "equilibration_steps", "identity_tolerance", "noise_angle_row", "phase_fixed_point",
           "predicted_noise_equilibrium", "rate_row", "run_all", "tracking"]
