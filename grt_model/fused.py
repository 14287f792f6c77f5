r"""The fused CPU path of the rotation cascade: numba kernels behind ``torch.autograd.Function``\ s.

Three backends compute the same function (tested equal, values and gradients):

* ``"eager"`` -- the vectorized PyTorch code in :mod:`grt_model.cascade_ops` (any device, any dtype,
  differentiable to any order, works under ``torch.func``);
* ``"fused"`` -- :mod:`grt_model.fused_kernels`: all stages of a cascade run over a tile of tokens
  while it stays in cache.  Coupling off, the backward saves only the cascade's input and recovers the
  stage inputs by inverting each stage (drift-checked).  Coupled, the forward also keeps the angle nudges
  ``tanh(F W)`` of the last stages that fit ``BackendSettings.angle_bytes_per_token`` (4 bytes per pair,
  head and stage in float32), so the backward's rebuild of those stages skips their coupling GEMM: 3
  coupling GEMMs per stage in a training step instead of 4;
* ``"auto"`` (the default) -- ``"fused"`` where it applies (numba importable, CPU tensors, float32
  or float64, no ``torch.func`` transform active, at least ``auto_min_tokens`` tokens and
  ``auto_min_stages`` stages), ``"eager"`` elsewhere (CUDA always runs eager).

Every cascade carries its own :class:`~grt_model.backend.BackendSettings` (``cascade.settings``; the
process-wide default for ``"auto"`` is ``$GRT_CASCADE_BACKEND``), :class:`~grt_model.backend.FusedStats`
and :class:`~grt_model.backend.KernelRuntime` (the shared one unless given): no module-level mutable state.
Where the kernels cannot be imported (no numba) or compiled, the runtime logs one notice (logger
``grt_model.fused``, level WARNING) and runs eager from then on.  The kernels compile on first use (about a
minute for both dtypes) and are cached on disk by numba, keyed on a hash of *every* kernel source
(:mod:`grt_model.kernels_jit`: an edit to any ``kernels_*.py`` recompiles every kernel).  Threads:
``torch.get_num_threads()`` chunks of tiles run on the runtime's worker threads (the kernels release the
GIL); parameter gradients are summed in chunk order, so results are deterministic for a given thread count.

:func:`fused_ffn` fuses the whole coupling-off FFN (zero pad, expand cascade, RadialGELU, contract
cascade, keep the first ``d_out`` coordinates) into one kernel per direction and skips the pairs the
padding keeps at zero and the pairs that never reach a kept coordinate -- both exactly (their values
are zero or unused), which removes about 30% of the FFN's stage work at the reference sizes.

A backward run with ``create_graph=True`` (double backward) is rerouted through the eager graph,
so higher derivatives stay available.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache, partial
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from grt_model.backend import (
    BACKENDS,
    ENV_BACKEND,
    BackendSettings,
    FusedStats,
    KernelRuntime,
    check_backend,
    default_runtime,
    env_backend,
    set_default_backend,
)
from grt_model.butterfly import butterfly_pairs
from grt_model.cascade_ops import cascade_eager, ffn_eager, stage_inverse_maps, stage_maps
from rmsgauge.tolerance import tolerance

if TYPE_CHECKING:  # pragma: no cover
    from grt_model.cascade import RotationCascade

__all__ = ["BACKENDS", "ENV_BACKEND", "BackendSettings", "FusedStats", "KernelRuntime", "cascade_fused",
           "check_backend", "default_runtime", "env_backend", "fused_available", "fused_ffn", "set_default_backend",
           "use_fused"]


def fused_available(runtime: KernelRuntime | None = None) -> bool:
    """Whether the numba kernels load (in ``runtime``, default the shared one)."""
    return (runtime or default_runtime()).available()


def _plain(t: torch.Tensor | None) -> bool:
    return t is None or not torch._C._functorch.is_functorch_wrapped_tensor(t)


def use_fused(settings: BackendSettings, x: torch.Tensor, *params: torch.Tensor | None,
              runtime: KernelRuntime | None = None) -> bool:
    """Whether a call with these settings and tensors runs the fused kernels (``params[0]``: the angles
    ``[H, S, P]``)."""
    b = settings.resolved()
    if b == "eager" or x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    if b == "auto" and x.numel() < settings.auto_min_tokens * max(1, x.shape[-1]):
        return False
    if b == "auto" and params and params[0] is not None and params[0].shape[-2] < settings.auto_min_stages:
        return False
    if any(p is not None and (p.dtype != x.dtype or p.device != x.device) for p in params):
        return False  # mixed dtypes: the eager path's type promotion decides
    if not all(_plain(t) for t in (x, *params)):
        return False  # torch.func transforms need the eager graph
    return fused_available(runtime)


def _chunks(n_items: int, tt: int) -> list[tuple[int, int]]:
    """Split the ``ceil(n_items / tt)`` tiles into one contiguous range per thread (``torch.get_num_threads()``).

    The kernels release the GIL, so plain Python threads run the chunks in parallel; each chunk owns its
    parameter-gradient buffers and the caller sums them in chunk order (deterministic for a given thread count).
    """
    ntiles = (n_items + tt - 1) // tt
    n = max(1, min(torch.get_num_threads(), ntiles))
    return [(c * ntiles // n, (c + 1) * ntiles // n) for c in range(n)]


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


def segment_length(steps: int, bytes_per_step: int, scratch_bytes: int) -> int:
    """Stages per backward segment: all of them when their inputs fit ``scratch_bytes`` (no extra forward),
    else ``ceil(sqrt(steps))`` (checkpoints plus one segment: O(sqrt(steps)) buffers, one extra forward)."""
    if (steps + 4) * bytes_per_step <= scratch_bytes:
        return steps
    return max(1, int(np.ceil(np.sqrt(steps))))


def _tiny(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).tiny)


def drift_tolerance(dtype: torch.dtype, steps: int) -> float:
    """Relative drift allowed for the inversion backward over ``steps`` stages: the suite's tolerance for a
    ``steps``-deep computation (:func:`rmsgauge.tolerance`); beyond it the tile is redone by storing."""
    return tolerance(dtype, depth=max(1, steps)).rtol


# ---------------------------------------------------------------------------------------------------
# The cascade
# ---------------------------------------------------------------------------------------------------


class _Plan:
    """What one fused call runs with: the settings, the kernel runtime, the counters (not tensors: autograd
    passes them through and returns ``None`` for them)."""

    __slots__ = ("runtime", "settings", "stats")

    def __init__(self, settings: BackendSettings, runtime: KernelRuntime, stats: FusedStats) -> None:
        self.settings, self.runtime, self.stats = settings, runtime, stats

    def launch(self, run, n_items: int, tt: int, *per_chunk: np.ndarray) -> list:
        """Run ``run(lo, hi, *per_chunk[c])`` over one tile range per thread."""
        chunks = _chunks(n_items, tt)
        return self.runtime.launch([partial(run, lo, hi, *(b[c] for b in per_chunk))
                                    for c, (lo, hi) in enumerate(chunks)])


def _maps_vjp(angles: torch.Tensor, raw_scales: torch.Tensor, gm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain ``dL/dM`` (``gm [..., P, 4]``) to ``(dL/dangles, dL/draw_scales)``."""
    with torch.enable_grad():
        a = angles.detach().requires_grad_(True)
        r = raw_scales.detach().requires_grad_(True)
        return torch.autograd.grad(stage_maps(a, r), (a, r), gm.to(angles.dtype))


