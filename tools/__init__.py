"""Maintenance scripts run from the repository root (``python -m tools.mutate``); nothing imports them."""
