"""The house's import graph (issue 12): module-level imports point down the package layers and form no circle.

Layers: ``rmsgauge`` < ``grt_model`` < ``lm`` < ``gauge``, ``dynamics``, ``proofs`` < ``figures``.  Imports inside a
function (a CLI entry attaching a higher package's hook) are not module-level and are allowed by design.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"rmsgauge": 0, "grt_model": 1, "lm": 2, "gauge": 3, "dynamics": 3, "proofs": 3, "figures": 4}


def _module_graph() -> dict[str, set[str]]:
    mods = {}
    for pkg in LAYER:
        for p in (ROOT / pkg).glob("*.py"):
            mods[pkg if p.stem == "__init__" else f"{pkg}.{p.stem}"] = p
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.parse(p.read_text()).body:  # module level only
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            # a submodule importing its own package's __init__ is Python's parent import, not an edge
            edges[m] |= {n for n in names if n in mods and n != m and not m.startswith(n + ".")}
    return edges


def test_module_imports_point_down_the_layers():
    edges = _module_graph()
    bad = sorted((a, b) for a, bs in edges.items() for b in bs
                 if a.split(".")[0] != b.split(".")[0] and LAYER[b.split(".")[0]] >= LAYER[a.split(".")[0]])
    assert not bad, f"module-level imports that point up or sideways: {bad}"


def test_no_import_circle():
    edges = _module_graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(u: str, path: list[str]) -> None:
        state[u] = 1
        path.append(u)
        for v in sorted(edges[u]):
            if state.get(v) == 1:
                cycles.append([*path[path.index(v):], v])
            elif v not in state:
                visit(v, path)
        path.pop()
        state[u] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])
    assert not cycles, f"import circles: {cycles}"


def test_the_graph_is_read():  # the two tests above would pass vacuously on an empty graph
    edges = _module_graph()
    assert len(edges) > 60 and ("lm.dense" in edges["lm.train"] or "lm.checkpoint" in edges["lm.train"])
    assert "grt_model.cascade_ops" in edges["grt_model.fused"]
