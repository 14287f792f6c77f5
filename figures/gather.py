"""Gather the claim records by calling each package's checks (never by parsing printed text).

Sources, in report order:

=========  ======================  =====================================
name       call                    gives
=========  ======================  =====================================
gauge      ``gauge.checks.run_all``        ``list[Claim]`` (first text)
dynamics   ``dynamics.checks.run_all``     ``list[Claim]`` (first text)
grt        ``grt_model.claims.run_all``    ``list[Claim]`` (GRT text)
studies    ``studies.experiments_report``  ``list[Claim]`` (trained GRT, grid)
proofs     ``proofs.run_all``              ``list[ProofResult]`` (sympy)
=========  ======================  =====================================

A source whose module is not importable in this checkout is reported as missing
(with the reason) rather than failing the whole report, and so is a source the run
did not ask for (a partial report says what it left out).  ``run_all`` functions
are called with the keyword options they declare among ``quick``, ``seed`` and
``progress`` (a callable taking one message).
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rmsgauge import Claim

CLAIM_SOURCES: dict[str, tuple[str, str]] = {
    "gauge": ("gauge.checks", "run_all"),
    "dynamics": ("dynamics.checks", "run_all"),
    "grt": ("grt_model.claims", "run_all"),
    # committed records, no compute: the experiment grid's verdicts and the trained-model claims of the shipped
    # GRT and the text-shape GRT (studies.experiments, studies.trained)
    "studies": ("studies.experiments_report", "run_all"),
}
ALL_SOURCES = (*CLAIM_SOURCES, "proofs")


@dataclass
class Gathered:
    claims: list[Claim] = field(default_factory=list)
    proofs: list[Any] = field(default_factory=list)  # proofs.ProofResult
    missing: dict[str, str] = field(default_factory=dict)  # source -> why it is absent
    seconds: dict[str, float] = field(default_factory=dict)
    sources: tuple[str, ...] = ()


def _call(fn: Callable[..., Any], **options: Any) -> Any:
    params = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in options.items() if k in params})


def _load(module: str, attr: str) -> Callable[..., Any]:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise LookupError(f"{module} is not in this checkout ({e.name} not found)") from None
    fn = getattr(mod, attr, None)
    if fn is None:
        raise LookupError(f"{module}.{attr} does not exist")
    return fn


def gather(sources: tuple[str, ...] = ALL_SOURCES, *, quick: bool = False, seed: int = 0,
           log: Callable[[str], None] = print) -> Gathered:
    """Run each source's checks and collect their records (ids must be unique across sources)."""
    unknown = [s for s in sources if s not in ALL_SOURCES]
    if unknown:
        raise ValueError(f"unknown claim source(s) {unknown}; allowed: {', '.join(ALL_SOURCES)}")
    g = Gathered(sources=tuple(sources))
    asked = f"not asked for (--claims {','.join(sources)})"
    g.missing.update({src: asked for src in ALL_SOURCES if src not in sources})
    for src in sources:
        t0 = time.perf_counter()
        module, attr = CLAIM_SOURCES.get(src, ("proofs", "run_all"))
        try:
            fn = _load(module, attr)
        except LookupError as e:
            g.missing[src] = str(e)
            log(f"claims: {src} missing: {e}")
            continue
        log(f"claims: running {module}.{attr}() ...")
        records = list(_call(fn, quick=quick, seed=seed, progress=lambda m, s=src: log(f"  {s}: {m}")))
        if src == "proofs":
            g.proofs.extend(records)
        else:
            bad = [type(r).__name__ for r in records if not isinstance(r, Claim)]
            if bad:
                raise TypeError(f"{module}.{attr} must return rmsgauge.Claim records, got {sorted(set(bad))}")
            g.claims.extend(records)
        g.seconds[src] = time.perf_counter() - t0
        log(f"claims: {src}: {len(records)} records in {g.seconds[src]:.1f} s")
    seen: set[tuple[str, str]] = set()
    for c in g.claims:  # one record per (id, dtype): gauge measures each claim in float64 and float32
        if (c.id, c.dtype) in seen:
            raise ValueError(f"claim {c.id!r} ({c.dtype}) emitted twice; (id, dtype) must be unique across packages")
        seen.add((c.id, c.dtype))
    return g


def link_figures(claims: list[Claim], figure_claims: dict[str, tuple[str, ...]]) -> list[Claim]:
    """Copies of ``claims`` with ``figure`` set to the figure named after the claim, else the first that lists it."""
    first: dict[str, str] = {cid: cid for ids in figure_claims.values() for cid in ids if cid in figure_claims}
    for name, ids in figure_claims.items():
        for cid in ids:
            first.setdefault(cid, name)
    return [replace(c, figure=first.get(c.id, c.figure)) for c in claims]
