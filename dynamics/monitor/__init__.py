"""The equilibrium monitor: the effective learning rate and the norm of every gauge group, against the laws.

:class:`EquilibriumMonitor` (``equilibrium``) records from the optimizer's step hooks; the gauge groups it watches
(``groups``, shared with :mod:`dynamics.rotational`), the law it applies at a step (``law``), its words and table
(``table``), its log and TensorBoard scalars (``log``) and its figure (``plot``, matplotlib imported on first use).
"""

from dynamics.monitor.equilibrium import EquilibriumLagWarning, EquilibriumMonitor
from dynamics.monitor.groups import GaugeGroup, describe_gauges, gauge_groups, group_spec, is_empty, spec_groups
from dynamics.monitor.log import (
    EquilibriumLogWarning,
    append_lines,
    read_records,
    record_scalars,
    scalar_name,
    tensorboard_writer,
)
from dynamics.monitor.table import DEFAULT_BAND, short_names

__all__ = [
    "DEFAULT_BAND", "EquilibriumLagWarning", "EquilibriumLogWarning", "EquilibriumMonitor", "GaugeGroup",
    "append_lines", "describe_gauges", "gauge_groups", "group_spec", "is_empty", "read_records", "record_scalars",
    "scalar_name", "short_names", "spec_groups", "tensorboard_writer",
]
