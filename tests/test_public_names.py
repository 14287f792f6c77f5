"""Every public name is used: each name in a package's ``__all__`` (its ``__init__.py``, and any module that declares
one) is imported or reached somewhere outside the module that defines it and the ``__init__`` files that re-export
it, in the tree's code, tests, README or pyproject.  A name nobody uses is weight the reader carries for nothing.

Read from the source, never imported.  In Python: ``from M import name`` and ``M.name`` through any alias of ``M``
(``import a.b as c``, ``from a import b``), where ``M`` is the defining module or one of its re-exporters (a
docstring that names it is not a use); in the README and pyproject, the text ``M.name`` or ``M:name``.  A name that
is a module counts as used when anything imports it or reaches into it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rmsgauge", "grt_model", "lm", "gauge", "proofs", "dynamics", "studies", "figures", "tools")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            if all((ROOT.joinpath(*parts[:k]) / "__init__.py").is_file() for k in range(1, len(parts))):
                mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


MODULES = _modules()
TREES = {m: ast.parse(p.read_text()) for m, p in MODULES.items()}


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The absolute module of ``from ... import`` (relative imports resolved against ``module``'s package)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (MODULES[module].name == "__init__.py")]
    return ".".join([*base, node.module] if node.module else base)


def _all(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def _bindings(module: str) -> tuple[set[str], dict[str, str]]:
    """The names ``module`` defines at its top level, and those it imports (at any depth) with the module each
    comes from (a submodule when the name is one)."""
    tree, defined, imported = TREES[module], set(), {}
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            defined.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            defined.update(t.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                           if isinstance(t, ast.Name))
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            src = _absolute(module, n)
            for a in n.names:
                imported[a.asname or a.name] = f"{src}.{a.name}" if f"{src}.{a.name}" in MODULES else src
    return defined, imported


BINDINGS = {m: _bindings(m) for m in MODULES}
EXPORTS = {m: _all(t) for m, t in TREES.items()}


def _chain(module: str, name: str) -> list[str]:
    """The modules a public name passes through, re-exporters first, its defining module (or the module it names)
    last: ``dynamics`` -> ``dynamics.monitor`` -> ``dynamics.monitor.equilibrium`` for ``EquilibriumMonitor``."""
    chain = [module]
    while name not in BINDINGS[chain[-1]][0]:
        found = BINDINGS[chain[-1]][1].get(name)
        if found is None or found not in MODULES or found in chain:
            break
        chain.append(found)
    return chain


def _sources() -> list[Path]:
    skip = {".git", ".venv", "out", "build", "runs"}
    files = [p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts)]
    return [*files, ROOT / "README.md", ROOT / "pyproject.toml"]


def _uses(path: Path) -> tuple[set[tuple[str, str]], str]:
    """``(module, name)`` pairs the file imports or reaches as attributes (through its import aliases), and its
    text."""
    text = path.read_text()
    if path.suffix != ".py":
        return set(), text
    tree, alias, used = ast.parse(text), {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                parts = a.name.split(".")
                used.update((".".join(parts[:k]), parts[k]) for k in range(1, len(parts)))
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            for a in node.names:
                used.add((mod, a.name))
                alias[a.asname or a.name] = f"{mod}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base, parts = node.value, []
            while isinstance(base, ast.Attribute):
                parts.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in alias:
                used.add((".".join([alias[base.id], *parts]), node.attr))
    return used, text


def _used(name: str, definer: str, through: set[str], sources: dict[Path, tuple[set[tuple[str, str]], str]],
          owners: set[Path]) -> bool:
    named = definer if definer.endswith(f".{name}") else None  # the public name is this module
    via = through - {named}
    pattern = re.compile("|".join([*(rf"\b{re.escape(m)}[.:]{re.escape(name)}\b" for m in via),
                                   *([rf"\b{re.escape(named)}\b"] if named else [])]))
    for path, (used, text) in sources.items():
        if path in owners:
            continue
        if path.suffix != ".py":
            if pattern.search(text):
                return True
        elif any((m, name) in used for m in via) or (
                named and any(u[0] == named or u[0].startswith(f"{named}.") for u in used)):
            return True
    return False


# modules whose names are reached through an object, which a reading of the source cannot follow
REACHED_AT_RUN_TIME = {
    "grt_model.kernels.entry": "grt_model.kernels.runtime loads it on first use (numba compiles then) and the "
                               "fused paths call its kernels as RUNTIME.kernels.<name>",
}


def dead_names() -> list[str]:
    """``module.__all__: name`` for every public name used nowhere outside its definer and its re-exporters (the
    modules that list it in their own ``__all__``); an importer that does not re-export it is a user."""
    sources = {p: _uses(p) for p in _sources()}
    dead = []
    for module, names in EXPORTS.items():
        if module in REACHED_AT_RUN_TIME:
            continue
        for name in names:
            definer = _chain(module, name)[-1]
            through = {m for m in MODULES if _chain(m, name)[-1] == definer}
            owners = {MODULES[definer], *(MODULES[m] for m in through if name in EXPORTS[m])}
            if not _used(name, definer, through, sources, owners):
                dead.append(f"{module}.__all__: {name} (defined in {definer})")
    return dead


def test_the_reader_finds_the_public_names():  # the test below would pass vacuously on an empty list
    assert _chain("dynamics", "EquilibriumMonitor") == ["dynamics", "dynamics.monitor", "dynamics.monitor.equilibrium"]
    assert _chain("dynamics", "laws") == ["dynamics", "dynamics.laws"]
    assert sum(len(_all(t)) for t in TREES.values()) > 100


def test_every_public_name_is_used_outside_its_module():
    dead = dead_names()
    assert not dead, "public names used nowhere outside their own module:\n" + "\n".join(dead)
