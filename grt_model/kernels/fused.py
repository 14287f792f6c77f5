r"""The fused CPU path: numba kernels (:mod:`grt_model.kernels.entry`, whose docstring says how they work) behind
``torch.autograd.Function``\ s.

:func:`ffn_fused` runs the whole coupling-off FFN in one kernel per direction and skips, exactly, the pairs the
zero padding keeps at zero and the pairs that never reach a kept coordinate (about 30% of the FFN's stage work
at the reference sizes).  ``torch.get_num_threads()`` chunks of tiles run on the runtime's worker threads;
parameter gradients are summed in chunk order, deterministic for a given thread count.  A double backward
(``create_graph=True``) goes through the eager graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import lru_cache, partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from grt_model.butterfly import butterfly_pairs
from grt_model.cascade_ops import cascade_eager, ffn_eager, stage_inverse_maps, stage_maps
from grt_model.kernels import runtime
from rmsgauge.tolerance import tolerance

__all__ = ["TUNING", "FusedStats", "Tuning", "cascade_fused", "ffn_fused", "fused_available"]


@dataclass(frozen=True)
class Tuning:
    """Tile sizes and memory budgets of the kernels.  Measured with ``python -m lm.bench`` on a 2-core Sapphire
    Rapids: every inner loop runs over a tile's tokens, and each (pair, loop) pays a fixed set-up (LLVM's overlap
    checks, per-pair sums), so long tiles win even past the L2 size; a coupled tile also sets the coupling GEMMs'
    width (``[P, 4P] x [4P, tt]``), where BLAS needs >= 64 columns."""

    tile_tokens: int = 128
    scratch_bytes: int = 3 << 19  # per-thread backward scratch (1.5 MB); past it: checkpointed segments
    invert: bool = True  # coupling-off backward: invert the stages (drift-checked, else store); False: store
    angle_bytes_per_token: int = 6144  # coupled cascades: bytes per token of per-stage angle nudges the forward
    # may keep for the backward (the last stages first).  A kept stage skips its coupling GEMM in the backward's
    # recompute (4 -> 3 GEMMs); 4 * heads * P bytes per stage: all 11 stages of one 4-head projection at
    # d_head 64 (5.6 KB), 4 of the 11 of the 12-head Q/K/V call.  0: keep nothing (the memory-lean backward).

    def __post_init__(self) -> None:
        for f in fields(self):
            v, lo = getattr(self, f.name), 0 if f.name == "angle_bytes_per_token" else 1
            if f.type != "bool" and not lo <= v <= 1 << 30:
                raise ValueError(f"{f.name} must be in [{lo}, 2^30], got {v!r}")

    def stored_stages(self, heads: int, pairs: int, stages: int, itemsize: int) -> int:
        """How many (trailing) stages of a coupled cascade keep their angle nudges within the budget."""
        return min(stages, self.angle_bytes_per_token // max(1, heads * pairs * itemsize))


TUNING = Tuning()


@dataclass
class FusedStats:
    """Counts of the fused backward's coupling-off cascade passes (per tile and head) and of those that fell
    back from inversion to storing because the inversion drifted (ill-conditioned scales)."""

    backward_passes: int = 0
    stored_passes: int = 0


def fused_available() -> bool:
    """Whether the numba kernels load."""
    return runtime.RUNTIME.available()


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


class _Plan:
    """What one fused call runs with: the tuning, the kernel runtime, the counters (not tensors: autograd
    passes them through and returns ``None`` for them)."""

    __slots__ = ("runtime", "stats", "tuning")

    def __init__(self, tuning: Tuning, stats: FusedStats | None) -> None:
        self.tuning, self.runtime, self.stats = tuning, runtime.RUNTIME, stats or FusedStats()

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


def _or_eager(fused: Callable[[], Any], eager: Callable[[], Any]) -> Any:
    """``fused()``, or ``eager()`` where a kernel fails to compile (one notice, eager from then on)."""
    try:
        return fused()
    except Exception as e:
        if not runtime.RUNTIME.compile_failed(e):
            raise
        return eager()


def _backward(ctx, gy: torch.Tensor, fused_backward: Callable, *inputs: torch.Tensor | None) -> tuple:
    """A fused call's backward: the kernels' (``fused_backward(ctx, gy)``), or its eager graph's for a double
    backward (``create_graph=True``) and after a kernel failed to compile."""
    if torch.is_grad_enabled():
        return _eager_grads(ctx, gy, *inputs)
    return _or_eager(lambda: fused_backward(ctx, gy.contiguous()), lambda: _eager_grads(ctx, gy, *inputs))


class _CascadeFn(torch.autograd.Function):
    """``y = C(x)`` for ``x [N, Hin*W]``: fused forward; the backward recomputes from the saved input (and,
    coupled, from the angle nudges of the last ``keep`` stages the forward kept)."""

    @staticmethod
    def forward(ctx, x, angles, raw_scales, coupling, width, first_stage, plan, train):
        k, st = plan.runtime.kernels(), plan.tuning
        H, S, P = angles.shape
        i0, i1 = pair_tables(width, first_stage, S)
        out = torch.empty(x.shape[0], H * width, dtype=x.dtype)  # (N, H*W); x may hold fewer heads
        keep, tt = 0, st.tile_tokens
        if coupling is None:
            run = partial(k.rot_cascade_fwd, _np(x), out.numpy(), i0, i1, _np(stage_maps(angles, raw_scales)), tt)
            rec = torch.empty(0, dtype=x.dtype)
        else:
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
        ctx.eager = partial(cascade_eager, width=width, first_stage=first_stage)
        return out

    @staticmethod
    def backward(ctx, gy):
        return _backward(ctx, gy, _CascadeFn._fused_backward, *ctx.saved_tensors[:4])

    @staticmethod
    def _fused_backward(ctx, gy):
        x, angles, raw_scales, coupling, rec = ctx.saved_tensors
        plan = ctx.plan
        k, st = plan.runtime.kernels(), plan.tuning
        H, S, P = angles.shape
        i0, i1 = pair_tables(ctx.width, ctx.first_stage, S)
        gx = torch.zeros_like(x)  # the kernels add: cascade heads sharing an input head sum their gradients
        xa, gya, item, N, tt = _np(x), _np(gy), x.element_size(), x.shape[0], st.tile_tokens
        C = len(_chunks(N, tt))
        if coupling is None:
            gm = _grad_chunks(C, H, S, P, 4)
            run = partial(k.rot_cascade_bwd, xa, gya, gx.numpy(), i0, i1, _np(stage_maps(angles, raw_scales)),
                          _np(stage_inverse_maps(angles, raw_scales)), tt,
                          segment_length(S, 2 * P * tt * item, st.scratch_bytes), drift_tolerance(x.dtype, S),
                          st.invert)
            stored = plan.launch(run, N, tt, gm.numpy())
            plan.stats.backward_passes += H * ((N + tt - 1) // tt)
            plan.stats.stored_passes += sum(stored)
            g_ang, g_raw = _maps_vjp(angles, raw_scales, gm.sum(0))
            return gx, g_ang, g_raw, None, None, None, None, None
        gth, gsc, gw = _grad_chunks(C, H, S, P), _grad_chunks(C, H, S, P, 2), _grad_chunks(C, H, S, 4 * P, P)
        per_stage = 5 * P * tt * item  # records per stage: the stage's pairs [2P] and cos, sin, 1 - tanh^2 [3P]
        run = partial(k.coupled_cascade_bwd, xa, _np(rec), gya, gx.numpy(), i0, i1,
                      *_coupled_params(angles, raw_scales), _np(coupling), _np(coupling.transpose(-1, -2)),
                      x.dtype == torch.float64, _tiny(x.dtype), tt, segment_length(S, per_stage, st.scratch_bytes),
                      ctx.keep)
        plan.launch(run, N, tt, gth.numpy(), gsc.numpy(), gw.numpy())
        g_raw = gsc.sum(0).to(x.dtype) * torch.sigmoid(raw_scales.detach())  # d softplus / d raw = sigmoid
        return gx, gth.sum(0).to(x.dtype), g_raw, gw.sum(0).to(x.dtype), None, None, None, None


def _eager_grads(ctx, gy: torch.Tensor, *inputs: torch.Tensor | None) -> tuple:
    """A fused call's backward through its eager graph: for higher derivatives (``create_graph=True``, the
    saved tensors stay in the graph) and after a kernel failed to compile (detached leaves); ``None`` for the
    call's non-tensor arguments."""
    create = torch.is_grad_enabled()
    if not create:
        inputs = tuple(t if t is None else t.detach().requires_grad_(t.requires_grad) for t in inputs)
    with torch.enable_grad():
        y = ctx.eager(*inputs)
        ins = [t for t in inputs if t is not None and t.requires_grad]
        grads = iter(torch.autograd.grad(y, ins, gy, create_graph=create, allow_unused=True))
    out = [next(grads) if t is not None and t.requires_grad else None for t in inputs]
    return (*out, *[None] * (8 - len(inputs)))


