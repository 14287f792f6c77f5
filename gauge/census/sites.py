r"""Normalizations found in the forward itself, wherever the model keeps their eps.

A norm module is recognised by its type or class name (:mod:`gauge.census.norms`); the same arithmetic also runs
where neither shows.  :class:`EpsWatch`, a torch-function mode the engine enters for every evaluation, finds

- **functional norms** (:data:`FUNCTIONAL`): the ``eps`` argument of ``F.rms_norm``, ``F.layer_norm``,
  ``F.group_norm``, ``F.instance_norm``, ``F.batch_norm`` and ``F.normalize``;
- **hand-written norms**: a statistic of a set (mean or sum of squares, centred or not, variance, standard deviation
  or vector norm, possibly scaled or square-rooted) plus a positive constant of at most :data:`EPS_MAX` (a literal,
  an attribute of any name or a config field), which then goes under a root or a reciprocal, or divides.  A larger
  constant is part of the function, not an eps (a squash's :math:`\lVert x\rVert^2 / (1 + \lVert x\rVert^2)`).

While ``zero`` is set (the exact phase) each such eps is dropped; otherwise every operation runs as written.  Each
one found is a :class:`Site` (the innermost module running it, what it computes, its eps, its first input), so the
census can name it as the norm that reads a weight's output.  An eps-named float attribute no site accounts for is
reported as *kept* (:func:`eps_like_attrs`): never silently judged at eps = 0.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakTensorKeyDictionary

from gauge.census.norms import NormInfo, describe

# the default eps of every torch and Hugging Face norm is at most 1e-3 (TensorFlow ports' BatchNorm); a constant above
# 1e-2 added to a statistic is part of the function the model computes, not a guard against division by zero
EPS_MAX = 1e-2
ZERO_EPS = float(torch.finfo(torch.float64).tiny)  # at or below: already the exact phase's eps (0 or the stand-in)
EPS_NAME = re.compile(r"(?:^|_)eps(?:ilon)?(?:_|$)", re.IGNORECASE)  # eps, norm_eps, variance_epsilon, eps_sq
LOSS_FN = "(loss_fn)"  # where a site outside every module of the model runs

# functional norm -> (family, centred); its eps is the keyword ``eps`` of its signature
FUNCTIONAL: dict[Callable, tuple[str, bool]] = {
    F.rms_norm: ("rms", False), F.layer_norm: ("layer", True), F.group_norm: ("group", True),
    F.instance_norm: ("instance", True), F.batch_norm: ("batch", True), F.normalize: ("other", False),
}
_SIGNATURES = {f: inspect.signature(f) for f in FUNCTIONAL}

T = torch.Tensor
_SQUARES = {T.pow, torch.pow, T.__pow__, torch.square, T.square, T.__mul__, T.mul, torch.mul}
_MEANS = {T.mean, torch.mean}
_SUMS = {T.sum, torch.sum}
_REDUCTIONS = _MEANS | _SUMS
_STATS = {T.var: "var(x)", torch.var: "var(x)", T.std: "std(x)", torch.std: "std(x)", torch.var_mean: "var(x)",
          torch.std_mean: "std(x)", torch.linalg.vector_norm: "‖x‖", torch.norm: "‖x‖", T.norm: "‖x‖",
          torch.linalg.norm: "‖x‖"}
_CENTRED_STATS = {T.var, torch.var, T.std, torch.std, torch.var_mean, torch.std_mean}
_SUBS = {T.__sub__, T.sub, torch.sub}
_ADDS = {T.__add__, T.__radd__, T.add, torch.add}
_SCALES = {T.__mul__, T.__rmul__, T.mul, torch.mul, T.__truediv__, T.div, torch.div}
_ROOTS = {torch.rsqrt: "rsqrt", T.rsqrt: "rsqrt", torch.sqrt: "sqrt", T.sqrt: "sqrt", torch.reciprocal: "1/",
          T.reciprocal: "1/", T.__pow__: "pow", T.pow: "pow", torch.pow: "pow"}
_DIVS = {T.__truediv__: 1, T.div: 1, torch.div: 1, torch.true_divide: 1, T.__rtruediv__: 0}  # -> the divisor's place
_TRACKED = frozenset(FUNCTIONAL) | _SQUARES | _MEANS | _SUMS | set(_STATS) | _SUBS | _ADDS | _SCALES | set(_ROOTS) \
    | set(_DIVS)


@dataclass
class Stat:
    """A statistic of the set ``source`` (``n`` values per statistic, reduced over ``last`` trailing dims, or 0
    where the reduced dims are not trailing): ``expr`` says which one, e.g. ``mean(x²)``."""

    source: torch.Tensor
    expr: str
    centred: bool
    n: int
    last: int


@dataclass
class Site:
    """One normalization found in the forward: ``host`` the module running it (``""``: the model's own forward,
    :data:`LOSS_FN`: outside every module), ``op`` what it computes, ``eps`` its own eps (None: torch's default)."""

    key: str
    host: str
    op: str
    info: NormInfo
    eps: float | None
    shape: SimpleNamespace = field(default_factory=SimpleNamespace)  # normalized_shape, num_groups, bias; n, last

    @property
    def label(self) -> str:
        """``attn: F.rms_norm`` (a second one in the same module: ``attn: F.rms_norm #2``)."""
        k = int(self.key.rsplit("#", 1)[1])
        return f"{self.host or '(model)'}: {self.op}{f' #{k + 1}' if k else ''}"

    def describe(self, shape: torch.Size, eps: str) -> str:
        """The reason text, as :func:`gauge.census.norms.describe` words it for a module."""
        name = self.host or "(model)"
        if self.info.family in ("rms", "layer", "group", "instance", "batch") and not hasattr(self.shape, "n"):
            return describe(self.info, self.shape, shape, name, eps)
        n = getattr(self.shape, "n", None) or (int(shape[-1]) if len(shape) else 1)
        last = getattr(self.shape, "last", 1)
        what = {0: "its reduced dims", 1: "the last dim"}.get(last, f"the last {last} dims")
        return f"{name} ({self.info.cls} over {n} values: {what}{', centred' if self.info.centred else ''}, eps={eps})"


def eps_like_attrs(m: nn.Module) -> dict[str, float]:
    """The positive float attributes of ``m`` named like an eps (``eps``, ``norm_eps``, ``variance_epsilon``...)."""
    return {a: v for a, v in vars(m).items() if type(v) is float and v > 0 and EPS_NAME.search(a)}


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_square(func: Callable, args: tuple) -> bool:
    """``x * x``, ``x ** 2``, ``x.pow(2)``, ``x.square()``."""
    if func in (torch.square, T.square):
        return True
    if len(args) < 2:
        return False
    if func in (T.__mul__, T.mul, torch.mul):
        return args[1] is args[0]
    return _number(args[1]) and args[1] == 2


def _trailing(src: torch.Tensor, out: torch.Tensor) -> int:
    """How many trailing dims of ``src`` a reduction to ``out`` removed (kept as 1 or dropped); 0: not trailing."""
    s, o = tuple(src.shape), tuple(out.shape)
    return next((k for k in range(1, len(s) + 1) if o in (s[:len(s) - k], s[:len(s) - k] + (1,) * k)), 0)


class EpsWatch(TorchFunctionMode):
    """While ``zero``: finds the normalizations of the forward (see the module docstring) and runs each at eps = 0.

    ``attach(model)`` registers the forward hooks that say which module runs an operation; ``record`` (a dict, or
    None) receives each site's first ``(input, output)`` of a forward; ``sites`` lists every site seen."""

    def __init__(self) -> None:
        super().__init__()
        self.zero = False
        self.record: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
        self.sites: dict[str, Site] = {}
        self._classes: dict[str, str] = {}
        self._stack: list[str] = []
        self._count: dict[str, int] = {}
        self._handles: list[Any] = []
        self._mean_of = WeakTensorKeyDictionary()  # mean(x) -> x
        self._centred = WeakTensorKeyDictionary()  # x - mean(x) -> x
        self._square = WeakTensorKeyDictionary()  # x² (or (x - mean x)²) -> (x, centred)
        self._stat = WeakTensorKeyDictionary()  # statistic -> Stat
        self._plus = WeakTensorKeyDictionary()  # statistic + eps -> (statistic, eps)

    def attach(self, model: nn.Module) -> None:
        for name, m in model.named_modules():
            self._classes[name] = type(m).__name__
            self._handles.append(m.register_forward_pre_hook(partial(self._enter, name)))
            self._handles.append(m.register_forward_hook(partial(self._leave, name), always_call=True))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _enter(self, name: str, mod: nn.Module, args: tuple) -> None:
        self._stack.append(name)
        self._count[name] = 0

    def _leave(self, name: str, mod: nn.Module, args: tuple, out: Any) -> None:
        while self._stack and self._stack.pop() != name:
            pass

    def reset(self) -> None:
        """Before every evaluation: no module runs yet (a forward stopped by an exception leaves none behind)."""
        self._stack.clear()
        self._count.clear()

    def _site(self, op: str, info: NormInfo, eps: float | None, shape: SimpleNamespace) -> Site:
        host = self._stack[-1] if self._stack else LOSS_FN
        k = self._count.get(host, 0)
        self._count[host] = k + 1
        key = f"{host}::{op}#{k}"
        if key not in self.sites:
            cls = self._classes.get(host, "loss_fn") if host != LOSS_FN else "loss_fn"
            self.sites[key] = Site(key, host, op, NormInfo(info.family, f"{cls}'s {op}", info.centred,
                                                           info.batch_stats), eps, shape)
        return self.sites[key]

    def _keep(self, site: Site, z: torch.Tensor, y: Any) -> None:
        if self.record is not None and site.key not in self.record and isinstance(y, torch.Tensor):
            self.record[site.key] = (z.detach(), y.detach())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.zero or func not in _TRACKED:  # at the model's own eps every site runs as the model wrote it
            return func(*args, **kwargs)
        if func in FUNCTIONAL:
            return self._functional(func, args, kwargs)
        if func in _DIVS and len(args) == 2 and isinstance(args[_DIVS[func]], torch.Tensor) \
                and args[_DIVS[func]] in self._plus:
            return self._root(func, args, kwargs, _DIVS[func], "/")
        if func in _ROOTS and args and isinstance(args[0], torch.Tensor) and args[0] in self._plus and \
                (_ROOTS[func] != "pow" or (len(args) > 1 and _number(args[1]) and args[1] < 1 and args[1] != 0)):
            return self._root(func, args, kwargs, 0, _ROOTS[func])
        out = func(*args, **kwargs)
        self._track(func, args, out)
        return out

    def _functional(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        bound = _SIGNATURES[func].bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        eps = a.get("eps")
        if eps is not None and eps <= ZERO_EPS:  # a recognised module's eps, already set for the exact phase
            return func(*bound.args, **bound.kwargs)
        family, centred = FUNCTIONAL[func]
        stats = bool(a.get("training", False) or a.get("running_mean") is None) if family == "batch" else \
            bool(a.get("use_input_stats", True))
        z = a["input"]
        if func is F.normalize:  # one set per index of the other dims: the values along dim
            dim = a["dim"] % max(z.dim(), 1)
            shim = SimpleNamespace(n=int(z.shape[dim]) if z.dim() else 1, last=int(dim == z.dim() - 1))
        else:
            shim = SimpleNamespace(normalized_shape=tuple(a.get("normalized_shape") or ()),
                                   num_groups=a.get("num_groups"), bias=a.get("bias"))
        site = self._site(f"F.{func.__name__}", NormInfo(family, "", centred, stats), eps, shim)
        a["eps"] = 0.0
        out = func(*bound.args, **bound.kwargs)
        self._keep(site, z, out)
        return out

    def _root(self, func: Callable, args: tuple, kwargs: dict, at: int, op: str) -> Any:
        """A root, reciprocal or division of ``statistic + eps``: a site; while ``zero``, of the statistic alone."""
        stat, eps = self._plus[args[at]]
        st = self._stat[stat]
        expr = f"x / ({st.expr} + eps)" if op == "/" else f"{op}({st.expr} + eps)" if op != "pow" else \
            f"({st.expr} + eps)^{args[1]:g}"
        family = ("layer" if st.centred else "rms") if st.expr in ("mean(x²)", "var(x)", "std(x)") else "other"
        site = self._site(expr, NormInfo(family, "", st.centred, True), eps, SimpleNamespace(n=st.n, last=st.last))
        out = func(*(*args[:at], stat, *args[at + 1:]), **kwargs)
        self._keep(site, st.source, out)
        return out

    def _track(self, func: Callable, args: tuple, out: Any) -> None:
        """Remember the squares, means, centred sets, statistics and statistics + constant among the results."""
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor):
            return
        if func in _SQUARES and _is_square(func, args):
            self._square[out] = self._centred.get(x, x), x in self._centred
        elif func in _REDUCTIONS and x in self._square:
            src, centred = self._square[x]
            expr = f"{'mean' if func in _MEANS else 'sum'}({'(x - mean x)' if centred else 'x'}²)"
            self._stat[out] = Stat(src, "mean(x²)" if expr == "mean(x²)" else expr, centred,
                                   src.numel() // max(out.numel(), 1), _trailing(src, out))
        elif func in _MEANS:
            self._mean_of[out] = x
        elif func in _SUBS and len(args) > 1 and isinstance(args[1], torch.Tensor) and self._mean_of.get(args[1]) is x:
            self._centred[out] = x
        elif func in _STATS:
            o = out[0] if isinstance(out, tuple) else out
            self._stat[o] = Stat(x, _STATS[func], func in _CENTRED_STATS, x.numel() // max(o.numel(), 1),
                                 _trailing(x, o))
        elif func in _ADDS and len(args) > 1:
            stat, c = (x, args[1]) if x in self._stat else (args[1], x)
            if isinstance(stat, torch.Tensor) and stat in self._stat and _number(c) and 0 < c <= EPS_MAX:
                self._plus[out] = (stat, float(c))
        elif func in _SCALES and len(args) > 1 and x in self._stat and _number(args[1]) and args[1] > 0:
            self._stat[out] = self._stat[x]  # a statistic scaled by a constant (mean from a sum) is one still
        if func in _ROOTS and _ROOTS[func] == "sqrt" and x in self._stat:
            self._stat[out] = self._stat[x]  # the root mean square is a statistic of the same set
