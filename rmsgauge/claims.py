"""The claim record shared by every package that checks a claim, how a group runs, how it prints.

A record says what the source text claims (``statement``, ``stated``), what this run measured (``measured``), the
tolerance and the verdict (``holds``); where the source is imprecise, ``source_status`` says so and ``exact_law``
states the law verified instead.  ``details`` is structured data (units in the name, e.g. ``seconds``), never prose
to be parsed back: the report gathers records by calling the checks, never by parsing printed text.  Each package
declares a :class:`ClaimGroup`, runs it with :func:`run_claims` and prints with :func:`claims_table`.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

from rmsgauge.atomic import atomic_write_json, json_safe
from rmsgauge.seeding import seed_everything

SOURCE_STATUSES = ("exact", "approximate", "wrong", "unstated", "not_a_source_claim")
NO_DTYPE = "n/a"  # a claim about structure (counts, wiring) that runs in no floating precision
WIDTH = 100  # columns of every printed table and wrapped line
DTYPE_ALIASES = {"f32": "float32", "f64": "float64", "double": "float64", "float": "float32", "half": "float16"}


def dtype_name(dtype: Any) -> str:
    """The one spelling of a precision in records: ``torch.float64``, ``np.float64``, ``np.dtype('float64')``
    and ``"float64"`` all give ``"float64"``; ``None`` gives ``"n/a"``; a list of precisions measured in one
    record (``"float64, float32"`` or a sequence of dtypes) stays a comma-separated list, in the given order."""
    if dtype is None:
        return NO_DTYPE
    if isinstance(dtype, (list, tuple)):
        return ", ".join(dtype_name(d) for d in dtype)
    if isinstance(dtype, type):  # numpy scalar types: np.float64
        dtype = dtype.__name__
    name = str(dtype).strip()
    if "," in name:
        return ", ".join(dtype_name(part) for part in name.split(","))
    name = name.replace("torch.", "")
    return DTYPE_ALIASES.get(name, name)


@dataclass(kw_only=True)
class Claim:
    id: str  # "<package>.<snake_case>", e.g. "gauge.forward_invariance"
    statement: str  # the source's claim, in its own words where possible
    stated: Any  # the source's value (number or text); None where the source gives none
    measured: Any  # our value from this run (number, or a small dict of numbers)
    tolerance: float | None  # the threshold the verdict used (None for qualitative verdicts)
    holds: bool  # the verdict
    dtype: Any = "float64"  # precision the measurement ran in (any spelling; stored as dtype_name(dtype))
    exact_law: str = ""  # the law we state where the source's is loose
    source_status: str = "exact"  # is the source's statement exact, approximate, wrong?
    details: dict[str, Any] = field(default_factory=dict)  # supporting measurements: names -> numbers
    figure: str | None = None  # figure file stem (same as the id) once figures/ draws it
    # the deciding number(s) in a few words, chosen by the claim: the one-screen table's "ours" cell
    # (``measured`` holds the full structured values; a table never truncates them mid-dict)
    summary: str = ""

    def __post_init__(self) -> None:
        pkg, _, name = self.id.partition(".")
        if not pkg or not name or not name.replace("_", "").isalnum():
            raise ValueError(f"claim id must be '<package>.<snake_case>', got {self.id!r}")
        if self.source_status not in SOURCE_STATUSES:
            raise ValueError(f"source_status must be one of {SOURCE_STATUSES}, got {self.source_status!r}")
        self.holds = bool(self.holds)
        self.dtype = dtype_name(self.dtype)

    def to_json(self) -> dict[str, Any]:
        return json_safe(asdict(self))


Check = Callable[..., "Claim | list[Claim]"]


def _no_context(**_options: Any) -> AbstractContextManager[list[dict[str, Any]]]:
    """The context of checks that build their own inputs: one call, no arguments."""
    return nullcontext([{}])


@dataclass(frozen=True)
class ClaimGroup:
    """The claims one command measures: ``checks`` maps each claim id to its check, in the order they run and print;
    ``context`` builds what the checks share.

    ``context(seed=, quick=, progress=, **options)`` is a context manager (set up, yield, restore) yielding the
    keyword arguments of each call: every check runs once per call, side by side (gauge: one per precision).
    ``seed`` is None for the group's own; ``reseed`` seeds every check from it (0 where None)."""

    checks: dict[str, Check]
    context: Callable[..., AbstractContextManager[Sequence[dict[str, Any]]]] = _no_context
    reseed: bool = False


