r"""The fused CPU path of the rotation cascade: numba kernels behind ``torch.autograd.Function``\ s.

Three backends compute the same function (tested equal, values and gradients):

* ``"eager"`` -- the vectorized PyTorch code in :mod:`grt_model.cascade` (any device, any dtype,
  differentiable to any order, works under ``torch.func``);
* ``"fused"`` -- :mod:`grt_model.fused_kernels`: all stages of a cascade run over a tile of tokens
  while it stays in cache; the backward saves only the cascade's *input* and recomputes the stage
  inputs tile by tile (coupling off: by inverting each stage, drift-checked), so training memory is
  one activation per cascade, what a dense ``nn.Linear`` saves;
* ``"auto"`` (the default) -- ``"fused"`` where it applies (numba importable, CPU tensors, float32
  or float64, no ``torch.func`` transform active, at least ``SETTINGS.auto_min_tokens`` tokens),
  ``"eager"`` elsewhere (CUDA always runs eager).

The module default comes from :func:`set_default_backend` or the environment variable
``GRT_CASCADE_BACKEND`` (``auto`` | ``fused`` | ``eager``).  Where the kernels cannot be imported
(no numba) or compiled, one notice is logged (logger ``grt_model.fused``, level WARNING) and every
cascade runs eager from then on.  The kernels compile on first use (about a minute for both dtypes)
and are cached next to the module (numba ``cache=True``).  Threads: ``torch.get_num_threads()`` chunks
of tiles run on a small thread pool (the kernels release the GIL); the parameter gradients are summed
in chunk order, so results are deterministic for a given thread count.

:func:`fused_ffn` fuses the whole coupling-off FFN (zero pad, expand cascade, RadialGELU, contract
cascade, keep the first ``d_out`` coordinates) into one kernel per direction and skips the pairs the
padding keeps at zero and the pairs that never reach a kept coordinate -- both exactly (their values
are zero or unused), which removes about 30% of the FFN's stage work at the reference sizes.

A backward run with ``create_graph=True`` (double backward) is rerouted through the eager graph,
so higher derivatives stay available.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from grt_model.butterfly import butterfly_pairs
from rmsgauge.tolerance import tolerance

if TYPE_CHECKING:  # pragma: no cover
    from grt_model.cascade import RotationCascade

BACKENDS = ("auto", "fused", "eager")
ENV_BACKEND = "GRT_CASCADE_BACKEND"
log = logging.getLogger(__name__)


@dataclass
class FusedSettings:
    """Knobs of the fused kernels (``fused.SETTINGS``; tests and the benchmark change them)."""

    # Tile sizes (tokens per tile), measured with python -m lm.bench on a 2-core Sapphire Rapids: every
    # inner loop runs over the tile's tokens, and each (pair, loop) pays a fixed set-up (LLVM's overlap checks,
    # the per-pair sums), so long tiles win even past the L2 size.
    tile_tokens: int = 128  # coupling-off cascades
    coupled_tile_tokens: int = 64  # coupled cascades (also amortizes the per-stage BLAS calls)
    ffn_tile_tokens: int = 128  # the fused FFN
    scratch_bytes: int = 3 << 19  # per-thread backward scratch of a coupled cascade (1.5 MB; more: checkpoints)
    backward: str = "auto"  # coupling-off backward: "auto" inverts stages (drift-checked, else stores); "store"
    auto_min_tokens: int = 1024  # "auto" runs eager below this many tokens: small calls gain little, and never
    # pay the kernels' one-time compile (~1 min per dtype, cached on disk afterwards)
    auto_min_stages: int = 1  # "auto" runs cascades of fewer stages eager.  Trade-off measured on the mixer (one
    # coupled stage, 8,192 tokens): eager is 1.8x faster (10.3 vs 18.5 us/token f+b; GRT block step 133 vs 166
    # us/token) but saves 8 KB/token instead of 1, which lifts the block's training memory above the dense block's
    # (30.4 vs 23.9 KB/token).  Default 1 keeps the memory target; set 2 to trade memory for speed.


SETTINGS = FusedSettings()
_default_backend: str | None = None
_kernels: Any = None  # the kernel module, or False once it proved unavailable
_unavailable_reason = ""


def check_backend(name: Any, what: str = "backend") -> str:
    if name not in BACKENDS:
        raise ValueError(f"{what} must be one of {', '.join(BACKENDS)}; got {name!r}")
    return name


def default_backend() -> str:
    """The backend ``"auto"`` resolves through: :func:`set_default_backend`, else ``$GRT_CASCADE_BACKEND``."""
    if _default_backend is not None:
        return _default_backend
    return check_backend(os.environ.get(ENV_BACKEND, "auto"), f"${ENV_BACKEND}")


def set_default_backend(name: str | None) -> None:
    """Set the process-wide default (``None`` returns to ``$GRT_CASCADE_BACKEND`` / ``"auto"``)."""
    global _default_backend
    _default_backend = None if name is None else check_backend(name)


def _mark_unavailable(reason: str) -> None:
    global _kernels, _unavailable_reason
    _kernels = False
    _unavailable_reason = reason
    log.warning("grt_model: fused rotation-cascade kernels unavailable (%s); using the eager PyTorch path", reason)


def kernels() -> Any:
    """The numba kernel module, importing it on first use; ``None`` where it is unavailable."""
    global _kernels
    if _kernels is None:
        try:
            from grt_model import fused_kernels

            _kernels = fused_kernels
        except Exception as e:  # ImportError without numba; anything numba raises while loading its cache
            _mark_unavailable(f"{type(e).__name__}: {e}")
    return _kernels or None


def fused_available() -> bool:
    return kernels() is not None


def unavailable_reason() -> str:
    return _unavailable_reason


def _plain(t: torch.Tensor | None) -> bool:
    return t is None or not torch._C._functorch.is_functorch_wrapped_tensor(t)


def use_fused(backend: str, x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether a call with this backend request and these tensors runs the fused kernels."""
    b = default_backend() if backend == "auto" else backend
    if b == "eager" or x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    if b == "auto" and x.numel() < SETTINGS.auto_min_tokens * max(1, x.shape[-1]):
        return False
    if b == "auto" and params and params[0] is not None and params[0].shape[-2] < SETTINGS.auto_min_stages:
        return False  # params[0] is the angles tensor, [H, S, P]
    if any(p is not None and (p.dtype != x.dtype or p.device != x.device) for p in params):
        return False  # mixed dtypes: the eager path's type promotion decides
    if not all(_plain(t) for t in (x, *params)):
        return False  # torch.func transforms need the eager graph
    return fused_available()


