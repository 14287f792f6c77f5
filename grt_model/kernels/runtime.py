"""The numba kernel module and the worker threads that run its tile chunks: :data:`RUNTIME`, one per process.

Where the kernels cannot be imported (no numba) or compiled, :meth:`KernelRuntime.mark_unavailable` logs one
notice (logger ``grt_model.kernels``, WARNING) and every cascade runs eager from then on.  A test that needs
a runtime without kernels replaces :data:`RUNTIME` with its own ``KernelRuntime()``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger("grt_model.kernels")


def _single_thread_blas() -> None:
    """Worker-thread initializer: the coupled kernels' ``np.dot`` calls go to OpenBLAS, which would fan each
    call out over all cores while every core already runs a kernel; one BLAS thread per kernel thread instead
    (``openblas_set_num_threads_local``, a thread-local setting of OpenBLAS >= 0.3.27; best effort)."""
    with contextlib.suppress(ImportError):  # numba's np.dot calls scipy's BLAS: load it now, to limit it below
        import scipy.linalg.cython_blas  # noqa: F401
    try:
        with open("/proc/self/maps") as fh:
            paths = {ln.split()[-1] for ln in fh if "openblas" in ln.lower() and "/" in ln}
    except OSError:
        return
    for path in paths:
        try:
            ctypes.CDLL(path).openblas_set_num_threads_local(1)
        except (OSError, AttributeError):
            continue


class KernelRuntime:
    """The numba kernel module (imported on first use) and the worker threads that run its tile chunks."""

    def __init__(self) -> None:
        self._kernels: Any = None  # the module, or False once it proved unavailable
        self._pool: ThreadPoolExecutor | None = None

    def mark_unavailable(self, reason: str) -> None:
        self._kernels = False
        log.warning("grt_model: fused rotation-cascade kernels unavailable (%s); using the eager PyTorch path",
                    reason)

    def kernels(self) -> Any:
        """The numba kernel module; ``None`` where it is unavailable."""
        if self._kernels is None:
            try:
                from grt_model.kernels import entry

                self._kernels = entry
            except Exception as e:  # ImportError without numba; anything numba raises while loading its cache
                self.mark_unavailable(f"{type(e).__name__}: {e}")
        return self._kernels or None

    def available(self) -> bool:
        return self.kernels() is not None

    def compile_failed(self, e: BaseException) -> bool:
        """Whether ``e`` is numba failing to compile a kernel (then: notice, and eager from here on)."""
        k = self.kernels()
        if k is None or not isinstance(e, k.nb.core.errors.NumbaError):
            return False
        self.mark_unavailable(f"numba could not compile the kernels: {type(e).__name__}: {str(e).splitlines()[0]}")
        return True

    def launch(self, jobs: list[Callable[[], Any]]) -> list[Any]:
        """Run the chunk jobs, one per worker thread (the caller waits, even for one job: the workers use one
        BLAS thread each, so a call never uses more threads than there are jobs); their results in order."""
        if self._pool is None or self._pool._max_workers < len(jobs):
            self._pool = ThreadPoolExecutor(max_workers=max(len(jobs), os.cpu_count() or 1),
                                            thread_name_prefix="grt-fused", initializer=_single_thread_blas)
        return [f.result() for f in [self._pool.submit(j) for j in jobs]]


RUNTIME = KernelRuntime()  # the process's; read as ``runtime.RUNTIME`` at each call so a test may replace it
