r"""The gauge census of any PyTorch model: which parameter tensors (and which row/column blocks) are scale gauges.

A parameter tensor :math:`W` (or a block :math:`W_I` of its rows or columns) is a *scale gauge* of the loss
when :math:`L(c\,W_I) = L(W)` for every :math:`c > 0`.  The census decides this numerically, for any
``torch.nn.Module`` and either a closure ``loss_fn(model) -> scalar`` or an example batch, on a float64 deep
copy (the user's model is never touched):

1. **Whole tensors.**  Every tensor is scaled by each :math:`c` in ``scales`` (default
   :data:`DEFAULT_SCALES`: both sides of 1, *no powers of two*, which are exact in floating point and would
   prove nothing) and :math:`\max_c |L(cW) - L(W)|` is compared with the float64 round-off bound of the loss
   from :func:`rmsgauge.tolerance` (``size`` = the largest activation of the forward pass, ``depth`` = the
   number of module calls in it: the accumulated terms and sequential steps of the computation).
2. **The finest partition.**  Euler's theorem for the degree-0 homogeneous :math:`c \mapsto L(cW_I)` gives
   :math:`\langle \nabla_{W_I} L, W_I\rangle = 0` for a gauge block, so one float64 backward screens every
   aligned contiguous block of every divisor size along rows (axis 0) and columns (axis 1) at once (block sums
   of :math:`g \odot W`).  From the finest size up, blocks that pass the screen and are not inside a block
   already found are confirmed by the finite law at every :math:`c` and by a non-radial move that must change
   the loss (a block the batch does not read at all is ``unused``, not a gauge).  Per-head gauges of a
   per-head QK-norm come out as ``head_dim``-row blocks, with grouped-query attention's fewer key heads found
   the same way; a norm over the whole projection (OLMo 2) leaves only the whole tensor.
3. **Why.**  Forward hooks on every normalization-like module (class name containing ``Norm``, or
   ``nn.LayerNorm``/``nn.RMSNorm``/``nn.GroupNorm``) record which module output each norm reads (same
   storage: views and reshapes of a projection's output count); a gauge read by a norm is reported with it.
4. **eps.**  Real models use :math:`\epsilon > 0`, so their gauges are approximate.  The census finds the exact
   gauges with every norm's ``eps`` (``eps``, ``variance_epsilon``, ``epsilon``) set to 0 on the copy, and then,
   at the model's own eps, measures the loss deviation and the reading norm's output deviation next to the
   exact eps law of :mod:`gauge.laws`
   (:math:`\operatorname{RMSNorm}_\epsilon(cz) = r(c)\operatorname{RMSNorm}_\epsilon(z)`,
   :math:`r(c) = c\sqrt{m+\epsilon}/\sqrt{c^2m+\epsilon}`; LayerNorm: the same with :math:`m` the variance),
   with the break scales :math:`(c_{lo}, c_{hi})` outside which the deviation exceeds float64 round-off.

Float64 throughout: the copy runs under a torch-function mode that keeps every floating computation in float64,
because many models (Hugging Face's RMSNorms, eager attention's softmax) upcast to float32 *explicitly*, which
inside a float64 copy would be a downcast and bury a gauge under float32 round-off.

Candidate scalings of one tensor are evaluated in one ``torch.func.vmap`` of ``functional_call`` where the
model allows it (checked once against the plain loop), otherwise in a loop over candidates.

Background: Kosson, Messmer & Jaggi, *Rotational Equilibrium* (arXiv:2305.17212) call such tensors
scale-invariant groups; Wan et al., *Spherical Motion Dynamics* (arXiv:2006.08419) their weights on the sphere.
"""

from __future__ import annotations

import copy
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from gauge.laws import break_scales, eps_ratio_minus_one
from rmsgauge import check_range, json_safe, tolerance

