"""The house's import graph: every import at every depth (module level and inside functions) points down the
package layers, and no two modules import each other through any chain.

Layers, bottom to top: ``rmsgauge`` < ``grt_model`` < ``lm`` < ``gauge``, ``proofs`` < ``dynamics`` (its Trainer
callback uses the census) < ``studies`` (what needs a trained model or a training run) < ``figures``, ``tools``.
Not edges: imports under ``if TYPE_CHECKING:`` (annotations) and under ``if __name__ == "__main__":`` (a module
run as a script is not imported by anyone).  Inside a package, a submodule importing its own package's
``__init__`` is Python's parent import, not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"rmsgauge": 0, "grt_model": 1, "lm": 2, "gauge": 3, "proofs": 3, "dynamics": 4, "studies": 5,
         "figures": 6, "tools": 6}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in LAYER:
        for p in (ROOT / pkg).rglob("*.py"):  # subpackages too: grt_model.claims.geometry
            parts = p.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


def _skipped_block(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` or ``if __name__ == "__main__":`` (their ``else`` branches still count)."""
    if not isinstance(node, ast.If):
        return False
    t = node.test
    if (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (isinstance(t, ast.Attribute)
                                                                   and t.attr == "TYPE_CHECKING"):
        return True
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in t.comparators))


def _imported_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return []


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The longest known module a dotted name starts with (``lm.dense.DenseConfig`` -> ``lm.dense``)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in mods:
            return cand
    return None


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}

    def walk(m: str, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _skipped_block(child):
                for sub in child.orelse:
                    walk(m, sub)
                continue
            for name in _imported_names(child):
                target = _resolve(name, mods)
                if target is not None and target != m and not m.startswith(target + "."):
                    edges[m].add(target)
            walk(m, child)

    for m, p in mods.items():
        walk(m, ast.parse(p.read_text()))
    return edges


def _pkg(module: str) -> str:
    return module.split(".")[0]


def test_every_import_points_down_the_layers():
    edges = import_graph()
    bad = sorted((a, b) for a, bs in edges.items() for b in bs
                 if _pkg(a) != _pkg(b) and LAYER[_pkg(b)] >= LAYER[_pkg(a)])
    assert not bad, f"imports that point up or sideways (at any depth): {bad}"


def test_no_import_circle():
    edges = import_graph()
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


def test_the_graph_reads_function_level_imports():  # the tests above would pass vacuously on an empty graph
    edges = import_graph()
    assert len(edges) > 100 and "lm.dense" in edges["lm.checkpoint"]
    assert "grt_model.cascade_ops" in edges["grt_model.fused"]
    # a function-level import counts: studies.job imports lm.loop inside _train
    assert "lm.loop" in edges["studies.job"]
    # the monitor is attached above dynamics and gauge
    assert {"dynamics.train_hook", "gauge.census"} <= edges["studies.train"]


def test_every_layered_package_is_installed():
    """An installed checkout imports every package of the graph (``tools`` runs from a source tree only)."""
    import tomllib

    packages = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert set(LAYER) - {"tools"} <= packages, set(LAYER) - {"tools"} - packages
