"""The GRT text's trained-model claims (``python -m studies.trained``): the claims in :mod:`studies.trained.claims`,
the measurements they share in :mod:`studies.trained.measure`."""

from studies.trained.claims import CLAIMS, STATED_GATES_BLOCK0, STATED_RING_RADIUS, trained_vs_dense_claim

__all__ = ["CLAIMS", "STATED_GATES_BLOCK0", "STATED_RING_RADIUS", "trained_vs_dense_claim"]