DEFAULT_SCALES = (0.37, 0.81, 1.7, 6.3)  # both sides of 1, none a power of two (2^k scaling is exact: proves nothing)
EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")  # where torch and Hugging Face norms keep their epsilon
DIRECTION_SIZE = 0.5  # non-radial test move relative to ||W_I||: large enough that any block the loss reads shows
VMAP_CHUNK = 64  # candidate tensors per vmapped call: bounds memory at 64 model copies' activations
_LOW_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


# ------------------------------------------------------------------------------------------------ records
@dataclass
class Block:
    """One gauge (or unused) block: ``axis`` None is the whole tensor; else indices ``[start, stop)`` on ``axis``."""

    axis: int | None
    start: int
    stop: int
    loss_change: float  # max_c |L(c W_I) - L(W)| at eps = 0
    direction_change: float  # |L(W + delta_I) - L(W)| for a non-radial move inside the block


@dataclass
class EpsReport:
    """The gauge at the model's own eps: measured deviations beside the exact eps law."""

    eps: float | None  # the reading norm's own eps (None where no norm reads the tensor directly)
    loss_change: float  # max_c |L(c W) - L(W)| at the model's eps
    output_change: float | None  # max_c max |Norm(x(cW)) - Norm(xW)| measured at the reading norm
    output_law: float | None  # the same from gauge.laws: max over the rows it reads of |r(c) - 1| |y|
    law_agreement: float | None  # |measured - law| / law (None where no law applies)
    break_scales: tuple[float, float] | None  # (c_lo, c_hi): deviation above float64 round-off outside


@dataclass
class TensorCensus:
    name: str
    shape: tuple[int, ...]
    status: str  # "gauge", "partial gauge", "not a gauge", "unused"
    loss_change: float  # whole tensor: max_c |L(cW) - L(W)| at eps = 0
    radial: float  # |<g, W>| / (||g|| ||W||) at eps = 0 (Euler: 0 for a gauge)
    blocks: list[Block] = field(default_factory=list)  # the finest gauge partition found
    partition: str = ""  # human summary of blocks, e.g. "rows: 4 blocks of 16"
    reason: str = ""  # the normalization that reads this tensor's output, where visible
    eps: EpsReport | None = None


@dataclass
class CensusResult:
    tensors: list[TensorCensus]
    loss: float  # L(W) at eps = 0
    loss_own_eps: float  # L(W) at the model's eps
    tolerance: float  # the float64 bound on |L(cW) - L(W)| every verdict used
    tolerance_terms: dict[str, int]  # size and depth fed to rmsgauge.tolerance
    scales: tuple[float, ...]
    eps_zeroed: dict[str, float | None]  # norm module path -> its own eps (None: torch's default)
    randomized: list[str]  # all-zero tensors moved to a random point first (scaling zero proves nothing)
    vectorized: bool  # whether candidate scalings ran under torch.func.vmap
    model: str = ""

    @property
    def gauges(self) -> list[str]:
        """Tensors that are whole-tensor gauges at eps = 0."""
        return [t.name for t in self.tensors if t.status == "gauge"]

    def blocks_of(self, name: str) -> list[tuple[int | None, int, int]]:
        """``(axis, start, stop)`` of every gauge block of one tensor."""
        t = next((t for t in self.tensors if t.name == name), None)
        if t is None:
            raise KeyError(f"no parameter named {name!r} in this census")
        return [(b.axis, b.start, b.stop) for b in t.blocks]

    def to_json(self) -> dict[str, Any]:
        return json_safe(asdict(self))