def run_claims(group: ClaimGroup, *, only: Iterable[str] | None = None, seed: int | None = None,
               quick: bool = False, progress: Callable[[str], None] | None = None, **options: Any) -> list[Claim]:
    """Build ``group``'s context once, then run its checks (those in ``only``) in order, each in every call.

    An unknown id in ``only`` is a ``ValueError`` listing the known ones; a check that raises is a FAILS record
    naming the error in one line (a broken check must not hide as a traceback), and its remaining calls are
    skipped."""
    ids = list(group.checks) if only is None else list(only)
    unknown = [i for i in ids if i not in group.checks]
    if unknown:
        raise ValueError(f"unknown claim id(s) {unknown}; known: {', '.join(group.checks)}")
    out: list[Claim] = []
    with group.context(seed=seed, quick=quick, progress=progress, **options) as calls:
        for id in (i for i in group.checks if i in ids):
            if progress is not None:
                progress(id)
            for kwargs in calls:
                if group.reseed:
                    seed_everything(0 if seed is None else seed)
                try:
                    res = group.checks[id](**kwargs)
                except Exception as e:
                    error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    out.append(Claim(id=id, statement="(the check raised before measuring)", stated=None, measured=None,
                                     tolerance=None, holds=False, dtype=None, source_status="not_a_source_claim",
                                     details={"error": error}))
                    break
                res = res if isinstance(res, list) else [res]
                if not all(isinstance(r, Claim) for r in res):
                    raise TypeError(f"check {id!r} must return rmsgauge.Claim records, got "
                                    f"{sorted({type(r).__name__ for r in res})}")
                out.extend(res)
    return out


def write_claims_json(path: str | os.PathLike, claims: list[Claim], **meta: Any) -> None:
    atomic_write_json(path, {**{k: json_safe(v) for k, v in meta.items()}, "claims": [c.to_json() for c in claims]})


STATUS_SHORT = {"exact": "exact", "approximate": "approx.", "wrong": "WRONG", "unstated": "unstated",
                "not_a_source_claim": "ours"}
STATED_MIN, VERDICT_MIN, DTYPE_MIN, OURS_MIN = 10, 8, 8, 12  # the narrowest each column is drawn


