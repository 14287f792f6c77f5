r"""The census's float64 copy of a model (:func:`float64_copy`, :class:`Float64Everywhere`) and the batched
evaluation of its loss at candidate weights (:class:`Engine`: one ``torch.func.vmap`` of ``functional_call`` where
the model allows it, chunked to a memory budget; the RNG re-seeded before every evaluation).

**Dropout.**  A dropout mask multiplies entries by 0 or :math:`1/(1-p)`, which commutes with every positive
scaling, so the gauges with dropout on (any fixed mask) are the gauges with it off; the census turns it off on the
copy so that two evaluations compare the same function, while the norms keep the mode the user trains in.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import gc
import inspect
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from gauge.census.norms import eps_attr, is_norm_module
from gauge.census.sites import EpsWatch, eps_like_attrs
from rmsgauge.cli import one_line

_LOW_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# torch refuses eps = 0 in BatchNorm's training mode; the smallest normal float64 2^-1022 stands in for 0.  The kernel
# adds eps once, to the batch variance: fl(var + 2^-1022) == var bit for bit whenever 2^-1022 is below half an ulp of
# var, i.e. for every var >= 2^-968 (about 4e-292), so the arithmetic is that of eps = 0 exactly (checked per batch).
TINY_EPS = float(torch.finfo(torch.float64).tiny)
EXACT_VAR_MIN = 2.0 ** -968
CANDIDATE_BYTES = 1 << 30  # memory for one vmapped chunk of candidates (their values and their forwards' activations)
VMAP_CHUNK = 64  # candidates per vmapped call at most, however small the model
ACTIVATION_COPIES = 4  # per candidate: the largest activation (logits) and its softmax/loss temporaries live at once
_DROPOUTS = {F.dropout, F.alpha_dropout, F.feature_alpha_dropout, F.dropout1d, F.dropout2d, F.dropout3d,
             torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout,
             torch.dropout_, torch.alpha_dropout_, torch.feature_dropout_, torch.feature_alpha_dropout_}
_SDPA_DROPOUT_POS = 4  # scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, ...)
_BN_ARGS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")


# how to pass a loss for a model that returns logits (one clause of the one-line errors that need it)
LOSS_FN_HINT = ("pass loss_fn instead, e.g. census(model, lambda m: F.cross_entropy(m(x.double()), y)) (a --model "
                "factory returns (model, loss_fn))")


class CensusError(ValueError):
    """The census cannot analyse this model (one line saying why: no parameters, a failing or random loss, ...)."""


class Float64Everywhere(TorchFunctionMode):
    """Float64 for every floating computation; dropout off; BatchNorm without running-stat updates in training
    and with eps <= 0 replaced by :data:`TINY_EPS` (exactly eps = 0's arithmetic, see above)."""

    _CASTS = (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self._CASTS:
            return args[0].double()
        if func in _DROPOUTS:
            return args[0] if args else kwargs["input"]
        if func is F.scaled_dot_product_attention:
            if len(args) > _SDPA_DROPOUT_POS:
                args = (*args[:_SDPA_DROPOUT_POS], 0.0, *args[_SDPA_DROPOUT_POS + 1:])
            kwargs.pop("dropout_p", None)
        if func is F.batch_norm:  # by name; training: no running statistics (they never change this output, and an
            # in-place update cannot run under vmap); eps <= 0 -> TINY_EPS
            args, kwargs = (), {**dict(zip(_BN_ARGS, args)), **kwargs}
            if kwargs.get("training", False):
                kwargs["running_mean"] = kwargs["running_var"] = None
            if kwargs.get("eps", 1e-5) <= 0.0:
                kwargs["eps"] = TINY_EPS
        if kwargs.get("dtype") in _LOW_FLOATS:
            kwargs["dtype"] = torch.float64
        args = tuple(torch.float64 if (isinstance(a, torch.dtype) and a in _LOW_FLOATS) else a for a in args)
        return func(*args, **kwargs)


class LossModule(nn.Module):
    """Wraps ``loss_fn(model)`` as a module so ``torch.func.functional_call`` can swap parameters."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self._loss_fn = loss_fn

    def forward(self) -> torch.Tensor:
        return self._loss_fn(self.model)


class Eager(nn.Module):
    """A ``torch.compile``'d module's original module, run eagerly under the same name (``_orig_mod``): the compiled
    graph computes the same function, and names match the user's ``named_parameters()``."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self._orig_mod = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # attributes a loss closure reads (config, heads) come from the inner
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)


def loss_from_output(out: Any) -> torch.Tensor:
    """The scalar loss in a model's output: a scalar tensor, ``out.loss`` (Hugging Face), or the scalar of a tuple."""
    found = [out, getattr(out, "loss", None)]
    if isinstance(out, (tuple, list)):
        found += [o for o in out if isinstance(o, torch.Tensor) and o.is_floating_point()]
    for o in found:
        if isinstance(o, torch.Tensor) and o.numel() == 1:
            return o.reshape(())
    what = f"a tensor of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"
    raise CensusError(f"the model's output ({what}) holds no scalar loss: census(model, batch=...) needs the model "
                      f"to return its loss; {LOSS_FN_HINT}")


def _as_call(batch: Any) -> tuple[tuple, dict, str]:
    """``batch`` as the model's call: ``model(**batch)`` (dict), ``model(*batch)`` (tuple/list) or ``model(batch)``."""
    if isinstance(batch, dict):
        return (), batch, "model(**batch)"
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}, "model(*batch)"
    return (batch,), {}, "model(batch)"


