"""gauge: the RMSNorm scale gauge, verified on a real model and real data (``python gauge.py``).

A weight whose output feeds an RMSNorm (here: the query/key projections of a QK-norm transformer) has a scale the
loss cannot see.  ``CLAIMS`` measures each claim of the source text as a :class:`rmsgauge.Claim`;
``gauge.census.census`` finds the gauges of any PyTorch model (``python -m gauge census``).
"""

from gauge.checks import (
    CLAIMS,
    check_epsilon_breaking,
    check_euler_radial_gradient,
    check_forward_invariance,
    check_jacobian_null_space,
)
from gauge.laws import (
    break_scales,
    eps_ratio_minus_one,
    eps_ratio_minus_one_leading,
    predicted_deviation,
    predicted_radial_eps,
)
from gauge.measure import q_norm_output
from gauge.model import GaugeConfig, build_setup, scaled
from gauge.scope import census_table, check_census, check_per_row_scaling, predicted_gauges

__all__ = [
    "CLAIMS", "GaugeConfig", "break_scales", "build_setup", "census_table", "check_census", "check_epsilon_breaking",
    "check_euler_radial_gradient", "check_forward_invariance", "check_jacobian_null_space", "check_per_row_scaling",
    "eps_ratio_minus_one", "eps_ratio_minus_one_leading", "predicted_deviation", "predicted_gauges",
    "predicted_radial_eps", "q_norm_output", "scaled",
]