def fmt_value(v: Any, digits: int = 3) -> str:
    """Compact text of a value: numbers to ``digits`` significant figures, dicts as ``key value; ...``."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    if isinstance(v, dict):
        return "; ".join(f"{k} {fmt_value(x, digits)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt_value(x, digits) for x in v) + "]"
    return str(v)


def _wrap(text: str, width: int, first: str = "", rest: str = "") -> list[str]:
    """Wrap at spaces only, so a value is never split (a value wider than ``width`` keeps its own line); ``first``
    and ``rest`` indent the first and the following lines."""
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_long_words=False,
                         break_on_hyphens=False) or [first]


def _groups(claims: Sequence[Claim]) -> list[list[Claim]]:
    """Records grouped by id (one per dtype where a check runs in several), in first-seen order."""
    out: dict[str, list[Claim]] = {}
    for c in claims:
        out.setdefault(c.id, []).append(c)
    return list(out.values())


def verdict_line(claims: Sequence[Claim], what: str = "claims") -> str:
    n_ok = sum(c.holds for c in claims)
    failing = [f"{c.id} ({c.dtype})" for c in claims if not c.holds]
    tail = "" if not failing else "; FAILS: " + ", ".join(failing)
    return f"{n_ok} of {len(claims)} {what} hold{tail}"


def fmt_cell(v: Any) -> str:
    """A value for a table cell: like :func:`fmt_value`, but a list of names is counted (the names are in
    ``--verbose``) and a long list of numbers shows its first three and its length."""
    if isinstance(v, dict):
        return "; ".join(f"{k} {fmt_cell(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(x, str) for x in v):
            return f"{len(v)} names"
        if len(v) > 3:
            return "[" + ", ".join(fmt_value(x) for x in v[:3]) + f", ... {len(v)} values]"
    return fmt_value(v)


def _ours(c: Claim) -> str:
    return c.summary or fmt_cell(c.measured)


def compact_table(claims: Sequence[Claim], width: int = WIDTH) -> list[str]:
    """One row per claim id: id, dtypes side by side, stated, ours, verdict with the source status under it.

    Where a check runs in several precisions (gauge), each precision gets its own ``ours`` column; otherwise a
    ``dtype`` column says which precision the record ran in.  Every cell is shown whole, wrapped at spaces: no
    number or word is cut, and each column is at least as wide as its widest word (a claim whose summary is
    longer only takes more lines; ``--verbose`` adds the structured values)."""
    groups = _groups(claims)
    if not groups:
        return ["(no claims)"]
    cols = list(dict.fromkeys(c.dtype for g in groups if len(g) > 1 for c in g))  # the precisions side by side
    head = ["claim", *([] if cols else ["dtype"]), "stated", *([f"ours {d}" for d in cols] or ["ours"]), "verdict"]
    rows = []
    for g in groups:
        by_dtype = {c.dtype: c for c in g}
        ours = [_ours(by_dtype[d]) if d in by_dtype else "" for d in cols]
        if not any(ours):  # a record in a precision of its own (or no columns at all): the first column
            ours = [_ours(g[0])] + [""] * (len(cols) - 1)
        verdict = "HOLDS" if all(c.holds for c in g) else "FAILS"
        status = STATUS_SHORT.get(g[0].source_status, g[0].source_status)
        rows.append([g[0].id, *([] if cols else [g[0].dtype]), fmt_cell(g[0].stated), *ours, f"{verdict} {status}"])
    column = list(zip(*rows))  # column k's cells
    least = {"stated": STATED_MIN, "verdict": VERDICT_MIN, "dtype": DTYPE_MIN}
    # every column as wide as its widest word (an id is one word): a formula, a number, an id is never cut
    widths = [max(len(h), least.get(h, OURS_MIN if h.startswith("ours") else 0),
                  *(len(w) for cell in column[k] for w in cell.split())) for k, h in enumerate(head)]
    ours_at = [k for k, h in enumerate(head) if h.startswith("ours")]
    gaps = 2 * (len(head) - 1)
    spare = width - gaps - sum(w for k, w in enumerate(widths) if k not in ours_at)
    share = spare // len(ours_at)  # the "ours" columns share what is left, none narrower than its widest word
    for k in ours_at:
        widths[k] = max(widths[k], share)
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip(), "-" * min(width, sum(widths) + gaps)]
    for r in rows:
        cells = [_wrap(x, w) for x, w in zip(r, widths)]
        for i in range(max(map(len, cells))):
            out.append("  ".join((c[i] if i < len(c) else "").ljust(w) for c, w in zip(cells, widths)).rstrip())
    return out


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested dicts as dotted names (``a.b``) so every printed line is one name and its value."""
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and v and any(isinstance(x, dict) for x in v.values()):
            out += _flatten(v, name + ".")
        else:
            out.append((name, v))
    return out


def _labelled(label: str, text: str, indent: int, width: int) -> list[str]:
    pad = " " * indent
    return _wrap(text, width, pad + label, pad + "    ")


def claim_details(claims: Sequence[Claim], width: int = WIDTH) -> list[str]:
    """Per claim id: source statement, stated, ours, tolerance and law once, then each dtype's details, all
    wrapped at ``width`` columns at spaces (never inside a value)."""
    out: list[str] = []
    for grp in _groups(claims):
        first = grp[0]
        out += ["", f"{first.id}  [{first.source_status}]"]
        out += _labelled("source: ", first.statement, 2, width)
        out += _labelled("stated: ", fmt_value(first.stated, 4), 2, width)
        if first.exact_law:
            out += _labelled("law   : ", first.exact_law, 2, width)
        for c in grp:
            verdict = "HOLDS" if c.holds else "FAILS"
            out += _labelled(f"{c.dtype}: {verdict}, tol {fmt_value(c.tolerance, 4)}, ours: ",
                             fmt_value(c.measured, 4), 2, width)
            for k, v in _flatten(c.details):
                out += _labelled(f"{k}: ", fmt_value(v, 4), 6, width)
    return out


def claims_table(claims: Sequence[Claim], *, verbose: bool = False, extra: Iterable[str] = (),
                 what: str = "claims", width: int = WIDTH) -> str:
    """The printed claims: the compact table, then (``verbose``) each claim's source, law and details, then
    ``extra`` lines (a CLI's own section, e.g. gauge's census), and the verdict line last."""
    lines = compact_table(claims, width)
    if verbose:
        lines += claim_details(claims, width)
    extra = list(extra)
    if extra:
        lines += ["", *extra]
    lines.append(verdict_line(claims, what))
    return "\n".join(lines)
