r"""Structure-aware learning rates: a coordinate search over each lr group's multiplier, equal runs per model.

The grid's ``tuning`` group (why: one lr for every parameter is the wrong-multiplier baseline for a structured
layer, Qiu et al. 2024, arXiv 2406.06248) trains points ``lr_mult = {group: multiplier}``
(:data:`lm.trainconfig.MODEL_LR_GROUPS`) chosen one after another by :func:`propose`, then the best recorded point
(:func:`best_point`) at two fresh seeds.  The search is a deterministic function of the scores recorded so far
(whole-split bits/byte, a diverged run worst), so a restarted driver proposes the same points:

* the multipliers live on a half-decade grid (:data:`GRID`, 0.01 ... 100; every group starts at 1);
* for each group in turn, the two grid neighbours of the current point are trained (in parallel); if one is
  strictly better than the current point the search moves there and keeps stepping the same way while that
  improves, then goes on to the next group;
* a pass over every group that moves nothing widens the neighbourhood (two grid steps, then three, ...); a move
  at any reach goes back to the nearest neighbours of the new point;
* every model gets the same number of runs (:data:`studies.grid.TUNING_RUNS`): the search stops when they are
  spent, not when it converges, so the model with fewer groups is searched more finely, never given fewer runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from studies.grid import TUNING_BASE, RunSpec

GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)  # half-decade steps, as the lr sweeps'

Point = dict[str, float]


def point_key(point: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """A point's identity: its multipliers other than 1, sorted (``{}`` is the global-lr point)."""
    return tuple(sorted((g, float(v)) for g, v in point.items() if float(v) != 1.0))


def run_score(rec: Mapping[str, Any]) -> float:
    """What the search ranks by: whole-split bits/byte; a diverged or unmeasured run is worst."""
    v = rec.get("val_bpb_full")
    return math.inf if v is None or not math.isfinite(float(v)) else float(v)


def _with(point: Point, group: str, value: float) -> Point:
    out = {g: v for g, v in point.items() if g != group}
    if value != 1.0:
        out[group] = value
    return out


def propose(groups: Iterable[str], scores: Mapping[tuple, float]) -> tuple[list[Point], Point]:
    """``(points to train next, the current point)`` given ``scores`` (``point_key -> score``) of the points
    trained so far: one or two points (two: a group's pair of neighbours, trainable side by side); ``[]`` when
    every point of the grid reachable by the rule is scored."""
    groups = tuple(groups)
    best: Point = {}

    def score(p: Point) -> float:
        return scores[point_key(p)]

    if point_key(best) not in scores:
        return [best], best
    while True:
        moved = False
        for reach in range(1, len(GRID)):
            for g in groups:
                i = GRID.index(best.get(g, 1.0))
                near = [_with(best, g, GRID[j]) for j in (i - reach, i + reach) if 0 <= j < len(GRID)]
                todo = [p for p in near if point_key(p) not in scores]
                if todo:
                    return todo, best
                cand = min(near, key=lambda p: (score(p), point_key(p)))
                if score(cand) >= score(best):
                    continue
                direction = 1 if cand[g] > best.get(g, 1.0) else -1
                best, moved = cand, True
                while 0 <= (j := GRID.index(best[g]) + direction) < len(GRID):
                    nxt = _with(best, g, GRID[j])
                    if point_key(nxt) not in scores:
                        return [nxt], best
                    if score(nxt) >= score(best):
                        break
                    best = nxt
                if reach > 1:
                    break  # a wide move: the nearest neighbours of the new point come before any other wide one
            if moved:
                break  # back to the nearest neighbours of the new point
        if not moved:
            return [], best


def best_point(scored: Iterable[tuple[Point, float]]) -> tuple[Point, float]:
    """The lowest-scoring point (ties: the smaller key, so the choice does not depend on record order)."""
    return min(((dict(p), s) for p, s in scored), key=lambda ps: (ps[1], point_key(ps[0])))


def search_trace(groups: Iterable[str], points: list[Point], scores: list[float]) -> list[dict[str, Any]]:
    """Replay the search on its recorded runs (in slot order): for each, the group it varied and whether it
    became the current point -- the table the report prints."""
    groups = tuple(groups)
    known: dict[tuple, float] = {}
    befores, currents = [], []
    for p, s in zip(points, scores):
        befores.append(propose(groups, known)[1])
        known[point_key(p)] = s
        currents.append(point_key(propose(groups, known)[1]))
    # accepted: the point became the current one, then or later (one of a pair moves once its partner is scored)
    return [{"point": dict(p), "score": s, "varied": [g for g in groups if p.get(g, 1.0) != b.get(g, 1.0)],
             "accepted": point_key(p) in currents[i:]}
            for i, (p, s, b) in enumerate(zip(points, scores, befores))]


def scored_runs(search: str, records: dict[str, dict[str, Any]], names: list[str]) -> list[tuple[Point, float]]:
    """``(lr_mult, score)`` of the search's global-lr base run (when recorded), then of the records ``names``."""
    base = TUNING_BASE.get(search)
    return ([({}, run_score(records[base]))] if base in records else []) + \
        [(records[n].get("lr_mult") or {}, run_score(records[n])) for n in names]


def search_scores(search: str, records: dict[str, dict[str, Any]],
                  specs: list[RunSpec]) -> dict[tuple, float] | None:
    """``point_key -> score`` of a tuning search's recorded runs, its global-lr base run included; ``None`` while
    the base run (when the grid trains it) is unrecorded, so the search never trains that point twice."""
    base = TUNING_BASE.get(search)
    if base not in records and any(s.name == base for s in specs):
        return None
    names = [s.name for s in specs if s.search == search and s.phase == "search" and s.name in records]
    return {point_key(p): v for p, v in scored_runs(search, records, names)}


def tuned_point(search: str, records: dict[str, dict[str, Any]], specs: list[RunSpec]) -> dict[str, float] | None:
    """The best point of a finished tuning search (its base run included); ``None`` until every slot is
    recorded."""
    slots = [s.name for s in specs if s.search == search and s.phase == "search"]
    if not slots or any(n not in records for n in slots):
        return None
    return best_point(scored_runs(search, records, slots))[0]


def resolve_tuning(spec: RunSpec, records: dict[str, dict[str, Any]], specs: list[RunSpec],
                   running: list[RunSpec], prior: dict[str, float] | None) -> RunSpec | None:
    """A tuning run with its ``lr_mult``: a search slot takes the next point :func:`studies.tuning.propose`
    gives that no running slot holds (``prior``: the point its folder already holds, kept on a restart); it waits
    until every earlier slot is recorded or running.  A seed of the best point waits for the whole search."""
    from lm.trainconfig import MODEL_LR_GROUPS

    slots = [s for s in specs if s.search == spec.search and s.phase == "search"]
    scores = search_scores(spec.search or "", records, specs)
    if scores is None:
        return None
    if spec.phase == "tuned":
        best = tuned_point(spec.search or "", records, specs)
        return None if best is None else replace(spec, lr_mult=best)
    busy = {s.name: point_key(s.lr_mult) for s in running if s.search == spec.search}
    if any(s.slot < spec.slot and s.name not in records and s.name not in busy for s in slots):
        return None
    todo = [p for p in propose(MODEL_LR_GROUPS[spec.model], scores)[0] if point_key(p) not in busy.values()]
    keep = [p for p in todo if prior is not None and point_key(p) == point_key(prior)]
    return replace(spec, lr_mult=(keep or todo)[0]) if todo else None
