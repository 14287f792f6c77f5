"""One hooked forward of the census's copy (who reads whom, the sizes the tolerance needs), and its progress lines."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gauge.census.engine import EXACT_VAR_MIN, CensusError, Engine
from gauge.census.norms import NormInfo, norm_info, rows


@dataclass
class Capture:
    """What one forward shows: each norm's first input and output (keyed by module name, or by
    :attr:`gauge.census.sites.Site.key`), which norms read each module's output (same storage: views count), which
    module holds each parameter, ``size`` and ``depth`` of the loss tolerance, the loss, the dropout modules on."""

    norm_io: dict[str, tuple[torch.Tensor, torch.Tensor]]
    readers: dict[str, list[str]]
    owner: dict[str, str]
    infos: dict[str, NormInfo]
    size: int
    depth: int
    loss: float
    dropouts: int = 0
    calls: dict[str, tuple[tuple, dict, Any]] = field(default_factory=dict)  # module -> first (args, kwargs, out)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)  # norm -> dL/d(its first output)

    def first_reader(self, param: str) -> tuple[str, NormInfo] | None:
        """The first normalization that reads the output of the module holding ``param`` (None: none does)."""
        norms = self.readers.get(self.owner.get(param, ""), [])
        return (norms[0], self.infos[norms[0]]) if norms else None


def capture(eng: Engine, check: bool = True, keep: frozenset[str] = frozenset(),
            grads: frozenset[str] = frozenset()) -> Capture:
    """One forward with hooks on every module; ``check``: the batch variances of BatchNorm in training mode are where
    eps = 2^-1022 is exactly eps = 0 (:data:`gauge.census.engine.EXACT_VAR_MIN`); ``keep``: modules whose first call
    (arguments and output) is kept; ``grads``: norms whose first output's gradient is taken (one backward to those
    outputs only: no parameter gradient is formed)."""
    outs: dict[str, list[torch.Tensor]] = {}
    norm_io: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    stats = {"size": 1, "depth": 0}
    names = {id(m): n for n, m in eng.model.named_modules()}

    calls: dict[str, tuple[tuple, dict, Any]] = {}
    live: dict[str, torch.Tensor] = {}  # the outputs whose gradient is wanted, still in the graph
    readable = set(eng.norms) | set(eng.eps_holders)  # a module holding an eps it keeps reads like a norm

    def hook(mod: nn.Module, inp: tuple, kwargs: dict, out: Any) -> None:
        n = names[id(mod)]
        if n in keep and n not in calls:
            calls[n] = (inp, kwargs, out)
        ts = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
        outs.setdefault(n, []).extend(ts)  # kept alive: no storage is reused within this forward
        stats["depth"] += 1
        stats["size"] = max([stats["size"], *(int(t.numel()) for t in ts)])
        if n in readable and n not in norm_io and inp and isinstance(inp[0], torch.Tensor) and ts:
            norm_io[n] = (inp[0].detach(), ts[0].detach())
            if n in grads and ts[0].requires_grad:
                live[n] = ts[0]

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in eng.model.modules()]
    eng.watch.record = sites = {}  # the first (input, output) of every site the watch finds in this forward
    try:
        loss_t = eng.loss(grad=bool(grads))
    finally:
        for h in handles:
            h.remove()
        eng.watch.record = None
    kept = eng.kept_eps()
    for n in [n for n in norm_io if n not in eng.norms and n not in kept]:
        del norm_io[n]  # its eps is a site's (or a norm's inside it): that one is the reader
    infos = {n: norm_info(m) for n, m in eng.norms.items()}
    infos.update({n: NormInfo("other", type(eng.mods[n]).__name__, False, True) for n in kept})
    for key, io in sites.items():
        site = eng.watch.sites[key]
        if site.host not in eng.norms:  # inside a recognised norm module, that module is the reader
            norm_io[key], infos[key] = io, site.info
    loss = float(loss_t.detach())
    got: dict[str, torch.Tensor] = {}
    if live and loss_t.requires_grad:
        gs = torch.autograd.grad(loss_t, list(live.values()), allow_unused=True)
        got = {n: g.detach() for n, g in zip(live, gs) if g is not None}
    del loss_t
    live.clear()  # the graph and its activations are no longer needed
    readers: dict[str, list[str]] = {}
    for mod, ts in outs.items():
        ptrs = {t.untyped_storage().data_ptr() for t in ts}
        for nrm, (z, _) in norm_io.items():
            if nrm != mod and z.untyped_storage().data_ptr() in ptrs:
                readers.setdefault(mod, []).append(nrm)
    outs.clear()  # the activations are no longer needed
    owner = {f"{mname}.{pn}" if mname else pn: mname for mname, m in eng.model.named_modules()
             for pn, _ in m.named_parameters(recurse=False)}
    for n, (z, _) in norm_io.items():  # where eps = 2^-1022 stands in for BatchNorm's eps = 0, it must be exact
        info = infos[n]
        if check and info.family == "batch" and info.batch_stats and (n in eng.own_eps or n in eng.watch.sites):
            v = float(rows(info, eng.norms.get(n), z).var(dim=-1, unbiased=False).min())
            if v < EXACT_VAR_MIN:
                raise CensusError(f"{n}: a channel's batch variance is {v:.3g}, below 2^-968 where the stand-in "
                                  f"eps = 2^-1022 is not exactly eps = 0; use a batch whose channels vary")
    eng.act_bytes = stats["size"] * 8
    drop = sum(1 for m in eng.model.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0)
    return Capture(norm_io, readers, owner, infos, stats["size"], stats["depth"], loss, drop, calls, got)


def randomize_zero_tensors(eng: Engine) -> list[str]:
    """Move every all-zero tensor (biases at init) to a random point of the parameters' scale: scaling zero is the
    identity and would prove nothing."""
    norms = {n: float(torch.linalg.vector_norm(p.detach())) for n, p in eng.params.items()}  # one pass each
    count = sum(eng.params[n].numel() for n, v in norms.items() if v > 0)
    rms = math.sqrt(sum(v * v for v in norms.values()) / count) if count else 1.0
    out = [n for n, v in norms.items() if v == 0]
    with torch.no_grad():
        for n in out:
            p = eng.params[n]
            p.copy_(torch.randn(p.shape, generator=eng.gen, dtype=p.dtype) * rms)
    return out


def _hms(s: float) -> str:
    s = max(round(s), 0)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """Progress lines for ``report`` (None: silent): phases, then "<what> k of N" with the elapsed time and an ETA
    (the rate so far); the command line shows them on stderr."""

    def __init__(self, report: Callable[[str], None] | None) -> None:
        self.report = report
        self.t0 = self.t1 = time.perf_counter()
        self.what, self.total, self.k = "", 0, 0

    def phase(self, text: str) -> None:
        if self.report is not None:
            self.report(f"census: {text} | elapsed {_hms(time.perf_counter() - self.t0)}")

    def start(self, what: str, total: int) -> None:
        self.what, self.total, self.k, self.t1 = what, total, 0, time.perf_counter()

    def tick(self, count: int, name: str = "") -> None:
        self.k = min(self.k + count, self.total)
        if self.report is None or not self.total:
            return
        spent = time.perf_counter() - self.t1
        eta = spent / self.k * (self.total - self.k) if self.k else 0.0
        self.phase(f"{self.what} {self.k} of {self.total}{f' ({name})' if name else ''} | ETA {_hms(eta)}")