def check_batch_call(model: nn.Module, batch: Any) -> None:
    """A :class:`CensusError` where ``model`` cannot be called with ``batch`` the way :func:`batch_loss_fn` calls it,
    read from the signature before any copy or forward (none where the signature does not say)."""
    args, kwargs, call = _as_call(batch)
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or wrapped forward: the call itself will tell
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        raise CensusError(f"census(model, batch=...) calls {call} and reads the loss from its output, but "
                          f"{type(model).__name__}.forward does not take this batch ({e}); {LOSS_FN_HINT}") from None


def batch_loss_fn(batch: Any) -> Callable[[nn.Module], torch.Tensor]:
    """A loss closure for ``model(**batch)`` (dict), ``model(*batch)`` (tuple/list) or ``model(batch)``."""

    def to64(x: Any) -> Any:
        return x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    args, kwargs, _ = _as_call(batch)
    args, kwargs = tuple(to64(v) for v in args), {k: to64(v) for k, v in kwargs.items()}
    return lambda m: loss_from_output(m(*args, **kwargs))


def is_compiled(m: nn.Module) -> bool:
    return type(m).__name__ == "OptimizedModule" and isinstance(m._modules.get("_orig_mod"), nn.Module)


def _to64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=torch.float64 if t.is_floating_point() else t.dtype, copy=True)


def float64_copy(model: nn.Module, inplace: bool = False) -> nn.Module:
    """A float64 CPU copy of ``model`` built one tensor at a time (peak: the model plus its float64 copy), or
    ``model`` itself converted (``inplace``).  Tensor attributes computed from parameters (a legacy ``weight_norm``
    module's ``weight``) are detached: its hook recomputes them; ``torch.compile``'d modules become :class:`Eager`.
    """
    if inplace:
        out = model.to(device="cpu", dtype=torch.float64)  # tensor by tensor: each old one freed as it goes
    else:
        memo: dict[int, Any] = {}
        for p in model.parameters():
            memo.setdefault(id(p), nn.Parameter(_to64(p), requires_grad=p.is_floating_point()))
        for b in model.buffers():
            memo.setdefault(id(b), _to64(b))
        for m in model.modules():
            for v in vars(m).values():
                if isinstance(v, torch.Tensor) and v.grad_fn is not None:
                    memo.setdefault(id(v), _to64(v))
        try:
            out = copy.deepcopy(model, memo)
        except Exception as e:
            raise CensusError(f"cannot copy the model ({type(e).__name__}: {one_line(e)[:200]}); "
                              f"the census never changes the user's model, so it needs copy.deepcopy to work") from e
    if is_compiled(out):
        out = Eager(out._orig_mod)
    for parent in list(out.modules()):
        for k, child in list(parent._modules.items()):
            if child is not None and is_compiled(child):
                parent._modules[k] = Eager(child._orig_mod)
    return out


