"""The gauge text's third command: ``python test_rmsgauge.py`` runs the first text's property tests.

"the invariance, the zero radial gradient, the norm dynamics, the equilibrium, and the effective-rate growth
as tests": ``tests/test_gauge.py``, ``tests/test_dynamics.py`` and their sympy proofs
(``tests/test_proofs_gauge.py``, ``tests/test_proofs_dynamics.py``), through pytest.  Extra flags pass
through to pytest (``python test_rmsgauge.py -k euler -x``); the exit status is pytest's.  No logic here.
"""

import sys
from pathlib import Path

import pytest

TESTS = ("test_gauge.py", "test_dynamics.py", "test_proofs_gauge.py", "test_proofs_dynamics.py")

if __name__ == "__main__":
    here = Path(__file__).resolve().parent / "tests"
    raise SystemExit(pytest.main([*(str(here / t) for t in TESTS), *sys.argv[1:]]))
