r"""The gauge census of any PyTorch model: which parameter tensors (and which row/column blocks) are scale gauges.

A parameter tensor :math:`W` (or a block :math:`W_I` of its rows or columns) is a *scale gauge* of the loss when
:math:`L(c\,W_I) = L(W)` for every :math:`c > 0` (van Laarhoven 2017; Hoffer et al. 2018; Li & Arora 2019; Wan et
al. 2021, arXiv:2006.08419; Kosson, Messmer & Jaggi, arXiv:2305.17212, call them scale-invariant groups).  The
census decides this on a float64 copy (the user's model is never touched), in the mode the user trains in:

1. **Screen, then real scalings** (:mod:`gauge.census.search`): one backward screens every tensor and block by
   Euler's theorem; only what passes is scaled by each :math:`c` in ``scales`` (no powers of two: exact in floating
   point, they would prove nothing) and judged by the float64 round-off bound of the loss from
   :func:`rmsgauge.tolerance` (``size`` = the largest activation, ``depth`` = the number of module calls).
2. **Why**: hooks record which norm reads each module's output (:mod:`gauge.census.norms`).
3. **eps**: the exact gauges are found with every norm's eps set to 0 wherever the model keeps it
   (:mod:`gauge.census.sites`); at the model's own eps the deviation is measured beside the exact eps law of
   :mod:`gauge.laws` (:mod:`gauge.census.eps`).

Float64 throughout (:class:`gauge.census.engine.Float64Everywhere`): many models upcast to float32 *explicitly*.
A model the census cannot analyse raises :class:`CensusError`, one line saying why.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gauge.census.capture import Capture, Progress, capture, randomize_zero_tensors
from gauge.census.engine import (
    CensusError,
    Engine,
    Float64Everywhere,
    batch_loss_fn,
    check_batch_call,
    finite_or_raise,
    is_compiled,
)
from gauge.census.eps import Probe, eps_losses, eps_report
from gauge.census.norms import describe, norm_info, weight_norm_reasons
from gauge.census.records import Block, CensusResult, TensorCensus, describe_blocks
from gauge.census.search import (
    Member,
    Target,
    confirm,
    finest_blocks,
    gradient_screen,
    joint_target,
    nonradial_change,
    plan,
    whole_candidate,
)
from rmsgauge import check_range, tolerance

DEFAULT_SCALES = (0.37, 0.81, 1.7, 6.3)  # both sides of 1, none a power of two (2^k scaling is exact: proves nothing)
MODES = ("train", "eval")
SEED_LIMIT = 2**32  # seeds lie in [0, 2**32), as rmsgauge.seed_everything takes them


def check_arguments(seed: int, mode: str | None, scales: Sequence[float]) -> tuple[int, tuple[float, ...]]:
    """The census's own arguments (the CLI checks them before any work): ``(seed, scales)`` as the census uses them,
    or a ``ValueError`` naming the argument and its range."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be an integer in [0, 2**32 - 1] (rmsgauge.seed_everything's range), got {seed!r}")
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be None (the model's own .training flags), 'train' or 'eval'; got {mode!r}")
    for c in scales:
        check_range("scales", c, lo=0.0, lo_open=True)
        if c == 1.0 or math.log2(c).is_integer():
            raise ValueError(f"scales must be positive, not 1 and not powers of two (exact in floating point), "
                             f"got {c!r}")
    if len(scales) < 2:
        raise ValueError(f"scales needs at least 2 values (both sides of 1 recommended), got {list(scales)!r}")
    return int(seed), tuple(float(c) for c in scales)  # a numpy integer seed too: torch's generators take ints


def census(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor] | None = None, *, batch: Any = None,
           scales: Sequence[float] = DEFAULT_SCALES, partition: bool = True, own_eps: bool = True,
           seed: int = 0, mode: str | None = None, progress: Callable[[str], None] | None = None,
           inplace: bool = False, measure_eps_loss: bool = False) -> CensusResult:
    r"""The gauge census of ``model`` (see the module docstring).

    ``loss_fn(model) -> scalar tensor`` is called with the float64 copy (cast floating inputs with
    ``.to(torch.float64)``); or pass ``batch`` (``model(**batch)`` / ``model(*batch)`` / ``model(batch)`` whose
    output is a scalar, has ``.loss``, or is a tuple holding the scalar loss).  ``mode``: ``None`` keeps each
    module's ``.training`` flag, ``"train"``/``"eval"`` sets every module's.  ``partition=False`` skips the block
    search, ``own_eps=False`` the eps report; ``measure_eps_loss=True`` measures its loss change (one forward per
    gauge tensor) instead of taking it to first order in the reading norm's measured output change.
    ``inplace=True`` converts ``model`` itself (a caller that hands it over); otherwise ``model`` and the global
    RNG are untouched.  ``progress`` receives progress lines (tensor k of N, ETA).
    """
    if (loss_fn is None) == (batch is None):
        raise ValueError("census needs exactly one of loss_fn (a closure) or batch (an example batch)")
    seed, scales = check_arguments(seed, mode, scales)
    if batch is not None:
        check_batch_call(model, batch)
    fn = loss_fn if loss_fn is not None else batch_loss_fn(batch)
    prev_default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    t0 = time.perf_counter()
    prog = Progress(progress)
    try:
        with Float64Everywhere():
            prog.phase("float64 copy")
            eng = Engine(model, fn, seed=seed, mode=mode, inplace=inplace)
            try:
                res = _census(eng, model, scales, partition, own_eps, measure_eps_loss, prog)
            finally:
                eng.close()
    finally:
        torch.set_default_dtype(prev_default)
    res.seconds = time.perf_counter() - t0
    return res


