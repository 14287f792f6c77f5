"""Maintenance scripts run from the repository root (``python -m tools.mutate``); nothing imports them."""

import rmsgauge  # noqa: F401  (first: a Ctrl-C while this command imports is one line, rmsgauge.interrupt)