def release_memory() -> None:
    """Hand freed memory back to the operating system: Python's garbage, then glibc's heap (``malloc_trim``: many
    freed float32 tensors of a converted model otherwise stay in the process's resident set)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class Engine:
    """The float64 copy, its loss, and batched evaluation of candidate values of one or two parameters."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor], *, seed: int,
                 mode: str | None, inplace: bool) -> None:
        if next(model.parameters(), None) is None:
            n_buf = len(list(model.buffers()))
            raise CensusError(f"{type(model).__name__} has no parameters ({n_buf} buffer{'s' * (n_buf != 1)}): "
                              f"nothing to scale, so no gauge to find")
        self.compiled = is_compiled(model) or any(is_compiled(m) for m in model.modules())
        self.model = float64_copy(model, inplace=inplace)
        release_memory()
        if mode is not None:
            self.model.train(mode == "train")
        self.wrap = LossModule(self.model, loss_fn)
        self.seed = seed
        self.gen = torch.Generator().manual_seed(seed)  # own generator: the census never moves the global RNG
        self.params = {n: p for n, p in self.model.named_parameters() if p.is_floating_point()}
        if not self.params:
            raise CensusError(f"{type(model).__name__} has no floating-point parameters: nothing to scale")
        for p in self.params.values():
            p.requires_grad_(True)
        self.mods = dict(self.model.named_modules())
        self.norms = {n: m for n, m in self.mods.items() if is_norm_module(m)}
        self.own_eps = {n: getattr(m, a) for n, m in self.norms.items() if (a := eps_attr(m)) is not None}
        # every module holding an eps-named float: the ones no recognised norm or found site accounts for are kept
        self.eps_holders = {n: attrs for n, m in self.mods.items() if (attrs := eps_like_attrs(m))}
        self.watch = EpsWatch()  # functional and hand-written norms, wherever their eps is
        self.watch.attach(self.model)
        self.vmap_ok: bool | None = None
        self.act_bytes = 0  # the largest activation of one forward (set by the capture): sizes the vmap chunks

    def close(self) -> None:
        """Remove the watch's hooks (the copy may be the caller's own model, ``inplace``)."""
        self.watch.detach()

    def set_eps(self, zero: bool) -> None:
        """Every norm's eps to 0 (the exact gauges) or back to its own value; ``zero`` also drops the eps of every
        functional and hand-written norm of the forward (:class:`gauge.census.sites.EpsWatch`)."""
        for n, e in self.own_eps.items():
            m = self.norms[n]
            setattr(m, eps_attr(m), 0.0 if zero else e)
        self.watch.zero = zero

    def own_eps_of(self, norm: str) -> float | None:
        """The own eps of a norm module, a found site (its key) or a module that kept its eps."""
        if norm in self.own_eps:
            return self.own_eps[norm]
        if norm in self.watch.sites:
            return self.watch.sites[norm].eps
        hosted = [s.eps for s in self.watch.sites.values() if s.host == norm]
        kept = list(self.kept_eps().get(norm, {}).values())
        return (hosted or kept or [None])[0]

    def kept_eps(self) -> dict[str, dict[str, float]]:
        """Module -> ``{attribute: value}`` of the eps-named floats not set to 0: neither a recognised norm's eps
        attribute nor the eps of a site (or recognised norm) inside that module (a block's copy of the eps it hands
        to its norms counts as that eps)."""
        found = [(s.host, s.eps) for s in self.watch.sites.values()] + list(self.own_eps.items())
        out: dict[str, dict[str, float]] = {}
        for name, attrs in self.eps_holders.items():
            own = eps_attr(self.norms[name]) if name in self.own_eps else None
            for attr, v in attrs.items():
                inside = any(e == v and (not name or h == name or h.startswith(name + ".")) for h, e in found)
                if attr != own and not inside:
                    out.setdefault(name, {})[attr] = v
        return out

    @property
    def mode(self) -> str:
        flags = {m.training for m in self.model.modules()}
        return "mixed" if len(flags) > 1 else ("train" if flags.pop() else "eval")

    def _run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` with the global RNG re-seeded (restored after): every evaluation draws the same random values;
        under the watch, which drops the eps of every norm it finds while the eps are zeroed."""
        self.watch.reset()
        with torch.random.fork_rng(devices=[]), self.watch:
            torch.manual_seed(self.seed)
            return fn()

    def loss(self, grad: bool = False) -> torch.Tensor:
        try:
            with torch.set_grad_enabled(grad):
                out = self._run(self.wrap)
        except CensusError:
            raise
        except Exception as e:
            raise CensusError(f"the loss failed on the float64 copy ({type(e).__name__}: "
                              f"{one_line(e)[:200]})") from e
        if not (isinstance(out, torch.Tensor) and out.numel() == 1):
            raise CensusError("loss_fn must return a scalar tensor")
        return out.reshape(())

    def call(self, swaps: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss with the named parameters replaced (``functional_call``: the copy is not modified)."""
        return self._run(lambda: torch.func.functional_call(
            self.wrap, {"model." + k: v for k, v in swaps.items()}, ()).reshape(()))

    def losses(self, names: Sequence[str], make: Callable[[int, int], Sequence[torch.Tensor]], count: int,
               tol: float) -> torch.Tensor:
        """``(count,)`` losses; ``make(lo, hi)`` returns, per name, candidate values ``(hi - lo, *shape)``.

        Built and evaluated chunk by chunk (memory: :data:`CANDIDATE_BYTES`), freed as it goes."""
        per = sum(self.params[n].numel() for n in names) * 8 + ACTIVATION_COPIES * self.act_bytes
        chunk = max(1, min(VMAP_CHUNK, CANDIDATE_BYTES // max(per, 1)))
        out = []
        for lo in range(0, count, chunk):
            vals = make(lo, min(count, lo + chunk))
            out.append(self._batch(tuple(names), vals, tol))
            del vals
        return torch.cat(out)

    def _batch(self, names: tuple[str, ...], vals: Sequence[torch.Tensor], tol: float) -> torch.Tensor:
        with torch.no_grad():
            if len(vals[0]) == 1:  # one candidate per chunk (a large model): a plain call, nothing to batch
                return self.call({n: v[0] for n, v in zip(names, vals)}).reshape(1)
            if self.vmap_ok is not False:
                try:
                    with warnings.catch_warnings():
                        # ops without a batching rule (SDPA on CPU) run per candidate inside vmap: slower, same values
                        warnings.filterwarnings("ignore", message=".*performance drop.*", category=UserWarning)
                        out = torch.func.vmap(lambda *ws: self.call(dict(zip(names, ws))), randomness="same")(*vals)
                    if self.vmap_ok is None:  # trust vmap only once it agrees with the plain call
                        ref = self.call({n: v[0] for n, v in zip(names, vals)})
                        self.vmap_ok = bool(abs(float(out[0] - ref)) <= tol)
                    if self.vmap_ok:
                        return out
                except Exception:  # any model vmap cannot batch (data-dependent control flow, .item(), ...)
                    self.vmap_ok = False
            try:
                return torch.stack([self.call({n: v[j] for n, v in zip(names, vals)}) for j in range(len(vals[0]))])
            except Exception as e:  # the model runs at its own weights but not at a scaled candidate: say so
                raise CensusError(f"the loss failed at scaled values of {', '.join(names[:3])}"
                                  f"{', ...' if len(names) > 3 else ''} ({type(e).__name__}: "
                                  f"{one_line(e)[:200]})") from e


def finite_or_raise(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise CensusError(f"the loss is {value} on the float64 copy {what}; the census needs a finite loss (a "
                          f"padding row or a constant channel divides 0 by 0 at eps = 0: change the batch)")
    return value