_pool: ThreadPoolExecutor | None = None


def _chunks(n_items: int, tt: int) -> list[tuple[int, int]]:
    """Split the ``ceil(n_items / tt)`` tiles into one contiguous range per thread (``torch.get_num_threads()``).

    The kernels release the GIL, so plain Python threads run the chunks in parallel; each chunk owns its
    parameter-gradient buffers and the caller sums them in chunk order (deterministic for a given thread count).
    """
    ntiles = (n_items + tt - 1) // tt
    n = max(1, min(torch.get_num_threads(), ntiles))
    return [(c * ntiles // n, (c + 1) * ntiles // n) for c in range(n)]


def _single_thread_blas() -> None:
    """Pool-thread initializer: the coupled kernels' ``np.dot`` calls go to OpenBLAS, which would fan each call
    out over all cores while every core already runs a kernel; one BLAS thread per kernel thread instead
    (``openblas_set_num_threads_local``, a thread-local setting of OpenBLAS >= 0.3.27; best effort)."""
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


def _launch(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run the chunk jobs, one per thread of a shared pool (the caller waits, even for one job: the pool's
    threads use one BLAS thread each, so a call never uses more threads than ``torch.get_num_threads()``);
    their results in order."""
    global _pool
    if _pool is None or _pool._max_workers < len(jobs):
        _pool = ThreadPoolExecutor(max_workers=max(len(jobs), os.cpu_count() or 1), thread_name_prefix="grt-fused",
                                   initializer=_single_thread_blas)
    return [f.result() for f in [_pool.submit(j) for j in jobs]]


@dataclass
class FusedStats:
    """Counts of the fused backward's cascade passes (per tile and head) and of those that fell back from
    inversion to storing because the inversion drifted (ill-conditioned scales)."""

    backward_passes: int = 0
    stored_passes: int = 0

    def reset(self) -> None:
        self.backward_passes = self.stored_passes = 0


STATS = FusedStats()


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


@lru_cache(maxsize=128)
def pair_tables(width: int, first_stage: int, n_stages: int) -> tuple[np.ndarray, np.ndarray]:
    """``(i0, i1)``, each ``[S, P]`` int64: the coordinates of every stage's pairs (the butterfly wiring)."""
    pairs = np.array([butterfly_pairs(width, first_stage + s) for s in range(n_stages)], dtype=np.int64)
    return np.ascontiguousarray(pairs[..., 0]), np.ascontiguousarray(pairs[..., 1])  # (S, P) each


@lru_cache(maxsize=64)
def ffn_active_pairs(width: int, n_expand: int, n_contract: int, d_in: int, d_out: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``(expand [S1, P], contract [S2, P])`` uint8 masks of the pairs the fused FFN must compute.

    Expand: a pair is live iff one of its coordinates can be nonzero, starting from ``[0, d_in)``
    (the zero padding stays exactly zero until a stage pairs it with a live coordinate).  Contract,
    walking back from the kept ``[0, d_out)``: a pair is live iff one of its outputs is needed.
    """
    i0e, i1e = pair_tables(width, 0, n_expand)
    live = np.zeros(width, dtype=bool)
    live[:d_in] = True
    eact = np.zeros(i0e.shape, dtype=np.uint8)
    for s in range(n_expand):
        a = live[i0e[s]] | live[i1e[s]]
        eact[s] = a
        live[i0e[s][a]] = live[i1e[s][a]] = True
    i0c, i1c = pair_tables(width, 0, n_contract)
    need = np.zeros(width, dtype=bool)
    need[:d_out] = True
    cact = np.zeros(i0c.shape, dtype=np.uint8)
    for s in range(n_contract - 1, -1, -1):
        a = need[i0c[s]] | need[i1c[s]]
        cact[s] = a
        need = np.zeros(width, dtype=bool)
        need[i0c[s][a]] = need[i1c[s][a]] = True
    return eact, cact


def segment_length(steps: int, bytes_per_step: int) -> int:
    """Stages per backward segment: all of them when their inputs fit ``SETTINGS.scratch_bytes`` (no extra
    forward), else ``ceil(sqrt(steps))`` (checkpoints plus one segment: O(sqrt(steps)) buffers, one extra forward)."""
    if (steps + 4) * bytes_per_step <= SETTINGS.scratch_bytes:
        return steps
    return max(1, int(np.ceil(np.sqrt(steps))))


def _try_inversion() -> bool:
    return check_backend_mode(SETTINGS.backward) == "auto"


def check_backend_mode(mode: Any) -> str:
    if mode not in ("auto", "store"):
        raise ValueError(f"SETTINGS.backward must be 'auto' (invert, drift-checked) or 'store'; got {mode!r}")
    return mode


def _tiny(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).tiny)


# ---------------------------------------------------------------------------------------------------
# The cascade
# ---------------------------------------------------------------------------------------------------


def stage_maps(angles: torch.Tensor, raw_scales: torch.Tensor) -> torch.Tensor:
    r"""``[..., P, 4]``: each pair's 2x2 map :math:`D R(\theta)` row-major, ``(s0 c, -s0 s, s1 s, s1 c)``.

    The coupling-off kernels run on these four numbers; their gradient (``sum_t g x^T``, from the kernel)
    goes back to the angle and the raw scales through autograd on this function.
    """
    s = F.softplus(raw_scales)  # (..., P, 2)
    c, sn = torch.cos(angles), torch.sin(angles)
    return torch.stack((s[..., 0] * c, -s[..., 0] * sn, s[..., 1] * sn, s[..., 1] * c), dim=-1)


def stage_inverse_maps(angles: torch.Tensor, raw_scales: torch.Tensor) -> torch.Tensor:
    r"""``[..., P, 4]``: :math:`(D R)^{-1} = R^\top D^{-1}` row-major, ``(c/s0, s/s1, -s/s0, c/s1)``."""
    s = F.softplus(raw_scales)  # (..., P, 2)
    c, sn = torch.cos(angles), torch.sin(angles)
    return torch.stack((c / s[..., 0], sn / s[..., 1], -sn / s[..., 0], c / s[..., 1]), dim=-1)


def drift_tolerance(dtype: torch.dtype, steps: int) -> float:
    """Relative drift allowed for the inversion backward over ``steps`` stages: the suite's tolerance for a
    ``steps``-deep computation (:func:`rmsgauge.tolerance`); beyond it the tile is redone by storing."""
    return tolerance(dtype, depth=max(1, steps)).rtol


def _maps_vjp(angles: torch.Tensor, raw_scales: torch.Tensor, gm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain ``dL/dM`` (``gm [..., P, 4]``) to ``(dL/dangles, dL/draw_scales)``."""
    with torch.enable_grad():
        a = angles.detach().requires_grad_(True)
        r = raw_scales.detach().requires_grad_(True)
        return torch.autograd.grad(stage_maps(a, r), (a, r), gm.to(angles.dtype))


def _grad_chunks(C: int, *shape: int) -> torch.Tensor:
    """Per-chunk gradient sums: float64 whatever the activation dtype (the tile sums are added in here)."""
    return torch.zeros(C, *shape, dtype=torch.float64)


class _CascadeFn(torch.autograd.Function):
    """``y = C(x)`` for ``x [N, H*W]``: fused forward; backward recomputes from the saved input."""

    @staticmethod
    def forward(ctx, x, angles, raw_scales, coupling, width, first_stage):
        k = kernels()
        i0, i1 = pair_tables(width, first_stage, angles.shape[1])
        out = torch.empty(x.shape[0], angles.shape[0] * width, dtype=x.dtype)  # (N, H*W); x may hold fewer heads
        if coupling is None:
            tt = SETTINGS.tile_tokens
            run = partial(k.rot_cascade_fwd, _np(x), out.numpy(), i0, i1, _np(stage_maps(angles, raw_scales)), tt)
        else:
            tt = SETTINGS.coupled_tile_tokens
            cs, sn, sc = _np(torch.cos(angles)), _np(torch.sin(angles)), _np(F.softplus(raw_scales))
            run = partial(k.coupled_cascade_fwd, _np(x), out.numpy(), i0, i1, _np(angles), cs, sn, sc,
                          _np(coupling.transpose(-1, -2)), x.dtype == torch.float64, _tiny(x.dtype), tt)
        _launch([partial(run, lo, hi) for lo, hi in _chunks(x.shape[0], tt)])
        ctx.save_for_backward(x, angles, raw_scales, coupling)
        ctx.width, ctx.first_stage = width, first_stage
        return out

    @staticmethod
    def backward(ctx, gy):
        x, angles, raw_scales, coupling = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the eager graph instead
            return _eager_vjp(x, angles, raw_scales, coupling, ctx, gy)
        try:
            return _CascadeFn._fused_backward(ctx, x, angles, raw_scales, coupling, gy)
        except Exception as e:
            if not _compile_failed(e):
                raise
            with torch.enable_grad():
                return _eager_vjp(*(t.detach().requires_grad_(t.requires_grad) if t is not None else None
                                    for t in (x, angles, raw_scales, coupling)), ctx, gy)

    @staticmethod
    def _fused_backward(ctx, x, angles, raw_scales, coupling, gy):
        k = kernels()
        H, S, P = angles.shape
        i0, i1 = pair_tables(ctx.width, ctx.first_stage, S)
        gx = torch.zeros_like(x)  # the kernels add: cascade heads sharing an input head sum their gradients
        xa, gya, item = _np(x), _np(gy), x.element_size()
        if coupling is None:
            tt = SETTINGS.tile_tokens
            chunks = _chunks(x.shape[0], tt)
            gm = _grad_chunks(len(chunks), H, S, P, 4)
            gma = gm.numpy()
            run = partial(k.rot_cascade_bwd, xa, gya, gx.numpy(), i0, i1, _np(stage_maps(angles, raw_scales)),
                          _np(stage_inverse_maps(angles, raw_scales)), tt, segment_length(S, 2 * P * tt * item),
                          drift_tolerance(x.dtype, S), _try_inversion())
            stored = _launch([partial(run, lo, hi, gma[c]) for c, (lo, hi) in enumerate(chunks)])
            STATS.backward_passes += H * ((x.shape[0] + tt - 1) // tt)
            STATS.stored_passes += sum(stored)
            g_ang, g_raw = _maps_vjp(angles, raw_scales, gm.sum(0))
            return gx, g_ang, g_raw, None, None, None
        tt = SETTINGS.coupled_tile_tokens
        chunks = _chunks(x.shape[0], tt)
        C = len(chunks)
        gth, gsc, gw = _grad_chunks(C, H, S, P), _grad_chunks(C, H, S, P, 2), _grad_chunks(C, H, S, 4 * P, P)
        cs, sn, sc = _np(torch.cos(angles)), _np(torch.sin(angles)), _np(F.softplus(raw_scales))
        per_stage = (9 * P + 3) * tt * item  # records: the stage's pairs [2P], features [4P], cos, sin, 1-tanh^2, m
        run = partial(k.coupled_cascade_bwd, xa, gya, gx.numpy(), i0, i1, _np(angles), cs, sn, sc, _np(coupling),
                      _np(coupling.transpose(-1, -2)), x.dtype == torch.float64, _tiny(x.dtype), tt,
                      segment_length(S, per_stage))
        bufs = [a.numpy() for a in (gth, gsc, gw)]
        _launch([partial(run, lo, hi, *(b[c] for b in bufs)) for c, (lo, hi) in enumerate(chunks)])
        g_raw = gsc.sum(0).to(x.dtype) * torch.sigmoid(raw_scales.detach())  # d softplus / d raw = sigmoid
        return gx, gth.sum(0).to(x.dtype), g_raw, gw.sum(0).to(x.dtype), None, None


def _eager_vjp(x, angles, raw_scales, coupling, ctx, gy):
    from grt_model.cascade import cascade_eager

    ins = [t for t in (x, angles, raw_scales, coupling) if t is not None and t.requires_grad]
    y = cascade_eager(x, angles, raw_scales, coupling, ctx.width, ctx.first_stage)
    grads = iter(torch.autograd.grad(y, ins, gy, create_graph=True, allow_unused=True))
    out = [next(grads) if t is not None and t.requires_grad else None for t in (x, angles, raw_scales, coupling)]
    return (*out, None, None)


def _compile_failed(e: BaseException) -> bool:
    """Whether ``e`` is numba failing to compile a kernel (then: notice, and eager from here on)."""
    k = kernels()
    if k is None or not isinstance(e, k.nb.core.errors.NumbaError):
        return False
    _mark_unavailable(f"numba could not compile the kernels: {type(e).__name__}: {str(e).splitlines()[0]}")
    return True


def cascade_fused(cascade: RotationCascade, x: torch.Tensor) -> torch.Tensor:
    """Apply ``cascade`` to ``x [..., Hin*W]`` (``Hin`` dividing ``H``) with the fused kernels (the caller
    checked :func:`use_fused`); eager, after one notice, if numba cannot compile them."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).contiguous()  # (N, Hin*W)
    args = (cascade.angles, cascade.raw_scales, cascade.coupling, cascade.width, cascade.first_stage)
    try:
        y = _CascadeFn.apply(x2, *args)
    except Exception as e:
        if not _compile_failed(e):
            raise
        from grt_model.cascade import cascade_eager

        y = cascade_eager(x2, *args)
    return y.reshape(*lead, cascade.heads * cascade.width)


# ---------------------------------------------------------------------------------------------------
# The fused coupling-off FFN
# ---------------------------------------------------------------------------------------------------


class _FFNFn(torch.autograd.Function):
    """The fused coupling-off FFN; parameters ``[1, S, P]`` / ``[1, S, P, 2]`` as the cascades store them.

    Saves the input and the GELU's ``Phi`` per pair and token (half an activation of width ``d_ff``, stored
    per tile): the backward recomputes the rotations and ``phi(r)/r`` (one exp per pair), never an erf.
    """

    @staticmethod
    def _geometry(z, e_angles, c_angles, d_out):
        S1, P = e_angles.shape[1:]
        S2, W = c_angles.shape[1], 2 * P
        eact, cact = ffn_active_pairs(W, S1, S2, z.shape[1], d_out)
        return (*pair_tables(W, 0, S1), eact, *pair_tables(W, 0, S2), cact)

    @staticmethod
    def forward(ctx, z, e_angles, e_raw, c_angles, c_raw, d_out, save):
        k = kernels()
        i0e, i1e, eact, i0c, i1c, cact = _FFNFn._geometry(z, e_angles, c_angles, d_out)
        tt = SETTINGS.ffn_tile_tokens
        P = e_angles.shape[-1]
        out = torch.empty(z.shape[0], d_out, dtype=z.dtype)
        ntiles = (z.shape[0] + tt - 1) // tt
        rec = torch.empty(ntiles if save else 1, P, tt, dtype=z.dtype)  # the GELU's Phi per tile (tiles, P, tt)
        run = partial(k.ffn_fwd, _np(z), out.numpy(), i0e, i1e, _np(stage_maps(e_angles[0], e_raw[0])), eact,
                      i0c, i1c, _np(stage_maps(c_angles[0], c_raw[0])), cact, z.dtype == torch.float64, save,
                      rec.numpy(), tt)
        _launch([partial(run, lo, hi) for lo, hi in _chunks(z.shape[0], tt)])
        ctx.save_for_backward(z, e_angles, e_raw, c_angles, c_raw, rec)
        ctx.d_out, ctx.tt, ctx.saved_rec = d_out, tt, save
        return out

    @staticmethod
    def backward(ctx, gy):
        z, e_angles, e_raw, c_angles, c_raw, rec = ctx.saved_tensors
        params = (z, e_angles, e_raw, c_angles, c_raw)
        if torch.is_grad_enabled():  # create_graph=True: differentiate the eager graph instead
            ins = [t for t in params if t.requires_grad]
            y = ffn_eager_functional(*params, ctx.d_out)
            grads = iter(torch.autograd.grad(y, ins, gy, create_graph=True, allow_unused=True))
            return (*[next(grads) if t.requires_grad else None for t in params], None, None)
        if not ctx.saved_rec:
            raise RuntimeError("fused_ffn: backward through a call made without grad (no GELU records saved)")
        try:
            return _FFNFn._fused_backward(ctx, gy)
        except Exception as e:
            if not _compile_failed(e):
                raise
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_(t.requires_grad) for t in params]
                y = ffn_eager_functional(*leaves, ctx.d_out)
                ins = [t for t in leaves if t.requires_grad]
                grads = iter(torch.autograd.grad(y, ins, gy, allow_unused=True))
                return (*[next(grads) if t.requires_grad else None for t in leaves], None, None)

    @staticmethod
    def _fused_backward(ctx, gy):
        z, e_angles, e_raw, c_angles, c_raw, rec = ctx.saved_tensors
        k = kernels()
        i0e, i1e, eact, i0c, i1c, cact = _FFNFn._geometry(z, e_angles, c_angles, ctx.d_out)
        S1, P = e_angles.shape[1:]
        S2 = c_angles.shape[1]
        tt = ctx.tt
        chunks = _chunks(z.shape[0], tt)
        egm, cgm = _grad_chunks(len(chunks), S1, P, 4), _grad_chunks(len(chunks), S2, P, 4)
        gz = torch.empty_like(z)
        seg = segment_length(max(S1, S2), 2 * P * tt * z.element_size())
        run = partial(k.ffn_bwd, _np(z), _np(rec), _np(gy), gz.numpy(), i0e, i1e,
                      _np(stage_maps(e_angles[0], e_raw[0])), _np(stage_inverse_maps(e_angles[0], e_raw[0])), eact,
                      i0c, i1c, _np(stage_maps(c_angles[0], c_raw[0])), _np(stage_inverse_maps(c_angles[0], c_raw[0])),
                      cact, z.dtype == torch.float64, tt, seg, drift_tolerance(z.dtype, max(S1, S2)),
                      _try_inversion())
        ega, cga = egm.numpy(), cgm.numpy()
        stored = _launch([partial(run, lo, hi, ega[c], cga[c]) for c, (lo, hi) in enumerate(chunks)])
        STATS.backward_passes += 2 * ((z.shape[0] + tt - 1) // tt)
        STATS.stored_passes += sum(stored)
        g_ea, g_er = _maps_vjp(e_angles, e_raw, egm.sum(0)[None])
        g_ca, g_cr = _maps_vjp(c_angles, c_raw, cgm.sum(0)[None])
        return gz, g_ea, g_er, g_ca, g_cr, None, None


def ffn_eager_functional(z: torch.Tensor, e_angles: torch.Tensor, e_raw: torch.Tensor, c_angles: torch.Tensor,
                         c_raw: torch.Tensor, d_out: int) -> torch.Tensor:
    """The eager composition :func:`fused_ffn` computes: pad, expand, RadialGELU, contract, keep ``d_out``."""
    from grt_model.cascade import cascade_eager
    from grt_model.radial_gelu import radial_gelu

    W = 2 * e_angles.shape[-1]
    h = F.pad(z, (0, W - z.shape[-1]))  # (..., W): signal in the first d_in coordinates
    h = radial_gelu(cascade_eager(h, e_angles, e_raw, None, W, 0))
    return cascade_eager(h, c_angles, c_raw, None, W, 0)[..., :d_out]


def _check_ffn(z: torch.Tensor, expand: RotationCascade, contract: RotationCascade, d_out: int) -> None:
    for name, c in (("expand", expand), ("contract", contract)):
        if c.heads != 1 or c.first_stage != 0 or c.coupling is not None:
            raise ValueError(f"fused_ffn: {name} must be a single-head coupling-off cascade with first_stage=0 "
                             f"(got heads={c.heads}, first_stage={c.first_stage}, coupling={c.coupling is not None})")
    if expand.width != contract.width:
        raise ValueError(f"fused_ffn: expand and contract widths differ ({expand.width} vs {contract.width})")
    if not 1 <= z.shape[-1] <= expand.width:
        raise ValueError(f"fused_ffn: input width must be in [1, {expand.width}], got shape {tuple(z.shape)}")
    if not 1 <= d_out <= expand.width:
        raise ValueError(f"fused_ffn: d_out must be in [1, {expand.width}], got {d_out}")


def fused_ffn(z: torch.Tensor, expand: RotationCascade, contract: RotationCascade, d_out: int | None = None,
              backend: str = "auto") -> torch.Tensor:
    r""":math:`\Pi\,C_2(\operatorname{RadialGELU}(C_1(\Pi^\top z)))` for ``z [..., d_in]``, ``[..., d_out]`` out.

    ``Pi^T`` zero-pads to the cascades' width, ``Pi`` keeps the first ``d_out`` coordinates
    (default ``d_in``): the GRT FFN of :class:`grt_model.model.GRTFFN`.  Runs one fused kernel per
    direction where :func:`use_fused` allows, else the eager composition.
    """
    d_out = z.shape[-1] if d_out is None else d_out
    _check_ffn(z, expand, contract, d_out)
    params = (expand.angles, expand.raw_scales, contract.angles, contract.raw_scales)
    if not use_fused(check_backend(backend), z, *params):
        return ffn_eager_functional(z, *params, d_out)
    lead = z.shape[:-1]
    save = torch.is_grad_enabled() and any(t.requires_grad for t in (z, *params))
    try:
        y = _FFNFn.apply(z.reshape(-1, z.shape[-1]).contiguous(), *params, d_out, save)
    except Exception as e:
        if not _compile_failed(e):
            raise
        return ffn_eager_functional(z, *params, d_out)
    return y.reshape(*lead, d_out)
