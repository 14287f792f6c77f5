r"""The GRT's structural claims, each measured with its margin: ``run_all() -> list[Claim]``.

Used by ``python -m grt_model --claims`` and the report.  Every number in
``measured`` is computed in the run; ``stated`` is the source text's value
(``../shared/seeds/001_cfb910613b442095.txt``).  Verification runs in float64
(``grt.model_trains`` in float32, where the model trains).  The property tests in
``tests/test_grt_*.py`` check the same properties over Hypothesis-drawn inputs;
this module measures one representative instance of each at the reference widths
where affordable.

The claims live in :mod:`grt_model.claims_geometry` and :mod:`grt_model.claims_model` (imported here, in that
order: the registry's order is the report's), their helpers in :mod:`grt_model.claim_tools`.

Finite-difference tolerance (gradcheck): central differences with step
:math:`h = \varepsilon^{1/3}` have truncation :math:`O(h^2)` plus round-off
:math:`O(\varepsilon/h)`, both :math:`O(\varepsilon^{2/3})`; :func:`fd_tolerance` is
:func:`rmsgauge.tolerance` with the safety factor scaled by :math:`\varepsilon^{-1/3}`
so its rtol is :math:`16\,\varepsilon^{2/3}\sqrt{\text{size}\cdot\text{depth}}`.
"""

from __future__ import annotations

from collections.abc import Callable

import grt_model.claims_geometry
import grt_model.claims_model  # noqa: F401  (then the model and wiring claims)
from rmsgauge import Claim, seed_everything
from rmsgauge.claims import select


def _failed(spec_id: str, e: BaseException) -> Claim:
    """A check that raised: FAILS with the error in one line (a broken check must not hide as a traceback)."""
    return Claim(id=spec_id, statement="(the check raised before measuring)", stated=None, measured=None,
                 tolerance=None, holds=False, dtype=None, source_status="not_a_source_claim",
                 details={"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})


CLAIM_IDS = tuple(spec.id for spec in select("grt"))  # from the registry, in source order


def run_all(seed: int = 0, only: tuple[str, ...] | None = None, progress: Callable[[str], None] | None = None
            ) -> list[Claim]:
    """Measure every GRT claim (or those in ``only``); each starts from ``seed``. One thread is up to the caller.

    A check that raises becomes a FAILS record naming the error (``details["error"]``), never a traceback."""
    out = []
    for spec in select("grt", only):
        if progress is not None:
            progress(spec.id)
        seed_everything(seed)
        try:
            out.append(spec.fn())
        except Exception as e:
            out.append(_failed(spec.id, e))
    return out
