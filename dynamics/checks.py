"""The dynamics claims as one group (:data:`CLAIMS`): the checks of :mod:`dynamics.checks_norm` and
:mod:`dynamics.checks_angle`, in order, over one :class:`dynamics.context.Context` that memoizes the training runs,
so the six records describe the same trajectories (the two modes, default reproduction and one setting:
:class:`dynamics.context.DynamicsPlan`).  Every tolerance is round-off (:func:`rmsgauge.tolerance`) or a stated
statistical bound computed from the run itself (standard errors over independent replicas).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from dynamics.checks_angle import (
    check_angular_rate_scaling,
    check_equilibrium_angle,
    check_radial_gradient_during_training,
)
from dynamics.checks_norm import check_equilibrium_norm, check_norm_identity, check_trajectory_tracking
from dynamics.context import Context, DynamicsPlan
from dynamics.simulate import Progress
from rmsgauge import ClaimGroup, seed_everything


@contextmanager
def dynamics_context(plan: DynamicsPlan | None = None, *, seed: int | None = None, quick: bool = False,
                     progress: Progress | None = None) -> Iterator[list[dict[str, Context]]]:
    """One :class:`Context` for every check, seeded from ``plan.seed`` (``seed`` and ``quick`` override the
    plan's), on one torch thread: small tensors, where threads only add overhead on a shared machine."""
    plan = plan or DynamicsPlan()
    if quick:
        plan.quick = True
    if seed is not None:
        plan.seed = seed
    seed_everything(plan.seed)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield [{"ctx": Context(plan, progress)}]
    finally:
        torch.set_num_threads(prev_threads)


CLAIMS = ClaimGroup(context=dynamics_context, checks={
    "dynamics.norm_identity": check_norm_identity,
    "dynamics.trajectory_tracking": check_trajectory_tracking,
    "dynamics.equilibrium_norm": check_equilibrium_norm,
    "dynamics.equilibrium_angle": check_equilibrium_angle,
    "dynamics.angular_rate_scaling": check_angular_rate_scaling,
    "dynamics.radial_gradient_during_training": check_radial_gradient_during_training,
})
