"""Backend settings, counters and the kernel runtime of the rotation cascade, as explicit objects.

Nothing here is module-level mutable state: every :class:`~grt_model.cascade.RotationCascade` holds its
own :class:`BackendSettings` (frozen: change it with :func:`dataclasses.replace` or :func:`apply_settings`)
and its own :class:`FusedStats`; the numba kernel module and the worker threads live in a
:class:`KernelRuntime`, one shared by default (:func:`default_runtime`, a cache like ``functools.lru_cache``
of a compiled function: loading the kernels twice would only repeat work).  A test that needs a runtime
without kernels builds its own ``KernelRuntime()`` and marks it unavailable.

The process-wide default backend is the environment variable ``GRT_CASCADE_BACKEND`` (``auto`` | ``fused``
| ``eager``), read at each call, so ``monkeypatch.setenv`` scopes it to one test.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from torch import nn

BACKENDS = ("auto", "fused", "eager")
BACKWARD_MODES = ("auto", "store")
ENV_BACKEND = "GRT_CASCADE_BACKEND"
log = logging.getLogger("grt_model.fused")  # the notice's logger name is part of the documented interface


def check_backend(name: Any, what: str = "backend") -> str:
    if name not in BACKENDS:
        raise ValueError(f"{what} must be one of {', '.join(BACKENDS)}; got {name!r}")
    return name


def env_backend() -> str:
    """What ``"auto"`` resolves through: ``$GRT_CASCADE_BACKEND`` (default ``"auto"``), read at each call."""
    return check_backend(os.environ.get(ENV_BACKEND, "auto"), f"${ENV_BACKEND}")


def set_default_backend(name: str | None) -> None:
    """Set (``None``: clear) ``$GRT_CASCADE_BACKEND`` for this process.  Prefer ``monkeypatch.setenv`` in
    tests and :func:`apply_settings` in code; kept so existing callers work."""
    if name is None:
        os.environ.pop(ENV_BACKEND, None)
    else:
        os.environ[ENV_BACKEND] = check_backend(name)


@dataclass(frozen=True)
class BackendSettings:
    """How one cascade (or fused FFN) runs.  Tile sizes were measured with ``python -m lm.bench`` on a
    2-core Sapphire Rapids: every inner loop runs over a tile's tokens, and each (pair, loop) pays a fixed
    set-up (LLVM's overlap checks, per-pair sums), so long tiles win even past the L2 size; the coupled
    tile also sets the coupling GEMMs' width (``[P, 4P] x [4P, tt]``), where BLAS needs >= 64 columns."""

    backend: str = "auto"  # "auto" | "fused" | "eager"; "auto" follows $GRT_CASCADE_BACKEND, then the rules below
    tile_tokens: int = 128  # coupling-off cascades
    coupled_tile_tokens: int = 128  # coupled cascades
    ffn_tile_tokens: int = 128  # the fused FFN
    scratch_bytes: int = 3 << 19  # per-thread backward scratch (1.5 MB); past it: checkpointed segments
    backward: str = "auto"  # coupling-off backward: "auto" inverts stages (drift-checked, else stores); "store"
    auto_min_tokens: int = 512  # "auto" runs eager below this many tokens: small calls (sampling, tiny tests) never
    # pay the kernels' one-time compile (~1 min per dtype, cached on disk afterwards).  Measured (shipped
    # widths, fwd+bwd, 1 thread): fused beats eager from 64 tokens on (Q/K/V 4x, FFN 6x; the mixer at parity below
    # 256); 512 keeps a two-process data-parallel shard of the trainer's 16 x 64 batch on the kernels (it was 1024:
    # each torchrun rank ran its cascades eager, 6x slower)
    auto_min_stages: int = 1  # "auto" runs cascades of fewer stages eager
    angle_bytes_per_token: int = 6144  # coupled cascades: bytes per token of per-stage angle nudges the forward
    # may keep for the backward (the last stages first).  A kept stage skips its coupling GEMM in the backward's
    # recompute (4 -> 3 GEMMs); 4 * heads * P bytes per stage: all 11 stages of one 4-head projection at
    # d_head 64 (5.6 KB), 4 of the 11 of the 12-head Q/K/V call.  0: keep nothing (the memory-lean backward).

    def __post_init__(self) -> None:
        check_backend(self.backend)
        if self.backward not in BACKWARD_MODES:
            raise ValueError(f"backward must be 'auto' (invert, drift-checked) or 'store'; got {self.backward!r}")
        for name in ("tile_tokens", "coupled_tile_tokens", "ffn_tile_tokens", "scratch_bytes", "auto_min_stages"):
            if not 1 <= getattr(self, name) <= 1 << 30:
                raise ValueError(f"{name} must be in [1, 2^30], got {getattr(self, name)!r}")
        for name in ("auto_min_tokens", "angle_bytes_per_token"):
            if not 0 <= getattr(self, name) <= 1 << 30:
                raise ValueError(f"{name} must be in [0, 2^30], got {getattr(self, name)!r}")

    def resolved(self) -> str:
        """``"fused"``, ``"eager"`` or ``"auto"`` after the environment default."""
        return env_backend() if self.backend == "auto" else self.backend

    def stored_stages(self, heads: int, pairs: int, stages: int, itemsize: int) -> int:
        """How many (trailing) stages of a coupled cascade keep their angle nudges within the budget."""
        return min(stages, self.angle_bytes_per_token // max(1, heads * pairs * itemsize))


@dataclass
class FusedStats:
    """Counts of the fused backward's coupling-off cascade passes (per tile and head) and of those that fell
    back from inversion to storing because the inversion drifted (ill-conditioned scales)."""

    backward_passes: int = 0
    stored_passes: int = 0

    def reset(self) -> None:
        self.backward_passes = self.stored_passes = 0


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
    """The numba kernel module (imported on first use) and the worker threads that run its tile chunks.

    Where the kernels cannot be imported (no numba) or compiled, :meth:`mark_unavailable` logs one notice
    (logger ``grt_model.fused``, WARNING) and every cascade using this runtime runs eager from then on.
    Pickling or deep-copying a module that holds it yields the shared :func:`default_runtime`.
    """

    def __init__(self) -> None:
        self._kernels: Any = None  # the module, or False once it proved unavailable
        self.unavailable_reason = ""
        self._pool: ThreadPoolExecutor | None = None

    def __reduce__(self):
        return (default_runtime, ())

    def mark_unavailable(self, reason: str) -> None:
        self._kernels = False
        self.unavailable_reason = reason
        log.warning("grt_model: fused rotation-cascade kernels unavailable (%s); using the eager PyTorch path",
                    reason)

    def kernels(self) -> Any:
        """The numba kernel module; ``None`` where it is unavailable."""
        if self._kernels is None:
            try:
                from grt_model import fused_kernels

                self._kernels = fused_kernels
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


@lru_cache(maxsize=1)
def default_runtime() -> KernelRuntime:
    """The runtime every cascade uses unless given its own (created on first use)."""
    return KernelRuntime()


def apply_settings(module: nn.Module, settings: BackendSettings | None = None, **changes: Any) -> nn.Module:
    """Give every cascade and fused FFN in ``module`` ``settings`` (or its own settings with ``changes``,
    e.g. ``apply_settings(model, backend="eager")``); returns ``module``."""
    for m in module.modules():
        if isinstance(getattr(m, "settings", None), BackendSettings):
            m.settings = dataclasses.replace(settings or m.settings, **changes)
    return module
