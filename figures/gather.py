"""Gather the claim records by running each package's ``CLAIMS`` group (:func:`rmsgauge.run_claims`, with the
run's seed, quick and progress; ``studies`` reads its committed records) and the sympy proofs
(:func:`proofs.run_proofs`), never by parsing printed text.

A source whose module is not importable in this checkout, or that the run did not ask for, is reported as missing
with the reason (a partial report says what it left out) instead of failing the report.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rmsgauge import Claim, run_claims

CLAIM_SOURCES: dict[str, str] = {"gauge": "gauge.checks", "dynamics": "dynamics.checks", "grt": "grt_model.claims",
                                 "studies": "studies.experiments_report"}
ALL_SOURCES = (*CLAIM_SOURCES, "proofs")


@dataclass
class Gathered:
    claims: list[Claim] = field(default_factory=list)
    proofs: list[Any] = field(default_factory=list)  # proofs.ProofResult
    missing: dict[str, str] = field(default_factory=dict)  # source -> why it is absent
    sources: tuple[str, ...] = ()


def gather(sources: tuple[str, ...] = ALL_SOURCES, *, quick: bool = False, seed: int = 0,
           log: Callable[[str], None] = print) -> Gathered:
    """Run each source's claims and collect their records (ids must be unique across sources)."""
    unknown = [s for s in sources if s not in ALL_SOURCES]
    if unknown:
        raise ValueError(f"unknown claim source(s) {unknown}; allowed: {', '.join(ALL_SOURCES)}")
    g = Gathered(sources=tuple(sources))
    asked = f"not asked for (--claims {','.join(sources)})"
    g.missing.update({src: asked for src in ALL_SOURCES if src not in sources})
    for src in sources:
        t0 = time.perf_counter()
        module = CLAIM_SOURCES.get(src, "proofs")
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            g.missing[src] = f"{module} is not in this checkout ({e.name} not found)"
            log(f"claims: {src} missing: {g.missing[src]}")
            continue
        log(f"claims: running {module} ...")
        if src == "proofs":
            records = mod.run_proofs()
            g.proofs.extend(records)
        else:
            records = run_claims(mod.CLAIMS, quick=quick, seed=seed, progress=lambda m, s=src: log(f"  {s}: {m}"))
            g.claims.extend(records)
        log(f"claims: {src}: {len(records)} records in {time.perf_counter() - t0:.1f} s")
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