def _census(eng: Engine, model: nn.Module, scales: tuple[float, ...], partition: bool, own_eps: bool,
            measure_eps_loss: bool, prog: Progress) -> CensusResult:
    eng.set_eps(zero=True)
    randomized = randomize_zero_tensors(eng)
    prog.phase("capture (one forward) and screen (one backward)")
    cap = capture(eng)
    base, targets = gradient_screen(eng)
    finite_or_raise(base, "with every norm's eps = 0")
    tol = tolerance("float64", size=cap.size, depth=max(cap.depth, 1), scale=abs(base))
    bound = tol.bound(abs(base))
    if abs(cap.loss - base) > bound:
        raise CensusError(f"the loss is random: two evaluations at the same weights differ by "
                          f"{abs(cap.loss - base):.3g} (tolerance {bound:.3g}) although the census re-seeds torch's "
                          f"RNG and turns dropout off; seed the model's own generator in loss_fn, or use mode='eval'")
    cs = torch.tensor(scales, dtype=torch.float64)
    rows = _search(eng, list(targets.values()), base, bound, tol.rtol, cs, partition, prog)
    _joint(eng, {r.name: r for r in rows}, targets, base, bound, tol.rtol, cs, partition, prog)
    _attach_reasons(eng, rows, cap)
    loss_own = _own_eps(eng, rows, cap, bound, cs, prog, measure_eps_loss) if own_eps else base
    prog.phase("done")
    zeroed = {**eng.own_eps, **{s.label: s.eps for s in eng.watch.sites.values()}}
    kept = {f"{n}.{a}" if n else a: v for n, attrs in eng.kept_eps().items() for a, v in attrs.items()}
    return CensusResult(tensors=rows, loss=base, loss_own_eps=loss_own, tolerance=bound,
                        tolerance_terms={"size": cap.size, "depth": cap.depth}, scales=scales,
                        eps_zeroed=zeroed, randomized=randomized, vectorized=bool(eng.vmap_ok),
                        model=f"{type(model._orig_mod).__name__} (torch.compile'd)" if is_compiled(model)
                        else type(model).__name__, mode=eng.mode, notes=_notes(eng, cap), eps_kept=kept)


