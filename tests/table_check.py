"""The one-screen claims table, as a reader sees it: every row's deciding number visible, ids whole, 100 columns.

Shared by the gauge, dynamics and grt_model tests (each renders the table of its own real claim records)."""

from __future__ import annotations

import re

from rmsgauge.claims import WIDTH, compact_table

NUMBER = re.compile(r"[-+]?\d")


def assert_table_shows_numbers(claims) -> None:
    lines = compact_table(claims)
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)
    head = lines[0]
    ours_at = head.index("ours")
    verdict_at = head.index("verdict")
    body = lines[2:]
    for c in claims:
        assert c.summary, f"{c.id} ({c.dtype}) has no summary: its row would show a truncated dict"
        assert NUMBER.search(c.summary), f"{c.id}: summary {c.summary!r} shows no number"
        start = next(i for i, line in enumerate(body) if line.startswith(c.id + " "))  # the id whole, on one line
        row = [body[start]] + [line for line in body[start + 1:start + 3] if line[:1] == " "]
        ours = " ".join(line[ours_at:verdict_at] for line in row)
        assert NUMBER.search(ours), f"{c.id}: no number in its 'ours' cell: {ours!r}"
