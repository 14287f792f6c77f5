"""The gauge census of any PyTorch model (:func:`census`, ``python -m gauge census``): which parameter tensors, and
which row/column blocks of them, are scale gauges.  :mod:`gauge.census.analysis` explains the method."""

from gauge.census.analysis import DEFAULT_SCALES, census
from gauge.census.engine import CensusError, batch_loss_fn
from gauge.census.norms import is_norm_module
from gauge.census.records import Block, CensusResult, EpsReport, TensorCensus, format_census

__all__ = [
    "DEFAULT_SCALES", "Block", "CensusError", "CensusResult", "EpsReport", "TensorCensus", "batch_loss_fn",
    "census", "format_census", "is_norm_module",
]