def _search(eng: Engine, tgts: list[Target], base: float, bound: float, rtol: float, cs: torch.Tensor,
            partition: bool, prog: Progress) -> list[TensorCensus]:
    """Verdicts of ``tgts``: the finest gauge blocks the screen leaves (all targets' blocks confirmed together, in
    rounds), then the whole tensors not covered by blocks that pass the screen, then "unused" by a real move."""
    plans = {t.names: plan(t, rtol, bound) if partition else {} for t in tgts}
    wholes = [t for t in tgts if whole_candidate(t, rtol, bound)]
    n_blocks = sum(len(idx) for p in plans.values() for q in p.values() for _, idx in q[:1])
    prog.phase(f"{len(tgts)} tensors screened: {n_blocks} candidate blocks in "
               f"{sum(1 for p in plans.values() if p)} tensors and up to {len(wholes)} whole tensors need real "
               f"scalings")
    prog.start("real scalings: block", n_blocks + len(wholes))
    found = finest_blocks(eng, [t for t in tgts if plans[t.names]], plans, cs, base, bound, prog.tick)
    rows = {t.names: TensorCensus(name=t.names[0], shape=t.shape, status="not a gauge", loss_change=None,
                                  radial=t.radial, blocks=found.get(t.names, [])) for t in tgts}
    for t in tgts:
        r = rows[t.names]
        if r.blocks and any(sum(b.stop - b.start for b in r.blocks if b.axis == a) == t.shape[a]
                            for a in {b.axis for b in r.blocks}):  # a union of gauge blocks is a gauge (in turn)
            r.status, r.loss_change = "gauge", max(b.loss_change for b in r.blocks)
    todo = [Member(t, None, 0, 1) for t in wholes if rows[t.names].status != "gauge"]
    passed = {m.tgt.names: dl for m, dl in confirm(eng, todo, cs, base, bound, prog.tick)} if todo else {}
    for t in (m.tgt for m in todo if m.tgt.names in passed):
        r = rows[t.names]
        r.loss_change = passed[t.names]
        measured = t.perp <= bound  # the gradient cannot show the batch reads it: a real move must
        move = nonradial_change(eng, t, base, bound) if measured else t.perp
        if move <= bound:
            r.status, r.blocks = "unused", []
        else:
            r.status = "gauge"
            r.blocks = r.blocks or [Block(None, 0, t.shape[0] if t.shape else 1, passed[t.names], move, measured)]
    prog.tick(prog.total - prog.k)  # blocks found inside larger ones and whole tensors covered: nothing left to do
    for t in tgts:
        r = rows[t.names]
        if r.status == "not a gauge" and r.blocks:
            r.status = "partial gauge"
        r.partition = describe_blocks(r.blocks, t.shape)
    return [rows[t.names] for t in tgts]


def _joint(eng: Engine, by: dict[str, TensorCensus], targets: dict[str, Target], base: float, bound: float,
           rtol: float, cs: torch.Tensor, partition: bool, prog: Progress) -> None:
    """Weight and bias of one module, scaled together, where neither alone is a gauge (a centring norm reads both)."""
    pairs = []
    for mname, m in eng.model.named_modules():
        pre = f"{mname}." if mname else ""
        wn, bn = f"{pre}weight", f"{pre}bias"
        if wn not in by or bn not in by or "weight" not in m._parameters or "bias" not in m._parameters:
            continue
        w, b = targets[wn], targets[bn]
        if by[wn].status == by[bn].status == "not a gauge" and len(b.shape) == 1 and w.shape and \
                b.shape[0] == w.shape[0]:
            jt = joint_target(w, b)
            if (partition and plan(jt, rtol, bound)) or whole_candidate(jt, rtol, bound):
                pairs.append(jt)
    if not pairs:
        return
    prog.phase(f"joint weight-and-bias scalings of {len(pairs)} module(s)")
    for got in _search(eng, pairs, base, bound, rtol, cs, partition, Progress(None)):
        if not got.blocks or got.status == "unused":
            continue
        wn, bn = next(t.names for t in pairs if t.names[0] == got.name)
        for own, other in ((wn, bn), (bn, wn)):
            by[own].status, by[own].joint = "joint gauge", f"with {other}: {got.partition}"
            by[own].loss_change = got.loss_change
        by[wn].joint_blocks = got.blocks


