"""The benchmark, ``python -m lm.bench`` (the command: :mod:`lm.bench.__main__`): the GRT's speed and memory
against dense layers and models.

:mod:`~lm.bench.cases` times components, blocks, models and sampling in this process; :mod:`~lm.bench.trainer`
times whole runs of ``python -m lm.train``; :mod:`~lm.bench.step_profile` splits a training step's time by operator
category; :mod:`~lm.bench.report` turns the ratios into claim records against their targets, and the tables.
"""

from lm.bench.cases import BenchConfig, Row, flops_per_token, matched_dense, training_step
from lm.bench.report import TARGETS, claims_and_floors, format_table, targets_table
from lm.bench.step_profile import CATEGORIES, categorize, format_profiles, profile_shape
from lm.bench.trainer import (
           SHAPES,
           Setting,
           TrainerConfig,
           TrainerRow,
           format_trainer,
           model_configs,
           ratios,
           run_trainer,
)

__all__ = [
    "CATEGORIES", "SHAPES", "TARGETS", "BenchConfig", "Row", "Setting", "TrainerConfig", "TrainerRow", "categorize",
    "claims_and_floors", "flops_per_token", "format_profiles", "format_table", "format_trainer", "matched_dense",
    "model_configs", "profile_shape", "ratios", "run_trainer", "targets_table", "training_step",
]