# ------------------------------------------------------------------------------------------------ float64 mode
class _Float64Everywhere(TorchFunctionMode):
    """Keep every floating computation in float64: ``.float()``, ``.to(torch.float32)`` and ``dtype=float32``
    arguments become float64 (a model's explicit upcast to float32 is a downcast inside a float64 copy)."""

    _CASTS = (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self._CASTS:
            return args[0].double()
        if kwargs.get("dtype") in _LOW_FLOATS:
            kwargs["dtype"] = torch.float64
        args = tuple(torch.float64 if (isinstance(a, torch.dtype) and a in _LOW_FLOATS) else a for a in args)
        return func(*args, **kwargs)


class _LossModule(nn.Module):
    """Wraps ``loss_fn(model)`` as a module so ``torch.func.functional_call`` can swap one parameter."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self._loss_fn = loss_fn

    def forward(self) -> torch.Tensor:
        return self._loss_fn(self.model)


# ------------------------------------------------------------------------------------------------ helpers
def loss_from_output(out: Any) -> torch.Tensor:
    """The scalar loss in a model's output: a scalar tensor, ``out.loss`` (Hugging Face), or the scalar of a tuple."""
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        return out.reshape(())
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss.reshape(())
    if isinstance(out, (tuple, list)):
        for o in out:
            if isinstance(o, torch.Tensor) and o.numel() == 1 and o.is_floating_point():
                return o.reshape(())
    raise ValueError("the model's output holds no scalar loss; pass loss_fn(model) -> scalar tensor instead of batch")


def batch_loss_fn(batch: Any) -> Callable[[nn.Module], torch.Tensor]:
    """A loss closure for ``model(**batch)`` (dict), ``model(*batch)`` (tuple/list) or ``model(batch)``."""

    def to64(x: Any) -> Any:
        return x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    if isinstance(batch, dict):
        b = {k: to64(v) for k, v in batch.items()}
        return lambda m: loss_from_output(m(**b))
    if isinstance(batch, (tuple, list)):
        t = [to64(v) for v in batch]
        return lambda m: loss_from_output(m(*t))
    x = to64(batch)
    return lambda m: loss_from_output(m(x))


def is_norm_module(m: nn.Module) -> bool:
    """Normalization-like: torch's norms or any class whose name contains ``Norm`` (RMSNorm, PearlNorm, ...)."""
    return isinstance(m, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)) or "Norm" in type(m).__name__


def norm_kind(m: nn.Module) -> str:
    """``rms`` (divides by the root mean square), ``layer`` (centres first) or ``other`` (no eps law here)."""
    name = type(m).__name__
    if isinstance(m, nn.RMSNorm) or "RMS" in name:
        return "rms"
    if isinstance(m, nn.LayerNorm) or "LayerNorm" in name:
        return "layer"
    return "other"


def _eps_attr(m: nn.Module) -> str | None:
    for a in EPS_ATTRS:
        if hasattr(m, a) and (isinstance(getattr(m, a), float) or (a == "eps" and isinstance(m, nn.RMSNorm))):
            return a
    return None


def _divisors(n: int) -> list[int]:
    return [b for b in range(1, n) if n % b == 0]


def _check_scales(scales: Sequence[float]) -> tuple[float, ...]:
    out = []
    for c in scales:
        check_range("scales", c, lo=0.0, lo_open=True)
        if c == 1.0 or math.log2(c).is_integer():
            raise ValueError(f"scales must be positive, not 1 and not powers of two (exact in floating point), "
                             f"got {c!r}")
        out.append(float(c))
    if len(out) < 2:
        raise ValueError(f"scales needs at least 2 values (both sides of 1 recommended), got {list(scales)!r}")
    return tuple(out)


def _eps_value(eps: float | None) -> float:
    """A norm's eps; None is torch's default for ``nn.RMSNorm`` (``finfo(dtype).eps``, here float64's)."""
    return float(torch.finfo(torch.float64).eps) if eps is None else float(eps)


def _layer_of(name: str) -> str:
    m = re.match(r"^(.*?\.\d+)\.", name)
    return m.group(1) if m else "(top)"


