"""The claim record: one small type shared by every package that checks a claim.

A record says what the source text claims (``statement``, ``stated``), what this
run measured (``measured``), the tolerance the verdict used and the verdict
(``holds``).  Where the source is imprecise, ``source_status`` says so
(``exact`` / ``approximate`` / ``wrong`` / ``unstated``) and ``exact_law`` states
the law we verified instead.  The report gathers these records by calling each
package's checks, never by parsing printed text.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rmsgauge.atomic import atomic_write_json, json_safe

SOURCE_STATUSES = ("exact", "approximate", "wrong", "unstated", "not_a_source_claim")


@dataclass
class Claim:
    id: str  # "<package>.<snake_case>", e.g. "gauge.forward_invariance"
    statement: str  # the source's claim, in its own words where possible
    stated: Any  # the source's value (number or text); None where the source gives none
    measured: Any  # our value from this run (number, or a small dict of numbers)
    tolerance: float | None  # the threshold the verdict used (None for qualitative verdicts)
    holds: bool  # the verdict
    dtype: str = "float64"  # precision the measurement ran in
    exact_law: str = ""  # the law we state where the source's is loose
    source_status: str = "exact"  # is the source's statement exact, approximate, wrong?
    details: dict[str, Any] = field(default_factory=dict)  # supporting measurements
    figure: str | None = None  # figure file stem (same as the id) once figures/ draws it

    def __post_init__(self) -> None:
        pkg, _, name = self.id.partition(".")
        if not pkg or not name or not name.replace("_", "").isalnum():
            raise ValueError(f"claim id must be '<package>.<snake_case>', got {self.id!r}")
        if self.source_status not in SOURCE_STATUSES:
            raise ValueError(f"source_status must be one of {SOURCE_STATUSES}, got {self.source_status!r}")
        self.holds = bool(self.holds)

    @property
    def test_name(self) -> str:
        return "test_" + self.id.partition(".")[2]

    def to_json(self) -> dict[str, Any]:
        return json_safe(asdict(self))


@dataclass(frozen=True)
class ClaimSpec:
    """One registered check: the claim id it measures, the group a CLI runs it in, and the function."""

    id: str
    group: str  # e.g. "gauge", "dynamics", "grt", "grt.trained": what one CLI run gathers
    fn: Callable[..., Claim | list[Claim]]
    title: str = ""


CLAIMS: dict[str, ClaimSpec] = {}  # filled at import time by @claim, like proofs' @proof and figures' @figure


def claim(id: str, *, group: str | None = None, title: str = "") -> Callable:
    """Register a check function under its claim id (``@claim("gauge.forward_invariance")``).

    The function returns the :class:`Claim` record(s) it measured (one per dtype where it runs in
    several); its arguments are the group's context (the CLI decides what to pass).  Ids are unique:
    registering one twice is an error that names both functions.
    """
    pkg, _, name = id.partition(".")
    if not pkg or not name or not name.replace("_", "").isalnum():
        raise ValueError(f"claim id must be '<package>.<snake_case>', got {id!r}")

    def register(fn: Callable[..., Claim | list[Claim]]) -> Callable[..., Claim | list[Claim]]:
        old = CLAIMS.get(id)
        if old is not None and (old.fn.__module__, old.fn.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"claim id {id!r} registered twice: {old.fn.__module__}.{old.fn.__qualname__} and "
                             f"{fn.__module__}.{fn.__qualname__}; ids name one check each")
        CLAIMS[id] = ClaimSpec(id, group or pkg, fn, title)
        return fn

    return register


def registered(group: str) -> list[ClaimSpec]:
    """The checks of one group, in registration (= source) order."""
    return [s for s in CLAIMS.values() if s.group == group]


def run_group(group: str, *args: Any, **kwargs: Any) -> list[Claim]:
    """Run every check of ``group`` with the same arguments; flatten their records."""
    out: list[Claim] = []
    for spec in registered(group):
        res = spec.fn(*args, **kwargs)
        out.extend(res if isinstance(res, list) else [res])
    return out


def claims_to_json(claims: list[Claim], **meta: Any) -> dict[str, Any]:
    return {**{k: json_safe(v) for k, v in meta.items()}, "claims": [c.to_json() for c in claims]}


def write_claims_json(path: str | os.PathLike, claims: list[Claim], **meta: Any) -> None:
    atomic_write_json(path, claims_to_json(claims, **meta))


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def claims_table(claims: list[Claim], *, width: int = 60, show_laws: bool = True) -> str:
    """Human table: one block per claim (id, dtype, stated vs measured, tolerance, verdict)."""
    lines = []
    for c in claims:
        verdict = "HOLDS" if c.holds else "FAILS"
        lines.append(f"[{verdict}] {c.id}  ({c.dtype})")
        lines.append(f"    source : {c.statement}")
        lines.append(f"    stated : {_fmt(c.stated)}   [{c.source_status}]")
        lines.append(f"    ours   : {_fmt(c.measured)}")
        lines.append(f"    tol    : {_fmt(c.tolerance)}")
        if show_laws and c.exact_law:
            lines.append(f"    law    : {c.exact_law}")
        for k, v in c.details.items():
            s = _fmt(v)
            if len(s) > 4 * width:
                s = s[: 4 * width] + " ..."
            lines.append(f"      {k}: {s}")
    n_ok = sum(c.holds for c in claims)
    lines.append(f"{n_ok} of {len(claims)} claims hold")
    return "\n".join(lines)
