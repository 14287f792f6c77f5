"""The fused kernels' on-disk cache sees every kernel source, so an edited callee never runs stale machine code.

Numba's stock ``cache=True`` stamps a kernel with its own file only, so an edit to a callee in another
kernel file would keep the old machine code running.  :mod:`grt_model.kernels.jit` stamps every kernel with one
hash of all kernel sources.  Checked here: the stamp moves with every kernel source and with nothing else, every
kernel carries that cache, no other module defines a kernel, and, end to end in a temporary copy (its own
cache folder), an edit to a *callee* file changes what the *caller* computes on the next run while an
unedited rerun loads from the cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grt_model.kernels import jit as kernels_jit

PKG = Path(kernels_jit.__file__).resolve().parent
needs_numba_cache = pytest.mark.skipif(kernels_jit.KernelCache is None, reason="numba's cache hook unavailable")


def _copy_kernels(dst: Path) -> Path:
    """The kernel sources alone, as a package ``grt_model.kernels`` under ``dst`` (they import nothing else)."""
    pkg = dst / "grt_model" / "kernels"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    for p in kernels_jit.kernel_sources(PKG):
        shutil.copy2(p, pkg / p.name)
    return pkg


def test_stamp_moves_with_every_kernel_source_and_nothing_else(tmp_path):
    pkg = _copy_kernels(tmp_path)
    (pkg / "fused.py").write_text("# not compiled by numba\n")
    base = kernels_jit.kernel_source_stamp(pkg)
    assert base == kernels_jit.kernel_source_stamp(pkg)  # deterministic
    (pkg / "fused.py").write_text("# edited\n")
    assert kernels_jit.kernel_source_stamp(pkg) == base
    sources = kernels_jit.kernel_sources(pkg)
    assert {p.name for p in sources} == {"entry.py", "coupled.py", "rotate.py", "gelu.py", "scalar.py", "jit.py"}
    seen = {base}
    for p in sources:
        text = p.read_text()
        p.write_text(text + "# one more line\n")
        stamp = kernels_jit.kernel_source_stamp(pkg)
        assert stamp not in seen, p.name
        seen.add(stamp)
        p.write_text(text)
        assert kernels_jit.kernel_source_stamp(pkg) == base, p.name


def test_no_module_outside_the_kernel_sources_defines_a_kernel():
    # a kernel defined elsewhere would be compiled into the callers without moving their stamp
    covered = set(kernels_jit.kernel_sources(PKG))
    jit = re.compile(r"^\s*@(nb\.n?jit|numba\.n?jit|n?jit\b|kernel\b|inline_kernel\b)", re.M)
    defining = {p for p in PKG.parent.rglob("*.py") if jit.search(p.read_text(encoding="utf-8"))}
    assert defining and defining <= covered, defining - covered


@needs_numba_cache
def test_every_kernel_carries_the_kernel_set_cache():
    from numba.core.registry import CPUDispatcher

    from grt_model.kernels import coupled, entry, gelu, rotate, scalar

    n = 0
    for mod in (entry, coupled, gelu, scalar, rotate):
        for name, obj in vars(mod).items():
            if isinstance(obj, CPUDispatcher) and obj.__module__ == mod.__name__:
                assert isinstance(obj._cache, kernels_jit.KernelCache), f"{mod.__name__}.{name}"
                n += 1
    assert n >= 30


# Runs in the copy: the coupling-off cascade kernel (entry.py) over 3 tokens of width 4, one stage of
# identity maps; its stage function _rot lives in rotate.py, the file the test edits.
_RUN = """
import json, numpy as np
from grt_model.kernels import entry as k
i0, i1 = np.array([[0, 2]]), np.array([[1, 3]])
cf = np.zeros((1, 1, 2, 4)); cf[..., 0] = cf[..., 3] = 1.0
x = np.arange(12.0).reshape(3, 4); out = np.empty_like(x)
k.rot_cascade_fwd(x, out, i0, i1, cf, 2, 0, 2)
st = k.rot_cascade_fwd.stats
print(json.dumps({"out": out.tolist(), "hits": sum(st.cache_hits.values()), "misses": sum(st.cache_misses.values())}))
"""


def _run(root: Path) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(root / "numba-cache"), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-c", _RUN], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@needs_numba_cache
@pytest.mark.slow
def test_an_edit_to_a_callee_file_reaches_the_caller_through_the_cache(tmp_path):
    pkg = _copy_kernels(tmp_path)
    first = _run(tmp_path)  # compiles (fresh cache folder) and saves
    assert first["misses"] >= 1 and first["out"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    again = _run(tmp_path)  # unedited: loaded from the cache, not recompiled
    assert again["hits"] >= 1 and again["misses"] == 0 and again["out"] == first["out"]
    rot = pkg / "rotate.py"
    old = "            buf[i0, t] = a * x0 + b * x1\n"
    text = rot.read_text()
    assert text.count(old) == 1  # _rot's first row (an edit to a callee: what a per-file cache key misses)
    rot.write_text(text.replace(old, "            buf[i0, t] = 2.0 * (a * x0 + b * x1)\n"))
    edited = _run(tmp_path)
    assert edited["misses"] >= 1, "the caller was loaded from a cache compiled before its callee's edit"
    assert edited["out"] == [[0, 1, 4, 3], [8, 5, 12, 7], [16, 9, 20, 11]]