# ------------------------------------------------------------------------------------------------ the engine
class _Engine:
    """The float64 copy, its loss, and batched evaluation of candidate values of one tensor."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor], seed: int) -> None:
        self.model = copy.deepcopy(model).to(device="cpu", dtype=torch.float64).train(False)
        for p in self.model.parameters():
            p.requires_grad_(True)
        self.wrap = _LossModule(self.model, loss_fn)
        self.gen = torch.Generator().manual_seed(seed)  # own generator: the census never moves the global RNG
        self.params = dict(self.model.named_parameters())
        self.vmap_ok: bool | None = None
        self.norms = {n: m for n, m in self.model.named_modules() if is_norm_module(m)}
        self.own_eps = {n: getattr(m, a) for n, m in self.norms.items() if (a := _eps_attr(m)) is not None}

    def set_eps(self, zero: bool) -> None:
        for n, e in self.own_eps.items():
            m = self.norms[n]
            setattr(m, _eps_attr(m), 0.0 if zero else e)

    def loss(self, grad: bool = False) -> torch.Tensor:
        with torch.set_grad_enabled(grad):
            out = self.wrap()
        if not (isinstance(out, torch.Tensor) and out.numel() == 1):
            raise ValueError("loss_fn must return a scalar tensor")
        return out.reshape(())

    def _call(self, name: str, w: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(self.wrap, {"model." + name: w}, ()).reshape(())

    def losses(self, name: str, values: torch.Tensor, tol: float) -> torch.Tensor:
        """``(K,)`` losses with parameter ``name`` replaced by each of ``values`` ``(K, *shape)``."""
        with torch.no_grad():
            if self.vmap_ok is not False:
                try:
                    with warnings.catch_warnings():
                        # ops without a batching rule (SDPA on CPU) run per candidate inside vmap: slower, same values
                        warnings.filterwarnings("ignore", message=".*performance drop.*", category=UserWarning)
                        parts = [torch.func.vmap(lambda w: self._call(name, w))(v) for v in values.split(VMAP_CHUNK)]
                    out = torch.cat(parts)
                    if self.vmap_ok is None:  # trust vmap only once it agrees with the plain call
                        ref = self._call(name, values[0])
                        self.vmap_ok = bool(abs(float(out[0] - ref)) <= tol)
                    if self.vmap_ok:
                        return out
                except Exception:  # any model vmap cannot batch (data-dependent control flow, .item(), ...)
                    self.vmap_ok = False
            return torch.stack([self._call(name, v) for v in values])  # loop over candidates, never tokens


def _capture(engine: _Engine) -> tuple[dict[str, Any], dict[str, list[str]], int, int]:
    """One forward with hooks: the largest activation, the module-call count, and which norm reads which module.

    Returns ``(norm_io, readers, size, depth)``: ``norm_io[norm] = (z, y)``; ``readers[module] = [norms]``.
    """
    outs: dict[str, list[torch.Tensor]] = {}
    norm_io: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    stats = {"size": 1, "depth": 0}
    names = {id(m): n for n, m in engine.model.named_modules()}

    def hook(mod: nn.Module, inp: tuple, out: Any) -> None:
        n = names[id(mod)]
        ts = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
        outs.setdefault(n, []).extend(ts)  # kept alive: no storage is reused within this forward
        stats["depth"] += 1
        stats["size"] = max([stats["size"], *(int(t.numel()) for t in ts)])
        if n in engine.norms and inp and isinstance(inp[0], torch.Tensor) and ts:
            norm_io[n] = (inp[0].detach(), ts[0].detach())

    handles = [m.register_forward_hook(hook) for m in engine.model.modules()]
    try:
        with torch.no_grad():
            engine.loss()
    finally:
        for h in handles:
            h.remove()
    readers: dict[str, list[str]] = {}
    for mod, ts in outs.items():
        ptrs = {t.untyped_storage().data_ptr() for t in ts}
        for nrm, (z, _) in norm_io.items():
            if nrm != mod and z.untyped_storage().data_ptr() in ptrs:
                readers.setdefault(mod, []).append(nrm)
    return norm_io, readers, stats["size"], stats["depth"]


def _norm_io_at(engine: _Engine, norm: str, name: str, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The norm's input and output with parameter ``name`` replaced by ``w`` (one forward, one hook)."""
    got: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def hook(mod: nn.Module, inp: tuple, out: Any) -> None:  # returns None: a hook's return replaces the output
        got.setdefault("zy", (inp[0].detach(), (out[0] if isinstance(out, tuple) else out).detach()))

    h = engine.norms[norm].register_forward_hook(hook)
    try:
        with torch.no_grad():
            engine._call(name, w)
    finally:
        h.remove()
    return got["zy"]


