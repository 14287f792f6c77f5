"""python -m studies.train: the training command of :mod:`lm.train` with the equilibrium monitor attached.

The same flags, run folders, checkpoints and resume as ``python -m lm.train``; every run also gets
:func:`monitor_hooks` (``equilibrium`` log records; the summary's ``lm.gauge_census`` and
``lm.rotational_equilibrium_angle`` claims).  The monitor and the census sit above ``lm``, so the command that
attaches them lives above them.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import nn

from dynamics.train_hook import TrainHook
from gauge.census import census
from lm.hooks import LoopInfo
from lm.train import main as lm_train_main
from lm.trainconfig import TrainConfig


def monitor_hooks(cfg: TrainConfig) -> list:
    """The equilibrium monitor of :mod:`dynamics.monitor` on the gauges :func:`gauge.census.census` finds on the
    loop's probe batch, recording norm and angle every ``cfg.gauge_interval`` steps; none when ``gauge_interval``
    is 0 or ``probe_gauges`` false."""
    if not (cfg.probe_gauges and cfg.gauge_interval > 0):
        return []
    # one group per tensor (a union of gauges is a gauge): the log stays one record per gauge weight
    return [TrainHook.lazy(census_of_probe_batch, interval=cfg.gauge_interval, per_block=False)]


def census_of_probe_batch(model: nn.Module, info: LoopInfo) -> Any:
    """The gauge census of ``model`` on the loop's fixed probe batch (a float64 CPU copy: the model and the global
    RNG are untouched, so the run is the same with or without it).  The eps report is skipped: the monitor needs
    only which tensors are gauges."""
    return census(model, batch=info.probe_batch(), own_eps=False, seed=info.train_config.seed)


def main(argv: list[str] | None = None) -> int:
    return lm_train_main(argv, hooks_for=monitor_hooks, prog="python -m studies.train")


if __name__ == "__main__":
    sys.exit(main())
