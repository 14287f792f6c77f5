"""One run: draw the selected figures, gather the claims, write the report (the CLI is a thin layer on this)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import figures.gather as gather_mod
import figures.registry as registry
from figures.context import FigureContext
from figures.report import write_report
from rmsgauge import Claim, atomic_write_json, write_claims_json

CLAIMS_FILE = "claims.json"  # every record of the run (and the proofs): what --claims none reuses
RUN_FILE = "run.json"  # timings: the one output that differs between two identical runs


@dataclass
class RunResult:
    log: registry.RunLog
    claims: list[Claim] = field(default_factory=list)
    proofs: list[Any] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    reused_claims: bool = False


@dataclass(frozen=True)
class _StoredProof:
    """A proof read back from ``claims.json`` (same fields the report reads from ``proofs.ProofResult``)."""

    id: str
    statement: str
    holds: bool
    residual: str
    dimension: str


def _load_stored(out_dir: Path) -> tuple[list[Claim], list[Any], dict[str, str]] | None:
    """The records of an earlier run's ``claims.json``, and what that run left out (source -> why)."""
    p = out_dir / CLAIMS_FILE
    if not p.is_file():
        return None
    d = json.loads(p.read_text(encoding="utf-8"))
    claims = [Claim(**c) for c in d.get("claims", [])]
    proofs = [_StoredProof(**r) for r in d.get("proofs", [])]
    return claims, proofs, dict(d.get("missing", {}))


def run(names: list[str], ctx: FigureContext, *, claim_sources: tuple[str, ...] = gather_mod.ALL_SOURCES,
        report: bool = True, command: str = "python -m figures", claims: list[Claim] | None = None,
        proofs: list[Any] | None = None) -> RunResult:
    """Draw ``names`` into ``ctx.out_dir``; gather ``claim_sources`` (empty: reuse ``claims.json`` if present).

    ``claims`` / ``proofs`` given: report these records instead of gathering (``claim_sources`` is ignored).
    """
    t0 = time.perf_counter()
    out_dir = ctx.out_dir
    log = registry.generate(names, ctx)
    res = RunResult(log=log)
    given = claims is not None or proofs is not None
    if given or claim_sources:
        g = (gather_mod.Gathered(list(claims or []), list(proofs or []), sources=("given",)) if given
             else gather_mod.gather(claim_sources, quick=ctx.quick, seed=ctx.seed, log=registry.progress))
        res.proofs, res.missing = g.proofs, g.missing
        res.claims = gather_mod.link_figures(g.claims, {n: s.claims for n, s in registry.load_all().items()})
        write_claims_json(out_dir / CLAIMS_FILE, res.claims, sources=list(g.sources), missing=g.missing,
                          proofs=[_proof_json(p) for p in res.proofs])
    else:
        stored = _load_stored(out_dir)
        if stored is not None:
            res.claims, res.proofs, res.missing = stored  # a partial earlier run stays partial, and says so
            res.reused_claims = True
            registry.progress(f"claims: reused {len(res.claims)} records from {out_dir / CLAIMS_FILE}")
    if report:
        sidecars = registry.read_sidecars(out_dir)
        model = next((s["numbers"].get("provenance") for s in sidecars if s.get("trained")), None)
        meta = {"command": command, "missing": res.missing, "model": model,
                "figures_skipped": log.skipped, "figures_failed": log.failed}
        for p in write_report(out_dir, res.claims, res.proofs, sidecars, meta):
            registry.progress(f"wrote {p}")
    res.seconds = time.perf_counter() - t0
    atomic_write_json(out_dir / RUN_FILE, {
        "command": command, "seconds_total": res.seconds, "seconds_per_figure": log.seconds,
        "written": log.written, "skipped": log.skipped, "failed": list(log.failed),
    })
    return res


def _proof_json(p: Any) -> dict[str, Any]:
    return {"id": p.id, "statement": p.statement, "holds": bool(p.holds), "residual": str(p.residual),
            "dimension": str(p.dimension)}
