"""The one-screen claims table, as a reader sees it: every cell whole (no number or word cut), ids whole, 100
columns.

Shared by the gauge, dynamics and grt_model tests (each renders the table of its own real claim records) and by
tests/test_foundation.py (any records)."""

from __future__ import annotations

import re

from rmsgauge.claims import STATUS_SHORT, WIDTH, compact_table, fmt_cell

NUMBER = re.compile(r"[-+]?\d")


def table_cells(lines: list[str]) -> dict[str, dict[str, str]]:
    """The printed table read back: ``{claim id: {column header: the cell's lines joined by spaces}}``.  Columns
    are cut at the header's positions, so a cell that spilled past its column shows up as a wrong text."""
    head = lines[0]
    names = re.split(r" {2,}", head.strip())  # "ours float64" is one header: columns are 2+ spaces apart
    starts, at = [], 0
    for name in names:
        at = head.index(name, at)
        starts.append(at)
        at += len(name)
    rows: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in lines[2:]:
        if line[:1] != " ":  # a row begins with its claim id
            current = rows.setdefault(line.split()[0], {n: [] for n in names})
        for name, a, b in zip(names, starts, [*starts[1:], None]):
            piece = line[a:b].strip()
            if piece:
                current[name].append(piece)
    return {cid: {n: " ".join(p) for n, p in cols.items()} for cid, cols in rows.items()}


def expected_cells(claims) -> dict[str, dict[str, str]]:
    """What each cell must show, whole: the claim's stated value, its summary per precision, its verdict."""
    groups: dict[str, list] = {}
    for c in claims:
        groups.setdefault(c.id, []).append(c)
    side_by_side = any(len(g) > 1 for g in groups.values())
    out = {}
    for cid, g in groups.items():
        first = g[0]
        verdict = "HOLDS" if all(c.holds for c in g) else "FAILS"
        cells = {"stated": fmt_cell(first.stated),
                 "verdict": f"{verdict} {STATUS_SHORT.get(first.source_status, first.source_status)}"}
        for c in g:
            cells[f"ours {c.dtype}" if side_by_side else "ours"] = c.summary or fmt_cell(c.measured)
        out[cid] = {k: " ".join(v.split()) for k, v in cells.items()}
    return out


def assert_cells_whole(claims, width: int = WIDTH) -> list[str]:
    """Every cell of the table shows its text whole (wrapped at spaces only, nothing cut, no ``...``)."""
    lines = compact_table(claims, width)
    got = table_cells(lines)
    for cid, cells in expected_cells(claims).items():
        assert cid in got, f"{cid}: no row starts with the whole id"
        for column, text in cells.items():
            if column in got[cid]:  # a record in a precision of its own sits in the first "ours" column
                shown = got[cid][column]
            else:
                shown = next(v for k, v in got[cid].items() if k.startswith("ours") and v)
            assert shown == text, f"{cid} {column}: shows {shown!r}, its text is {text!r}"
    return lines


def assert_table_shows_numbers(claims) -> None:
    lines = assert_cells_whole(claims)
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)
    for c in claims:
        assert c.summary, f"{c.id} ({c.dtype}) has no summary: its row would show a truncated dict"
        assert NUMBER.search(c.summary), f"{c.id}: summary {c.summary!r} shows no number"
