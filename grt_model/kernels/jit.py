"""How every fused-cascade kernel is compiled: numba options, and an on-disk cache keyed on *all* kernel sources.

Why not numba's own ``cache=True``.  Numba stamps a function's cache entry with a hash of the one file that
defines it.  A kernel's machine code also holds every kernel it calls (the scalar helpers are inlined at
numba-IR level, the stage functions by LLVM), and those live in other files (:data:`KERNEL_FILES`): an edit to
a callee would leave the caller's stamp unchanged, and the old machine code would keep running until the cache
was cleared.  Here every kernel's stamp is one hash over every kernel source, so any edit to any of them
recompiles every kernel on next use (about a minute per dtype, cached afterwards).  The cache files stay where
numba puts them (``__pycache__`` beside the source, or ``$NUMBA_CACHE_DIR``); numba's index key still adds the
signature, the CPU and the function's bytecode.

Why not compile without a persistent cache: the kernels take 80 s of CPU to compile (both dtypes, every
kernel; 290 s wall on a loaded 2-core machine), which every process would pay.

The hook uses two numba internals (``Dispatcher._cache``, ``CacheImpl._locator``); where they are missing the
kernels compile without a persistent cache (correct, slower to start) after one notice on the
``grt_model.kernels`` logger, never with the stale-prone stock cache.
"""

from __future__ import annotations

import hashlib
import logging
from functools import lru_cache
from pathlib import Path

import numba as nb

KERNEL_DIR = Path(__file__).resolve().parent
# contract: FMA fusion (IEEE-allowed, more accurate); reassoc: lets LLVM vectorize the per-tile parameter-gradient
# sums (a float reduction is only vectorized when its order may change). No nnan/ninf: NaN and inf still propagate.
# No cache=True: the cache is attached by kernel() below, keyed on every kernel source.
JIT_OPTIONS = {"nogil": True, "fastmath": {"contract", "reassoc"}, "error_model": "numpy"}
# scalar helpers are inlined at numba-IR level: a call left to LLVM's inliner carries numba's status-code
# convention into the loop and blocks its vectorization
INLINE_OPTIONS = {**JIT_OPTIONS, "inline": "always"}
log = logging.getLogger("grt_model.kernels")


# every file whose code ends up in a kernel's machine code (tests/test_kernel_cache.py checks that no other module
# of the package defines a numba kernel)
KERNEL_FILES = ("coupled.py", "entry.py", "gelu.py", "jit.py", "rotate.py", "scalar.py")


def kernel_sources(folder: Path = KERNEL_DIR) -> list[Path]:
    return [folder / name for name in KERNEL_FILES]


@lru_cache(maxsize=8)
def _hash_files(files: tuple[tuple[str, int, int], ...]) -> str:
    """sha256 over (name, content) of each file; memoized on (path, mtime, size) like numba's own stamp."""
    h = hashlib.sha256()
    for path, _, _ in files:
        h.update(Path(path).name.encode() + b"\0")
        h.update(Path(path).read_bytes() + b"\0")
    return h.hexdigest()


def kernel_source_stamp(folder: Path = KERNEL_DIR) -> str:
    """The cache stamp every kernel carries: one hash of every kernel source in ``folder``."""
    stats = [(p, p.stat()) for p in kernel_sources(folder)]
    return "grt-kernels-sha256:" + _hash_files(tuple((str(p), st.st_mtime_ns, st.st_size) for p, st in stats))


def _cache_class():
    """numba's function cache with the source stamp replaced by :func:`kernel_source_stamp`."""
    from numba.core.caching import CompileResultCacheImpl, FunctionCache

    class _StampedLocator:
        """The locator numba chose (same folder, same file names), with the kernel-set stamp."""

        def __init__(self, inner) -> None:
            self._inner = inner

        def __getattr__(self, name):  # get_cache_path, ensure_cache_path, get_disambiguator, _py_file, ...
            return getattr(self._inner, name)

        def get_source_stamp(self) -> str:
            return kernel_source_stamp(Path(self._inner._py_file).resolve().parent)

    class KernelCacheImpl(CompileResultCacheImpl):
        def __init__(self, py_func) -> None:
            super().__init__(py_func)
            self._locator = _StampedLocator(self._locator)

    class KernelCache(FunctionCache):
        _impl_class = KernelCacheImpl

    return KernelCache


try:
    KernelCache = _cache_class()
except ImportError as e:  # numba reorganized its caching module: compile per process rather than risk staleness
    KernelCache = None
    _NO_CACHE_REASON = f"{type(e).__name__}: {e}"


def _attach_cache(disp):
    if KernelCache is None or not hasattr(disp, "_cache"):
        _notice_no_cache(_NO_CACHE_REASON if KernelCache is None else "numba's Dispatcher has no _cache")
        return disp
    disp._cache = KernelCache(disp.py_func)  # what Dispatcher.enable_caching() does, with our cache class
    return disp


@lru_cache(maxsize=1)
def _notice_no_cache(reason: str) -> None:
    log.warning("grt_model: the fused kernels compile without an on-disk cache this run (%s)", reason)


def kernel(fn):
    """``numba.njit`` with :data:`JIT_OPTIONS` and the kernel-set cache."""
    return _attach_cache(nb.njit(**JIT_OPTIONS)(fn))


def inline_kernel(fn):
    """A scalar helper, inlined into its callers at numba-IR level (:data:`INLINE_OPTIONS`), same cache."""
    return _attach_cache(nb.njit(**INLINE_OPTIONS)(fn))
