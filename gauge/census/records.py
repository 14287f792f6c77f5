"""The census's records (what :func:`gauge.census.census` returns) and their text table (:func:`format_census`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rmsgauge import json_safe

STATUSES = ("gauge", "partial gauge", "joint gauge", "not a gauge", "unused")
EPS_FIELDS = ("loss_change", "loss_first_order", "output_change", "output_law", "law_agreement")  # of EpsReport


@dataclass
class Block:
    """One gauge block: ``axis`` None is the whole tensor; else indices ``[start, stop)`` on ``axis``."""

    axis: int | None
    start: int
    stop: int
    loss_change: float  # max |L(scaled) - L(W)| at eps = 0 over the real scalings that confirmed the block
    direction_change: float  # the batch reads the block: |g_I^perp| ||W_I|| (first order) or a measured move
    direction_measured: bool = False  # True: direction_change is |L(W + delta_I) - L(W)| for a real non-radial move


@dataclass
class EpsReport:
    """The gauge at the model's own eps: measured deviations beside the exact eps law."""

    eps: float | None  # the reading norm's own eps (None where no norm reads the tensor directly)
    loss_change: float  # max over the extreme scales of |L(c W_I) - L(W)| at the model's eps (see loss_first_order)
    output_change: float | None  # max |Norm(x(cW)) - Norm(xW)| measured at the reading norm
    output_law: float | None  # the same from gauge.laws: max over the rows it reads of |r(c) - 1| |y - beta|
    law_agreement: float | None  # |measured - law| / law (None where no law applies)
    break_scales: tuple[float, float] | None  # (c_lo, c_hi): deviation above float64 round-off outside
    loss_first_order: bool = False  # True: |<dL/dy, y_c - y>| at the reading norm; False: the loss itself measured


@dataclass
class TensorCensus:
    name: str
    shape: tuple[int, ...]
    status: str  # one of STATUSES
    loss_change: float | None  # max |dL| of the real scalings that decided it; None: the Euler screen decided
    radial: float  # |<g, W>| / (||g|| ||W||) at eps = 0 (Euler: 0 for a gauge)
    blocks: list[Block] = field(default_factory=list)  # the finest gauge partition found
    partition: str = ""  # human summary of blocks, e.g. "rows: 4 blocks of 16"
    reason: str = ""  # the normalization that reads this tensor's output, what it normalizes over
    eps: EpsReport | None = None
    joint: str = ""  # "with fc.bias: whole tensor": a gauge only together with the named tensor
    joint_blocks: list[Block] = field(default_factory=list)  # blocks of the joint (weight rows + bias entries)


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
    mode: str = ""  # "train", "eval" or "mixed": the module flags the census ran the copy with
    notes: list[str] = field(default_factory=list)  # how the copy differs from the model (dropout, eps, compile)
    seconds: float = 0.0
    eps_kept: dict[str, float] = field(default_factory=dict)  # "module.attr" -> an eps not set to 0 (see notes)

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

    def to_records(self) -> list[dict[str, Any]]:
        """One flat dict per tensor (the table's columns, every number whole; ``own_eps_*``: the report at the
        model's eps, None where there is none)."""
        out = []
        for t in self.tensors:
            e = t.eps
            lo, hi = e.break_scales if e is not None and e.break_scales is not None else (None, None)
            out.append({"name": t.name, "layer": layer_of(t.name), "shape": tuple(t.shape), "status": t.status,
                        "partition": t.partition or (t.joint.split(": ", 1)[-1] if t.joint else ""),
                        "n_blocks": len(t.blocks), "loss_change": t.loss_change, "radial": t.radial, "joint": t.joint,
                        "reason": t.reason, "own_eps": None if e is None else e.eps,
                        **{f"own_eps_{k}": None if e is None else getattr(e, k) for k in EPS_FIELDS},
                        "own_eps_break_lo": lo, "own_eps_break_hi": hi})
        return out

    def to_dataframe(self) -> Any:
        """:meth:`to_records` as a ``pandas.DataFrame`` (pandas is optional: only this method needs it)."""
        try:
            import pandas
        except ImportError:
            raise ImportError("CensusResult.to_dataframe needs pandas (pip install pandas); to_records() gives the "
                              "same rows as a list of dicts") from None
        return pandas.DataFrame.from_records(self.to_records())

    def __str__(self) -> str:
        """The command line's table (:func:`format_census`): ``print(census(model, ...))``."""
        return format_census(self)


