"""The proof record: one function per identity, each returning a verdict and its residual."""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp


@dataclass(frozen=True)
class ProofResult:
    id: str  # the claim id this identity supports, e.g. "gauge.forward_invariance"
    statement: str  # the identity, in words or LaTeX
    holds: bool  # residual simplified to exactly zero (or the stated form)
    residual: str  # the simplified residual expression, as text
    dimension: str  # "symbolic n" or the concrete sizes used, and why

    def __str__(self) -> str:
        mark = "PROVED" if self.holds else "NOT PROVED"
        return f"[{mark}] {self.id}: {self.statement}\n    residual: {self.residual}\n    dimension: {self.dimension}"


def is_zero(expr: sp.Expr) -> bool:
    """True when ``expr`` simplifies to exactly 0 (sympy's ``simplify`` then ``equals`` as a fallback)."""
    s = sp.simplify(expr)
    return s == 0 or bool(s.equals(0))