def _grad_chunks(C: int, *shape: int) -> torch.Tensor:
    """Per-chunk gradient sums: float64 whatever the activation dtype (the tile sums are added in here)."""
    return torch.zeros(C, *shape, dtype=torch.float64)


def _coupled_params(angles: torch.Tensor, raw_scales: torch.Tensor) -> tuple[np.ndarray, ...]:
    """``(theta, cos theta, sin theta, softplus(raw))`` as the coupled kernels take them."""
    return _np(angles), _np(torch.cos(angles)), _np(torch.sin(angles)), _np(F.softplus(raw_scales))


class _CascadeFn(torch.autograd.Function):
    """``y = C(x)`` for ``x [N, Hin*W]``: fused forward; the backward recomputes from the saved input (and,
    coupled, from the angle nudges of the last ``keep`` stages the forward kept)."""

    @staticmethod
    def forward(ctx, x, angles, raw_scales, coupling, width, first_stage, plan, train):
        k, st = plan.runtime.kernels(), plan.settings
        H, S, P = angles.shape
        i0, i1 = pair_tables(width, first_stage, S)
        out = torch.empty(x.shape[0], H * width, dtype=x.dtype)  # (N, H*W); x may hold fewer heads
        keep = 0
        if coupling is None:
            tt = st.tile_tokens
            run = partial(k.rot_cascade_fwd, _np(x), out.numpy(), i0, i1, _np(stage_maps(angles, raw_scales)), tt)
            rec = torch.empty(0, dtype=x.dtype)
        else:
            tt = st.coupled_tile_tokens
            if train:  # (autograd turns grad mode off inside forward: the caller says whether a backward follows)
                keep = st.stored_stages(H, P, S, x.element_size())
            ntiles = (x.shape[0] + tt - 1) // tt
            rec = torch.empty(ntiles if keep else 1, H, max(keep, 1), P, tt, dtype=x.dtype)  # (tiles, H, keep, P, tt)
            run = partial(k.coupled_cascade_fwd, _np(x), out.numpy(), i0, i1, *_coupled_params(angles, raw_scales),
                          _np(coupling.transpose(-1, -2)), x.dtype == torch.float64, _tiny(x.dtype), tt, keep,
                          rec.numpy())
        plan.launch(run, x.shape[0], tt)
        ctx.save_for_backward(x, angles, raw_scales, coupling, rec)
        ctx.width, ctx.first_stage, ctx.plan, ctx.keep = width, first_stage, plan, keep
        return out

    @staticmethod
    def backward(ctx, gy):
        x, angles, raw_scales, coupling, rec = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the eager graph instead
            return _eager_vjp(x, angles, raw_scales, coupling, ctx, gy)
        try:
            return _CascadeFn._fused_backward(ctx, x, angles, raw_scales, coupling, rec, gy.contiguous())
        except Exception as e:
            if not ctx.plan.runtime.compile_failed(e):
                raise
            with torch.enable_grad():
                return _eager_vjp(*(t.detach().requires_grad_(t.requires_grad) if t is not None else None
                                    for t in (x, angles, raw_scales, coupling)), ctx, gy)

    @staticmethod
    def _fused_backward(ctx, x, angles, raw_scales, coupling, rec, gy):
        plan = ctx.plan
        k, st = plan.runtime.kernels(), plan.settings
        H, S, P = angles.shape
        i0, i1 = pair_tables(ctx.width, ctx.first_stage, S)
        gx = torch.zeros_like(x)  # the kernels add: cascade heads sharing an input head sum their gradients
        xa, gya, item, N = _np(x), _np(gy), x.element_size(), x.shape[0]
        if coupling is None:
            tt = st.tile_tokens
            C = len(_chunks(N, tt))
            gm = _grad_chunks(C, H, S, P, 4)
            run = partial(k.rot_cascade_bwd, xa, gya, gx.numpy(), i0, i1, _np(stage_maps(angles, raw_scales)),
                          _np(stage_inverse_maps(angles, raw_scales)), tt,
                          segment_length(S, 2 * P * tt * item, st.scratch_bytes), drift_tolerance(x.dtype, S),
                          st.backward == "auto")
            stored = plan.launch(run, N, tt, gm.numpy())
            plan.stats.backward_passes += H * ((N + tt - 1) // tt)
            plan.stats.stored_passes += sum(stored)
            g_ang, g_raw = _maps_vjp(angles, raw_scales, gm.sum(0))
            return gx, g_ang, g_raw, None, None, None, None, None
        tt = st.coupled_tile_tokens
        C = len(_chunks(N, tt))
        gth, gsc, gw = _grad_chunks(C, H, S, P), _grad_chunks(C, H, S, P, 2), _grad_chunks(C, H, S, 4 * P, P)
        per_stage = 5 * P * tt * item  # records per stage: the stage's pairs [2P] and cos, sin, 1 - tanh^2 [3P]
        run = partial(k.coupled_cascade_bwd, xa, _np(rec), gya, gx.numpy(), i0, i1,
                      *_coupled_params(angles, raw_scales), _np(coupling), _np(coupling.transpose(-1, -2)),
                      x.dtype == torch.float64, _tiny(x.dtype), tt, segment_length(S, per_stage, st.scratch_bytes),
                      ctx.keep)
        plan.launch(run, N, tt, gth.numpy(), gsc.numpy(), gw.numpy())
        g_raw = gsc.sum(0).to(x.dtype) * torch.sigmoid(raw_scales.detach())  # d softplus / d raw = sigmoid
        return gx, gth.sum(0).to(x.dtype), g_raw, gw.sum(0).to(x.dtype), None, None, None, None


def _eager_vjp(x, angles, raw_scales, coupling, ctx, gy):
    ins = [t for t in (x, angles, raw_scales, coupling) if t is not None and t.requires_grad]
    y = cascade_eager(x, angles, raw_scales, coupling, ctx.width, ctx.first_stage)
    grads = iter(torch.autograd.grad(y, ins, gy, create_graph=True, allow_unused=True))
    out = [next(grads) if t is not None and t.requires_grad else None for t in (x, angles, raw_scales, coupling)]
    return (*out, None, None, None, None)


def cascade_fused(cascade: RotationCascade, x: torch.Tensor) -> torch.Tensor:
    """Apply ``cascade`` to ``x [..., Hin*W]`` (``Hin`` dividing ``H``) with the fused kernels (the caller
    checked :func:`use_fused`), under the cascade's settings, runtime and counters; eager, after one
    notice, if numba cannot compile them."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).contiguous()  # (N, Hin*W)
    args = (cascade.angles, cascade.raw_scales, cascade.coupling, cascade.width, cascade.first_stage)
    try:
        train = torch.is_grad_enabled() and any(p is not None and p.requires_grad for p in (x2, *args[:3]))
        y = _CascadeFn.apply(x2, *args, _Plan(cascade.settings, cascade.runtime, cascade.stats), train)
    except Exception as e:
        if not cascade.runtime.compile_failed(e):
            raise
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
    def forward(ctx, z, e_angles, e_raw, c_angles, c_raw, d_out, save, plan):
        k = plan.runtime.kernels()
        i0e, i1e, eact, i0c, i1c, cact = _FFNFn._geometry(z, e_angles, c_angles, d_out)
        tt = plan.settings.ffn_tile_tokens
        P = e_angles.shape[-1]
        out = torch.empty(z.shape[0], d_out, dtype=z.dtype)
        ntiles = (z.shape[0] + tt - 1) // tt
        rec = torch.empty(ntiles if save else 1, P, tt, dtype=z.dtype)  # the GELU's Phi per tile (tiles, P, tt)
        run = partial(k.ffn_fwd, _np(z), out.numpy(), i0e, i1e, _np(stage_maps(e_angles[0], e_raw[0])), eact,
                      i0c, i1c, _np(stage_maps(c_angles[0], c_raw[0])), cact, z.dtype == torch.float64, save,
                      rec.numpy(), tt)
        plan.launch(run, z.shape[0], tt)
        ctx.save_for_backward(z, e_angles, e_raw, c_angles, c_raw, rec)
        ctx.d_out, ctx.tt, ctx.saved_rec, ctx.plan = d_out, tt, save, plan
        return out

    @staticmethod
    def backward(ctx, gy):
        z, e_angles, e_raw, c_angles, c_raw, rec = ctx.saved_tensors
        params = (z, e_angles, e_raw, c_angles, c_raw)
        if torch.is_grad_enabled():  # create_graph=True: differentiate the eager graph instead
            ins = [t for t in params if t.requires_grad]
            y = ffn_eager(*params, ctx.d_out)
            grads = iter(torch.autograd.grad(y, ins, gy, create_graph=True, allow_unused=True))
            return (*[next(grads) if t.requires_grad else None for t in params], None, None, None)
        if not ctx.saved_rec:
            raise RuntimeError("fused_ffn: backward through a call made without grad (no GELU records saved)")
        try:
            return _FFNFn._fused_backward(ctx, gy.contiguous())
        except Exception as e:
            if not ctx.plan.runtime.compile_failed(e):
                raise
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_(t.requires_grad) for t in params]
                y = ffn_eager(*leaves, ctx.d_out)
                ins = [t for t in leaves if t.requires_grad]
                grads = iter(torch.autograd.grad(y, ins, gy, allow_unused=True))
                return (*[next(grads) if t.requires_grad else None for t in leaves], None, None, None)

    @staticmethod
    def _fused_backward(ctx, gy):
        z, e_angles, e_raw, c_angles, c_raw, rec = ctx.saved_tensors
        plan = ctx.plan
        k, st = plan.runtime.kernels(), plan.settings
        i0e, i1e, eact, i0c, i1c, cact = _FFNFn._geometry(z, e_angles, c_angles, ctx.d_out)
        S1, P = e_angles.shape[1:]
        S2 = c_angles.shape[1]
        tt = ctx.tt
        C = len(_chunks(z.shape[0], tt))
        egm, cgm = _grad_chunks(C, S1, P, 4), _grad_chunks(C, S2, P, 4)
        gz = torch.empty_like(z)
        seg = segment_length(max(S1, S2), 2 * P * tt * z.element_size(), st.scratch_bytes)
        run = partial(k.ffn_bwd, _np(z), _np(rec), _np(gy), gz.numpy(), i0e, i1e,
                      _np(stage_maps(e_angles[0], e_raw[0])), _np(stage_inverse_maps(e_angles[0], e_raw[0])), eact,
                      i0c, i1c, _np(stage_maps(c_angles[0], c_raw[0])), _np(stage_inverse_maps(c_angles[0], c_raw[0])),
                      cact, z.dtype == torch.float64, tt, seg, drift_tolerance(z.dtype, max(S1, S2)),
                      st.backward == "auto")
        stored = plan.launch(run, z.shape[0], tt, egm.numpy(), cgm.numpy())
        plan.stats.backward_passes += 2 * ((z.shape[0] + tt - 1) // tt)
        plan.stats.stored_passes += sum(stored)
        g_ea, g_er = _maps_vjp(e_angles, e_raw, egm.sum(0)[None])
        g_ca, g_cr = _maps_vjp(c_angles, c_raw, cgm.sum(0)[None])
        return gz, g_ea, g_er, g_ca, g_cr, None, None, None


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
              backend: str | None = None) -> torch.Tensor:
    r""":math:`\Pi\,C_2(\operatorname{RadialGELU}(C_1(\Pi^\top z)))` for ``z [..., d_in]``, ``[..., d_out]`` out.

    ``Pi^T`` zero-pads to the cascades' width, ``Pi`` keeps the first ``d_out`` coordinates
    (default ``d_in``): the GRT FFN of :class:`grt_model.model.GRTFFN`.  Runs one fused kernel per
    direction where :func:`use_fused` allows, else the eager composition.  Settings, runtime and counters
    are ``expand``'s; ``backend`` (default: ``expand.settings.backend``) overrides the backend alone.
    """
    d_out = z.shape[-1] if d_out is None else d_out
    _check_ffn(z, expand, contract, d_out)
    settings = expand.settings
    if backend is not None and backend != settings.backend:
        settings = dataclasses.replace(settings, backend=check_backend(backend))
    params = (expand.angles, expand.raw_scales, contract.angles, contract.raw_scales)
    if not use_fused(settings, z, *params, runtime=expand.runtime):
        return ffn_eager(z, *params, d_out)
    lead = z.shape[:-1]
    save = torch.is_grad_enabled() and any(t.requires_grad for t in (z, *params))
    try:
        y = _FFNFn.apply(z.reshape(-1, z.shape[-1]).contiguous(), *params, d_out, save,
                         _Plan(settings, expand.runtime, expand.stats))
    except Exception as e:
        if not expand.runtime.compile_failed(e):
            raise
        return ffn_eager(z, *params, d_out)
    return y.reshape(*lead, d_out)