def describe_blocks(blocks: list[Block], shape: Sequence[int]) -> str:
    """``whole tensor`` or ``rows: 4 blocks of 16; columns: ...`` (with the cover where not all)."""
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


def layer_of(name: str, top: str = "(top)") -> str:
    m = re.match(r"^(.*?\.\d+)\.", name)
    return m.group(1) if m else top


def format_census(res: CensusResult, *, all_tensors: bool = False) -> str:
    """The census as a text table by layer: every tensor with a verdict other than "not a gauge" (``all_tensors``:
    every tensor), with the normalization behind it ("why") and a summary line."""
    lines = [f"gauge census of {res.model} ({res.mode} mode; float64; scales c = "
             f"{', '.join(f'{c:g}' for c in res.scales)}; |dL| tolerance {res.tolerance:.2e} from rmsgauge.tolerance("
             f"size={res.tolerance_terms['size']}, depth={res.tolerance_terms['depth']}); exact gauges at eps = 0"
             f"{' except through the eps kept below' if res.eps_kept else ''})"]
    lines += [f"  note: {n}" for n in res.notes]
    if any(t.eps is not None and t.eps.loss_first_order for t in res.tensors):
        lines.append("  note: ~ max|dL| own: first order in the measured output change of the reading norm "
                     "(|<dL/dy, y_c - y>|, one backward); measure_eps_loss=True / --eps-loss-measured measures it")
    if res.randomized:
        lines.append(f"  all-zero tensors moved to a random point first: {', '.join(res.randomized)}")
    shown = [t for t in res.tensors if all_tensors or t.status != "not a gauge" or t.reason]
    parts = {t.name: t.partition or (t.joint.split(": ", 1)[-1] if t.joint else "") for t in shown}
    # every cell whole: a column widens to its longest entry (a cut "covering 16 of 2" would misstate a number)
    wn = max([44, *(len(t.name) for t in shown)])
    ws = max([14, *(len("x".join(map(str, t.shape))) for t in shown)])
    wp = max([30, *(len(p) for p in parts.values())])
    hdr = f"  {'tensor':<{wn}} {'shape':<{ws}} {'verdict':<13} {'partition':<{wp}} {'max|dL| eps=0':>13} " \
          f"{'own eps':>8} {'max|dL| own':>11} {'out dev / eps law':>19}"
    lines += [hdr, "  " + "-" * (len(hdr) - 2)]
    layer = None
    for t in shown:
        lay = layer_of(t.name)
        if lay != layer:
            lines.append(f"  [{lay}]")
            layer = lay
        e = t.eps
        own = "-" if e is None or e.eps is None else f"{e.eps:.1e}"
        dl_own = "-" if e is None else f"{'~' if e.loss_first_order else ''}{e.loss_change:.2e}"
        law = "-" if e is None or e.output_law is None else f"{e.output_change:.2e}/{e.output_law:.2e}"
        dl = "screen" if t.loss_change is None else f"{t.loss_change:.2e}"
        lines.append(f"  {t.name:<{wn}} {'x'.join(map(str, t.shape)):<{ws}} {t.status:<13} {parts[t.name]:<{wp}} "
                     f"{dl:>13} {own:>8} {dl_own:>11} {law:>19}")
        if t.joint:
            lines.append(f"      joint: {t.joint}")
        if t.reason:
            lines.append(f"      why: {t.reason}")
    if not any(t.status != "not a gauge" for t in res.tensors):
        lines.append("  (no gauge tensors or blocks: every tensor changes the loss when scaled)")
    n = {s: sum(t.status == s for t in res.tensors) for s in STATUSES}
    lines.append(f"  {len(res.tensors)} tensors: {n['gauge']} gauge, {n['partial gauge']} partial gauge, "
                 f"{n['joint gauge']} joint gauge, {n['unused']} unused by the batch, {n['not a gauge']} not a gauge; "
                 f"vmap {'on' if res.vectorized else 'off'}; {res.seconds:.1f} s")
    if n["unused"] == len(res.tensors):
        lines.append("  every tensor is unused: the loss does not read any parameter on this batch")
    return "\n".join(lines)