def _own_eps(eng: Engine, rows: list[TensorCensus], cap: Capture, bound: float, cs: torch.Tensor,
             prog: Progress, measure: bool) -> float:
    """The eps report of every tensor with gauge blocks (its first block), at the model's own eps: one forward and
    one backward to the norms' outputs, then per tensor a few small calls (see :mod:`gauge.census.eps`)."""
    eng.set_eps(zero=False)
    gauged = [r for r in rows if r.blocks]
    owners = {r.name: cap.owner.get(r.name, "") for r in gauged}
    readers = {r.name: cap.first_reader(r.name) for r in gauged}
    prog.phase(f"eps report at the model's own eps: {len(gauged)} tensors")
    own = capture(eng, check=False, keep=frozenset(owners.values()),
                  grads=frozenset(rd[0] for rd in readers.values() if rd))
    loss_own = finite_or_raise(own.loss, "at the model's own eps")
    items = []
    prog.start("eps report: tensor", len(gauged))
    for r in gauged:
        (key, info), mname = readers[r.name] or (None, None), owners[r.name]  # key None: no norm reads it
        norm = eng.mods.get(key) if key not in eng.watch.sites else None  # a site has no module of its own
        pr = Probe(r.name, r.name[len(mname) + 1:] if mname else r.name, eng.mods[mname], own.calls.get(mname),
                   norm, info, own.norm_io.get(key), own.grads.get(key))
        r.eps, vals = eps_report(eng, pr, r.blocks[0], None if key is None else eng.own_eps_of(key), cs, measure)
        if vals:
            items.append((r, vals))
        else:
            prog.tick(1, r.name)
    measured = eps_losses(eng, [(r.name, vals) for r, vals in items], loss_own, bound, prog.tick)
    for (r, _), dl in zip(items, measured):
        r.eps.loss_change = dl
    return loss_own


def _attach_reasons(eng: Engine, rows: list[TensorCensus], cap: Capture) -> None:
    wn = weight_norm_reasons(eng.model)
    kept = eng.kept_eps()
    for r in rows:
        if r.name in wn:
            r.reason = wn[r.name]
            continue
        norms = cap.readers.get(cap.owner.get(r.name, ""), [])
        descr = []
        for nrm in norms:
            shape = cap.norm_io[nrm][0].shape
            e = eng.own_eps_of(nrm)
            eps = "torch default" if e is None else f"{e:g}"
            if nrm in eng.watch.sites:
                descr.append(eng.watch.sites[nrm].describe(shape, eps))
            elif nrm in kept:
                held = ", ".join(f"{a} = {v:g}" for a, v in kept[nrm].items())
                descr.append(f"{nrm} ({type(eng.mods[nrm]).__name__} keeps {held}: no normalization the census "
                             f"recognises uses it, so it was not set to 0 and a gauge through it is approximate)")
            else:
                descr.append(describe(norm_info(eng.mods[nrm]), eng.mods[nrm], shape, nrm, eps))
        if descr:
            r.reason = "output read by " + ", ".join(descr)
        elif r.blocks:
            r.reason = "not visible (no normalization reads this module's output directly)"
        if r.status == "joint gauge" and r.name.endswith("weight"):
            r.reason = f"alone not a gauge: its bias feeds the same norm, so only scaling both keeps each normalized " \
                       f"set's shape; {r.reason}"


def _listed(names: list[str], most: int = 3) -> str:
    """``a, b, c and 4 more``: every name counted, none cut."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _notes(eng: Engine, cap: Capture) -> list[str]:
    notes = []
    sites = list(eng.watch.sites.values())
    refused = [n for n in eng.own_eps if (i := norm_info(eng.norms[n])).family == "batch" and i.batch_stats]
    refused += [s.label for s in sites if s.info.family == "batch" and s.info.batch_stats]
    if refused:
        notes.append(f"BatchNorm in training mode refuses eps = 0 ({_listed(refused)}): run at eps = 2^-1022, which "
                     f"every batch variance here (>= 2^-968) absorbs bit for bit: exactly eps = 0's arithmetic")
    if sites:
        found = [f"{s.label} (eps {'torch default' if s.eps is None else f'{s.eps:g}'})" for s in sites]
        notes.append(f"eps found in the forward, not in a norm module's eps attribute, and set to 0 on the copy: "
                     f"{_listed(found, 4)}")
    kept = [f"{n or '(model)'}.{a} = {v:g}" for n, attrs in eng.kept_eps().items() for a, v in attrs.items()]
    if kept:
        notes.append(f"eps kept (no normalization the census recognises uses it, so it was not set to 0): "
                     f"{_listed(kept, 4)}; a gauge read through one is approximate, and a 'not a gauge' beside one "
                     f"may be an approximate gauge its eps breaks")
    if eng.compiled:
        notes.append("torch.compile'd: the original module runs eagerly on the copy (the same function); names keep "
                     "'_orig_mod.'")
    if cap.dropouts:
        notes.append(f"dropout off on the copy ({cap.dropouts} module(s)): a mask commutes with scaling, so it changes "
                     f"no gauge; the norms keep the model's mode")
    return notes