def _nonradial(w: torch.Tensor, mask: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A move inside ``mask`` orthogonal to ``W_I``, of size DIRECTION_SIZE * ||W_I||."""
    wi = w * mask
    r = torch.randn(w.shape, generator=gen, dtype=w.dtype) * mask
    wn2 = float((wi * wi).sum())
    r = r - wi * (float((r * wi).sum()) / wn2)
    return r * (DIRECTION_SIZE * math.sqrt(wn2) / float(r.norm()))


def census(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor] | None = None, *, batch: Any = None,
           scales: Sequence[float] = DEFAULT_SCALES, partition: bool = True, own_eps: bool = True,
           seed: int = 0) -> CensusResult:
    r"""The gauge census of ``model`` (see the module docstring).

    ``loss_fn(model) -> scalar tensor`` is called with the float64 copy (cast floating inputs with
    ``.to(torch.float64)``); or pass ``batch`` (``model(**batch)`` / ``model(*batch)`` / ``model(batch)`` whose
    output is a scalar, has ``.loss``, or is a tuple holding the scalar loss).  ``partition=False`` skips the
    block search; ``own_eps=False`` skips the eps-deviation report.  ``model`` and the global RNG are untouched.
    """
    if (loss_fn is None) == (batch is None):
        raise ValueError("census needs exactly one of loss_fn (a closure) or batch (an example batch)")
    scales = _check_scales(scales)
    fn = loss_fn if loss_fn is not None else batch_loss_fn(batch)
    prev_default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with _Float64Everywhere():
            return _census(model, fn, scales, partition, own_eps, seed)
    finally:
        torch.set_default_dtype(prev_default)


def _census(model: nn.Module, fn: Callable, scales: tuple[float, ...], partition: bool, own_eps: bool,
            seed: int) -> CensusResult:
    eng = _Engine(model, fn, seed)
    eng.set_eps(zero=True)
    # an all-zero tensor (biases at init) is moved to a random point first: scaling zero is the identity
    nonzero = [p.detach().reshape(-1) for p in eng.params.values() if bool(p.detach().ne(0).any())]
    rms = float(torch.cat(nonzero).pow(2).mean().sqrt()) if nonzero else 1.0
    randomized = []
    with torch.no_grad():
        for n, p in eng.params.items():
            if not bool(p.ne(0).any()):
                p.copy_(torch.randn(p.shape, generator=eng.gen, dtype=p.dtype) * rms)
                randomized.append(n)
    norm_io0, readers, size, depth = _capture(eng)
    base_t = eng.loss(grad=True)
    grads = torch.autograd.grad(base_t, list(eng.params.values()), allow_unused=True)
    base = float(base_t.detach())
    if not math.isfinite(base):
        raise ValueError(f"loss is {base} on the float64 copy with every norm's eps = 0; census needs a finite loss")
    tol = tolerance("float64", size=size, depth=max(depth, 1), scale=abs(base))
    bound = tol.bound(abs(base))
    owner = {}  # parameter -> the module that holds it (its output is what a norm would read)
    for mname, m in eng.model.named_modules():
        for pn, _ in m.named_parameters(recurse=False):
            owner.setdefault(f"{mname}.{pn}" if mname else pn, mname)
    cs = torch.tensor(scales, dtype=torch.float64)
    rows: list[TensorCensus] = []
    for name, p in eng.params.items():
        g = grads[list(eng.params).index(name)]
        w = p.detach()
        g = torch.zeros_like(w) if g is None else g.detach()
        wn, gn = float(w.norm()), float(g.norm())
        radial = abs(float((g * w).sum())) / (wn * gn) if wn > 0 and gn > 0 else 0.0
        shape_c = (-1,) + (1,) * w.dim()
        whole = (eng.losses(name, w.unsqueeze(0) * cs.reshape(shape_c), bound) - base).abs()
        dl = float(whole.max())
        status = "not a gauge"
        blocks: list[Block] = []
        if dl <= bound:
            move = _nonradial(w, torch.ones_like(w), eng.gen)
            dir_change = abs(float(eng.losses(name, (w + move).unsqueeze(0), bound)[0]) - base)
            status = "gauge" if dir_change > bound and gn > 0 else "unused"
            if status == "gauge":
                blocks.append(Block(None, 0, w.shape[0] if w.dim() else 1, dl, dir_change))
        if partition and status != "unused" and w.dim() >= 1:
            sub = _finest_blocks(eng, name, w, g, base, bound, tol.rtol, cs)
            if sub:
                blocks = sub
                status = "gauge" if status == "gauge" else "partial gauge"
        rows.append(TensorCensus(name=name, shape=tuple(w.shape), status=status, loss_change=dl, radial=radial,
                                 blocks=blocks, partition=_describe(blocks, w.shape)))
    _attach_reasons(eng, rows, owner, readers, norm_io0)
    loss_own = base
    if own_eps:
        eng.set_eps(zero=False)
        loss_own = float(eng.loss())
        norm_io, _, _, _ = _capture(eng)
        for r in rows:
            if r.blocks:
                r.eps = _eps_report(eng, r, owner, readers, norm_io, loss_own, bound, cs)
    return CensusResult(tensors=rows, loss=base, loss_own_eps=loss_own, tolerance=bound,
                        tolerance_terms={"size": size, "depth": depth}, scales=scales,
                        eps_zeroed=dict(eng.own_eps), randomized=randomized, vectorized=bool(eng.vmap_ok),
                        model=type(model).__name__)


def _block_mask(shape: torch.Size, axis: int, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
    idx = torch.zeros(shape[axis], dtype=dtype)
    idx[start:stop] = 1.0
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return idx.reshape(view).expand(shape)


def _finest_blocks(eng: _Engine, name: str, w: torch.Tensor, g: torch.Tensor, base: float, bound: float,
                   rtol: float, cs: torch.Tensor) -> list[Block]:
    """Gauge blocks along axis 0 and 1, from the finest aligned size up (Euler screen, then the finite law)."""
    found: list[Block] = []
    for axis in range(min(w.dim(), 2)):
        n = int(w.shape[axis])
        gw = (g * w).movedim(axis, 0).reshape(n, -1)  # (n, rest): per-index radial terms
        g2 = (g * g).movedim(axis, 0).reshape(n, -1).sum(1)  # (n,)
        w2 = (w * w).movedim(axis, 0).reshape(n, -1).sum(1)
        covered = torch.zeros(n, dtype=torch.bool)
        for b in _divisors(n):
            k = n // b
            rad = gw.sum(1).reshape(k, b).sum(1).abs()  # (k,) <g_I, W_I> of every aligned block of size b
            scale = (g2.reshape(k, b).sum(1) * w2.reshape(k, b).sum(1)).sqrt()
            # a block with zero gradient is not read by the batch; an all-zero block scales to itself (proves nothing)
            cand = (rad <= rtol * scale) & (scale > 0) & ~covered.reshape(k, b).any(1)
            idx = cand.nonzero().flatten().tolist()
            if not idx:
                continue
            masks = torch.stack([_block_mask(w.shape, axis, i * b, (i + 1) * b, w.dtype) for i in idx])  # (J, *shape)
            factors = 1.0 + masks.unsqueeze(1) * (cs.reshape((1, -1) + (1,) * w.dim()) - 1.0)  # (J, C, *shape)
            vals = (w * factors).reshape((-1, *w.shape))
            dl = (eng.losses(name, vals, bound) - base).abs().reshape(len(idx), -1).amax(1)  # (J,)
            ok = [j for j in range(len(idx)) if float(dl[j]) <= bound]
            if not ok:
                continue
            moves = torch.stack([w + _nonradial(w, masks[j], eng.gen) for j in ok])
            dd = (eng.losses(name, moves, bound) - base).abs()
            for jj, j in enumerate(ok):
                if float(dd[jj]) > bound:  # the batch reads this block: a gauge, not an unused block
                    i = idx[j]
                    found.append(Block(axis, i * b, (i + 1) * b, float(dl[j]), float(dd[jj])))
                    covered[i * b:(i + 1) * b] = True
    return found


def _describe(blocks: list[Block], shape: Sequence[int]) -> str:
    if not blocks:
        return ""
    if blocks[0].axis is None:
        return "whole tensor"
    parts = []
    for axis, word in ((0, "rows"), (1, "columns")):
        bs = [b for b in blocks if b.axis == axis]
        if not bs:
            continue
        sizes = sorted({b.stop - b.start for b in bs})
        cover = sum(b.stop - b.start for b in bs)
        of = "" if cover == shape[axis] else f" (covering {cover} of {shape[axis]})"
        parts.append(f"{word}: {len(bs)} block{'s' if len(bs) > 1 else ''} of "
                     f"{'/'.join(str(s) for s in sizes)}{of}")
    return "; ".join(parts)


def _attach_reasons(eng: _Engine, rows: list[TensorCensus], owner: dict[str, str], readers: dict[str, list[str]],
                    norm_io: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    for r in rows:
        if not r.blocks:
            continue
        norms = readers.get(owner.get(r.name, ""), [])
        if not norms:
            r.reason = "not visible (no normalization reads this module's output directly)"
            continue
        descr = []
        for nrm in norms:
            m = eng.norms[nrm]
            over = int(norm_io[nrm][0].shape[-1])
            e = eng.own_eps.get(nrm)
            descr.append(f"{nrm} ({type(m).__name__} over {over}, eps={'torch default' if e is None else f'{e:g}'})")
        r.reason = "output read by " + ", ".join(descr)


def _eps_report(eng: _Engine, r: TensorCensus, owner: dict[str, str], readers: dict[str, list[str]],
                norm_io: dict[str, tuple[torch.Tensor, torch.Tensor]], loss_own: float, bound: float,
                cs: torch.Tensor) -> EpsReport:
    """At the model's own eps: loss and norm-output deviations of the first gauge block, beside the eps law."""
    w = eng.params[r.name].detach()
    b = r.blocks[0]
    mask = torch.ones_like(w) if b.axis is None else _block_mask(w.shape, b.axis, b.start, b.stop, w.dtype)
    vals = w * (1.0 + mask.unsqueeze(0) * (cs.reshape((-1,) + (1,) * w.dim()) - 1.0))  # (C, *shape)
    dl = float((eng.losses(r.name, vals, bound) - loss_own).abs().max())
    norms = readers.get(owner.get(r.name, ""), [])
    nrm = norms[0] if norms else None
    eps = eng.own_eps.get(nrm) if nrm else None
    if nrm is None or norm_kind(eng.norms[nrm]) == "other":
        return EpsReport(eps=None if nrm is None else _eps_value(eps), loss_change=dl, output_change=None,
                         output_law=None, law_agreement=None, break_scales=None)
    m = eng.norms[nrm]
    e = _eps_value(eps)
    z0, y0 = norm_io[nrm]
    layer = norm_kind(m) == "layer"
    bias = getattr(m, "bias", None)
    meas, law = 0.0, 0.0
    for j in range(len(cs)):  # loop over the few scales: the hook cannot run under vmap
        zc, yc = _norm_io_at(eng, nrm, r.name, vals[j])
        hit = (zc != z0).any(-1)  # rows of the norm's input this block feeds
        z = z0[hit]
        y = y0[hit]
        if layer:  # LayerNorm(cz) = r(c) LayerNorm(z) on the centred part, m = the variance
            z = z - z.mean(-1, keepdim=True)
            y = y - bias.detach() if bias is not None else y
        meas = max(meas, float((yc[hit] - y0[hit]).abs().max()) if bool(hit.any()) else 0.0)
        mrow = z.pow(2).mean(-1, keepdim=True)
        law = max(law, float((eps_ratio_minus_one(cs[j], mrow, e).abs() * y.abs()).max()) if bool(hit.any())
                  else 0.0)
    out_tol = tolerance("float64", size=int(z0.shape[-1]), scale=float(y0.abs().max())).bound(
        float(y0.abs().max()))
    zr = z0 - z0.mean(-1, keepdim=True) if layer else z0
    yr = (y0 - bias.detach()) if (layer and bias is not None) else y0
    bs = break_scales(zr.reshape(-1, zr.shape[-1]), yr.reshape(-1, yr.shape[-1]), e, out_tol)
    agree = abs(meas - law) / law if law > 0 else (0.0 if meas <= out_tol else math.inf)
    return EpsReport(eps=e, loss_change=dl, output_change=meas, output_law=law,
                     law_agreement=agree, break_scales=bs)


# ------------------------------------------------------------------------------------------------ output
def census_table(res: CensusResult, *, all_tensors: bool = False) -> str:
    """Human table by layer: every gauge (or partial gauge) tensor; ``all_tensors`` lists the rest too."""
    lines = [f"gauge census of {res.model} (float64; scales c = {', '.join(f'{c:g}' for c in res.scales)}; "
             f"|dL| tolerance {res.tolerance:.2e} from rmsgauge.tolerance(size={res.tolerance_terms['size']}, "
             f"depth={res.tolerance_terms['depth']}); exact gauges at eps = 0)"]
    if res.randomized:
        lines.append(f"  all-zero tensors moved to a random point first: {', '.join(res.randomized)}")
    hdr = f"  {'tensor':<44} {'shape':<14} {'verdict':<13} {'partition':<30} {'max|dL| eps=0':>13} " \
          f"{'own eps':>8} {'max|dL| own':>11} {'out dev / eps law':>19}"
    lines += [hdr, "  " + "-" * (len(hdr) - 2)]
    layer = None
    shown = [t for t in res.tensors if all_tensors or t.blocks]
    for t in shown:
        lay = _layer_of(t.name)
        if lay != layer:
            lines.append(f"  [{lay}]")
            layer = lay
        e = t.eps
        own = "-" if e is None or e.eps is None else f"{e.eps:.1e}"
        dl_own = "-" if e is None else f"{e.loss_change:.2e}"
        law = "-" if e is None or e.output_law is None else f"{e.output_change:.2e}/{e.output_law:.2e}"
        lines.append(f"  {t.name:<44} {'x'.join(map(str, t.shape)):<14} {t.status:<13} {t.partition[:30]:<30} "
                     f"{t.loss_change:>13.2e} {own:>8} {dl_own:>11} {law:>19}")
        if t.reason and t.blocks:
            lines.append(f"      why: {t.reason}")
    if not shown:
        lines.append("  (no gauge tensors or blocks)")
    n_g = sum(t.status == "gauge" for t in res.tensors)
    n_p = sum(t.status == "partial gauge" for t in res.tensors)
    n_u = sum(t.status == "unused" for t in res.tensors)
    lines.append(f"  {len(res.tensors)} tensors: {n_g} gauge, {n_p} partial gauge, {n_u} unused by the batch, "
                 f"{len(res.tensors) - n_g - n_p - n_u} not a gauge; vmap {'on' if res.vectorized else 'off'}")
    return "\n".join(lines)
