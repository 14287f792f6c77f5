"""Symbolic (sympy) proofs, one function per identity; ``python -m proofs`` runs them all.

Each module registers its proofs with :func:`proofs.core.proof`; ``run_all`` returns
their results. Importable by tests and by the report.
"""

from proofs import dynamics_identities, gauge_identities, grt_identities  # noqa: F401  (registers proofs)
from proofs.core import PROOFS, ProofResult, is_zero, proof


def run_all(prefix: str = "") -> list[ProofResult]:
    """Run every registered proof whose name starts with ``prefix`` (e.g. ``"gauge."``)."""
    return [fn() for name, fn in sorted(PROOFS.items()) if name.startswith(prefix)]


__all__ = ["PROOFS", "ProofResult", "is_zero", "proof", "run_all"]