def cascade_fused(x: torch.Tensor, angles: torch.Tensor, raw_scales: torch.Tensor, coupling: torch.Tensor | None,
                  width: int, first_stage: int = 0, *, tuning: Tuning = TUNING,
                  stats: FusedStats | None = None) -> torch.Tensor:
    """:func:`~grt_model.cascade_ops.cascade_eager`'s function (``pair_energy`` features) with the fused kernels,
    on CPU tensors of one dtype, float32 or float64; eager, after one notice, where the kernels are unavailable."""
    params = (angles, raw_scales, coupling)
    if not runtime.RUNTIME.available():
        return cascade_eager(x, *params, width, first_stage)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()  # (N, Hin*W)
    train = torch.is_grad_enabled() and any(p is not None and p.requires_grad for p in (x2, *params))
    y = _or_eager(lambda: _CascadeFn.apply(x2, *params, width, first_stage, _Plan(tuning, stats), train),
                  lambda: cascade_eager(x2, *params, width, first_stage))
    return y.reshape(*x.shape[:-1], angles.shape[0] * width)


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
        tt = plan.tuning.tile_tokens
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
        ctx.eager = partial(ffn_eager, d_out=d_out)
        return out

    @staticmethod
    def backward(ctx, gy):
        return _backward(ctx, gy, _FFNFn._fused_backward, *ctx.saved_tensors[:5])  # z and the four parameters

    @staticmethod
    def _fused_backward(ctx, gy):
        if not ctx.saved_rec:
            raise RuntimeError("ffn_fused: backward through a call made without grad (no GELU records saved)")
        z, e_angles, e_raw, c_angles, c_raw, rec = ctx.saved_tensors
        plan = ctx.plan
        k, st = plan.runtime.kernels(), plan.tuning
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
                      st.invert)
        stored = plan.launch(run, z.shape[0], tt, egm.numpy(), cgm.numpy())
        plan.stats.backward_passes += 2 * ((z.shape[0] + tt - 1) // tt)
        plan.stats.stored_passes += sum(stored)
        g_ea, g_er = _maps_vjp(e_angles, e_raw, egm.sum(0)[None])
        g_ca, g_cr = _maps_vjp(c_angles, c_raw, cgm.sum(0)[None])
        return gz, g_ea, g_er, g_ca, g_cr, None, None, None


def ffn_fused(z: torch.Tensor, e_angles: torch.Tensor, e_raw: torch.Tensor, c_angles: torch.Tensor,
              c_raw: torch.Tensor, d_out: int, *, tuning: Tuning = TUNING,
              stats: FusedStats | None = None) -> torch.Tensor:
    r""":func:`~grt_model.cascade_ops.ffn_eager`'s function,
    :math:`\Pi\,C_2(\operatorname{RadialGELU}(C_1(\Pi^\top z)))` for ``z [..., d_in]`` with single-head
    coupling-off cascades (``[1, S, P]`` angles), in one fused kernel per direction; ``[..., d_out]`` out.
    Eager, after one notice, where the kernels are unavailable."""
    W = 2 * e_angles.shape[-1]
    if e_angles.shape[0] != 1 or c_angles.shape[0] != 1 or c_angles.shape[-1] != W // 2:
        raise ValueError(f"ffn_fused: the cascades must be single-head and of one width, got angles "
                         f"{tuple(e_angles.shape)} and {tuple(c_angles.shape)}")
    if not 1 <= z.shape[-1] <= W:
        raise ValueError(f"ffn_fused: input width must be in [1, {W}], got shape {tuple(z.shape)}")
    if not 1 <= d_out <= W:
        raise ValueError(f"ffn_fused: d_out must be in [1, {W}], got {d_out}")
    params = (e_angles, e_raw, c_angles, c_raw)
    if not runtime.RUNTIME.available():
        return ffn_eager(z, *params, d_out)
    save = torch.is_grad_enabled() and any(t.requires_grad for t in (z, *params))
    y = _or_eager(lambda: _FFNFn.apply(z.reshape(-1, z.shape[-1]).contiguous(), *params, d_out, save,
                                       _Plan(tuning, stats)),
                  lambda: ffn_eager(z, *params, d_out))
    return y.reshape(*z.shape[:-1], d_out)
