"""Symbolic (sympy) proofs, one function per identity; ``python -m proofs`` runs them all.

Each module declares its proofs (``PROOFS``: name -> proof, in name order); :func:`run_proofs` runs them, for the
command line, the tests and the report.
"""

from proofs import dynamics_identities, gauge_identities, grt_identities
from proofs.core import ProofResult

PROOFS = {**dynamics_identities.PROOFS, **gauge_identities.PROOFS, **grt_identities.PROOFS}


def run_proofs(prefix: str = "") -> list[ProofResult]:
    """Run every proof whose name starts with ``prefix`` (e.g. ``"gauge."``), in :data:`PROOFS` order."""
    return [fn() for name, fn in PROOFS.items() if name.startswith(prefix)]


__all__ = ["PROOFS", "ProofResult", "run_proofs"]
