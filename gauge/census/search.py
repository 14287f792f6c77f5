r"""The census's search: one backward screen for every tensor, real scalings only where the screen leaves a candidate.

**Screen.**  Euler's theorem for the degree-0 homogeneous :math:`c \mapsto L(cW_I)` gives
:math:`\langle\nabla_{W_I}L, W_I\rangle = 0` for a gauge block.  One float64 backward yields per tensor and axis
the per-index sums of :math:`g\odot W`, :math:`g^2` and :math:`W^2`, from which every aligned block of every divisor
size is screened at once: a candidate has :math:`|\langle g_I, W_I\rangle| \le r\,\lVert g_I\rVert\lVert
W_I\rVert` and is read by the batch, :math:`\lVert g_I^\perp\rVert\,\lVert W_I\rVert >` the loss tolerance.  A
nonzero derivative of :math:`c \mapsto L(cW_I)` at 1 proves a block is no gauge, so the screen alone decides the rest.

**Finite law.**  From the finest size up, the candidates not inside a block already found are scaled *together*,
block :math:`j` by :math:`c_{(j+k) \bmod C}` in candidate :math:`k = 0..C-1`.  Scalings of distinct gauge blocks
compose, so a set of gauges passes exactly; a set that fails is bisected down to single blocks, so each verdict is
the block's own unless non-gauge changes cancel at :math:`C` ratio patterns, which generic weights do not do.  A
``joint`` target is a weight with its bias (rows of :math:`[W \mid b]`, LayerNorm after a biased linear layer).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from gauge.census.engine import Engine, release_memory
from gauge.census.records import Block

STATS_CHUNK = 1 << 24  # entries per chunk of the screen's reductions (128 MiB of float64 at most per temporary)
DIRECTION_SIZE = 0.5  # the real non-radial move (used only where the gradient is at round-off), relative to ||W_I||


@dataclass
class AxisStats:
    """Per-index sums along one axis: ``gw`` = sum g*W, ``g2`` = sum g^2, ``w2`` = sum W^2, each ``(n,)``."""

    gw: torch.Tensor
    g2: torch.Tensor
    w2: torch.Tensor

    def __add__(self, o: AxisStats) -> AxisStats:
        return AxisStats(self.gw + o.gw, self.g2 + o.g2, self.w2 + o.w2)


@dataclass
class Target:
    """What one real scaling moves: one tensor, or a weight with its bias (indexed by the weight's rows)."""

    names: tuple[str, ...]
    shape: tuple[int, ...]  # of the (first) tensor: blocks index its axes
    axes: dict[int, AxisStats] = field(default_factory=dict)  # searchable axes
    whole: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (sum gW, sum g^2, sum W^2)

    @property
    def radial(self) -> float:
        gw, g2, w2 = self.whole
        return abs(gw) / math.sqrt(g2 * w2) if g2 > 0 and w2 > 0 else 0.0

    @property
    def perp(self) -> float:
        """``||g^perp|| ||W||``: the first-order loss change of a non-radial move of relative size 1."""
        gw, g2, w2 = self.whole
        return math.sqrt(max(g2 * w2 - gw * gw, 0.0))


def _axis_stats(g: torch.Tensor, w: torch.Tensor) -> dict[int, AxisStats]:
    """Per axis (rows, columns) the per-index sums of g*W, g^2, W^2, over chunks of rows (no tensor-sized
    temporary: a large embedding's gradient is not copied)."""
    if w.dim() == 0:
        return {}
    n0, n1 = int(w.shape[0]), int(w.shape[1]) if w.dim() > 1 else 1
    g3, w3 = g.reshape(n0, n1, -1), w.reshape(n0, n1, -1)
    step = max(1, STATS_CHUNK // max(w3[0].numel(), 1))
    rows = [torch.empty(n0, dtype=w.dtype) for _ in range(3)]
    cols = [torch.zeros(n1, dtype=w.dtype) for _ in range(3)]
    for lo in range(0, n0, step):
        gc, wc = g3[lo:lo + step], w3[lo:lo + step]
        for k, (a, b) in enumerate(((gc, wc), (gc, gc), (wc, wc))):
            prod = a * b
            rows[k][lo:lo + step] = prod.sum(dim=(1, 2))
            cols[k] += prod.sum(dim=(0, 2))
    return {0: AxisStats(*rows), 1: AxisStats(*cols)} if w.dim() > 1 else {0: AxisStats(*rows)}


def _target(name: str, g: torch.Tensor, w: torch.Tensor) -> Target:
    axes = _axis_stats(g, w)
    sums = (axes[0].gw, axes[0].g2, axes[0].w2) if axes else (g * w, g * g, w * w)
    return Target((name,), tuple(w.shape), axes, tuple(float(t.sum()) for t in sums))


def gradient_screen(eng: Engine) -> tuple[float, dict[str, Target]]:
    """One float64 backward at eps = 0: the loss, and per tensor its :class:`Target` with the screen's sums."""
    targets: dict[str, Target] = {}

    def hook(name: str, p: torch.Tensor) -> None:
        targets[name] = _target(name, p.grad.detach(), p.detach())
        p.grad = None  # freed as it goes: only the sums are kept

    handles = [p.register_post_accumulate_grad_hook(partial(hook, n)) for n, p in eng.params.items()]
    try:
        loss = eng.loss(grad=True)
        base = float(loss.detach())
        if loss.requires_grad:
            loss.backward()
    finally:
        for h in handles:
            h.remove()
        del loss
    release_memory()
    for n, p in eng.params.items():  # tensors the loss does not reach: zero gradient
        if n not in targets:
            targets[n] = _target(n, torch.zeros_like(p), p.detach())
    return base, {n: targets[n] for n in eng.params}  # the model's order, not the backward's


def joint_target(w: Target, b: Target) -> Target:
    """A weight with its bias, as rows of ``[W | b]``: the bias's entries join the weight's rows."""
    return Target(w.names + b.names, w.shape, {0: w.axes[0] + b.axes[0]},
                  tuple(x + y for x, y in zip(w.whole, b.whole)))


@dataclass(frozen=True)
class Member:
    """One block to confirm by real scalings: ``[start, stop)`` on ``axis`` of ``tgt`` (``axis`` None: whole)."""

    tgt: Target
    axis: int | None
    start: int
    stop: int


def _factors(members: list[Member], cs: torch.Tensor, lo: int, hi: int) -> dict[tuple, torch.Tensor]:
    """``(names, axis) -> (hi - lo, n)`` factors of candidates ``lo..hi``: member ``j`` by ``cs[(j + k) % C]``."""
    C = len(cs)
    ks = torch.arange(lo, hi).unsqueeze(1)  # (K, 1)
    out: dict[tuple, torch.Tensor] = {}
    by: dict[tuple, list[int]] = {}
    for j, m in enumerate(members):
        by.setdefault((m.tgt.names, m.axis), []).append(j)
    for key, js in by.items():
        m0 = members[js[0]]
        n = 1 if m0.axis is None else m0.tgt.shape[m0.axis]
        f = torch.ones(hi - lo, n, dtype=cs.dtype)
        starts = torch.tensor([members[j].start for j in js])
        sizes = torch.tensor([members[j].stop - members[j].start for j in js])
        pos = torch.repeat_interleave(starts - torch.cumsum(sizes, 0) + sizes, sizes) + torch.arange(int(sizes.sum()))
        c = cs[(torch.tensor(js).unsqueeze(0) + ks) % C]  # (K, J)
        f[:, pos] = torch.repeat_interleave(c, sizes, dim=1)
        out[key] = f
    return out


def _values(eng: Engine, factors: dict[tuple, torch.Tensor], names: list[str]) -> list[torch.Tensor]:
    """Per name: its value times every factor that applies to it (rows and/or columns; a joint bias: rows)."""
    vals = {n: eng.params[n].detach().unsqueeze(0) for n in names}
    for (tnames, axis), f in factors.items():
        for i, n in enumerate(tnames):
            w = eng.params[n]
            ax = 0 if (i > 0 or axis is None) else axis  # the bias of a joint target follows the weight's rows
            view = [f.shape[0]] + [1] * w.dim()
            if axis is not None and w.dim():
                view[1 + ax] = w.shape[ax]
            vals[n] = vals[n] * f.reshape(view)
    return [vals[n] for n in names]


def confirm(eng: Engine, members: list[Member], cs: torch.Tensor, base: float, bound: float,
            tick: Callable[[int], None] | None = None) -> list[tuple[Member, float]]:
    """The members that satisfy the finite law: checked together (``max_k |L - L(W)|`` over the ``C`` candidates
    that scale member ``j`` by ``cs[(j + k) % C]``, built and evaluated chunk by chunk), bisected where the set
    fails."""
    names = list(dict.fromkeys(n for m in members for n in m.tgt.names))
    losses = eng.losses(names, lambda lo, hi: _values(eng, _factors(members, cs, lo, hi), names), len(cs), bound)
    dl = float((losses - base).abs().max())
    if tick is not None:
        tick(len(members))
    if dl <= bound:
        return [(m, dl) for m in members]
    if len(members) == 1:
        return []
    h = len(members) // 2
    return confirm(eng, members[:h], cs, base, bound, tick) + confirm(eng, members[h:], cs, base, bound, tick)


def plan(tgt: Target, rtol: float, bound: float) -> dict[int, list[tuple[int, list[int]]]]:
    """Per axis: ``(size, candidate block indices)`` the screen leaves (blocks that pass the Euler screen and that
    the batch reads), finest first."""
    out: dict[int, list[tuple[int, list[int]]]] = {}
    for axis, st in tgt.axes.items():
        n = int(st.gw.numel())
        for b in (b for b in range(1, n) if n % b == 0):  # every block size below n that tiles it
            rad, g2, w2 = (t.reshape(-1, b).sum(1) for t in (st.gw, st.g2, st.w2))
            perp = (g2 * w2 - rad * rad).clamp(min=0.0).sqrt()
            idx = ((rad.abs() <= rtol * (g2 * w2).sqrt()) & (perp > bound)).nonzero().flatten().tolist()
            if idx:
                out.setdefault(axis, []).append((b, idx))
    return out


def whole_candidate(t: Target, rtol: float, bound: float) -> bool:
    """The whole tensor passes the Euler screen, or its gradient is at round-off (then: unused, or a gauge)."""
    return t.radial <= rtol or t.perp <= bound


def finest_blocks(eng: Engine, tgts: list[Target], plans: dict[tuple, dict], cs: torch.Tensor, base: float,
                  bound: float, tick: Callable[[int], None] | None = None) -> dict[tuple, list[Block]]:
    """Gauge blocks of every target, in rounds: each round takes, per target and axis, the finest screened size
    with blocks not inside ones already found, and confirms all of them together (:func:`confirm`)."""
    queues = {(t.names, a): list(q) for t in tgts for a, q in plans[t.names].items()}
    covered = {(t.names, a): torch.zeros(t.shape[a], dtype=torch.bool) for t in tgts for a in plans[t.names]}
    by_names = {t.names: t for t in tgts}
    found: dict[tuple, list[Block]] = {t.names: [] for t in tgts}
    while True:
        members = []
        for (names, axis), q in queues.items():
            while q:
                b, idx = q.pop(0)
                cov = covered[(names, axis)].reshape(-1, b).any(1)
                keep = [i for i in idx if not bool(cov[i])]
                if keep:
                    members += [Member(by_names[names], axis, i * b, (i + 1) * b) for i in keep]
                    break
        if not members:
            return found
        for m, dl in confirm(eng, members, cs, base, bound, tick):
            st = m.tgt.axes[m.axis]
            sl = slice(m.start, m.stop)
            g2, w2, gw = float(st.g2[sl].sum()), float(st.w2[sl].sum()), float(st.gw[sl].sum())
            found[m.tgt.names].append(Block(m.axis, m.start, m.stop, dl, math.sqrt(max(g2 * w2 - gw * gw, 0.0))))
            covered[(m.tgt.names, m.axis)][sl] = True


def nonradial_change(eng: Engine, tgt: Target, base: float, bound: float) -> float:
    """``|L(W + delta) - L(W)|`` for a move orthogonal to ``W`` of size DIRECTION_SIZE * ||W|| (whole target)."""
    ws = [eng.params[n].detach() for n in tgt.names]
    rs = [torch.randn(w.shape, generator=eng.gen, dtype=w.dtype) for w in ws]
    wn2 = sum(float((w * w).sum()) for w in ws)
    proj = sum(float((r * w).sum()) for r, w in zip(rs, ws)) / wn2
    rs = [r - w * proj for r, w in zip(rs, ws)]
    rn = math.sqrt(sum(float((r * r).sum()) for r in rs))
    moved = [(w + r * (DIRECTION_SIZE * math.sqrt(wn2) / rn)).unsqueeze(0) for w, r in zip(ws, rs)]
    return abs(float(eng.losses(tgt.names, lambda lo, hi: moved, 1, bound)[0]) - base)
