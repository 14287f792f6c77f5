r"""Parameter accounting: GRT vs a dense transformer of the same widths, per component.

Closed forms (per block unless noted; :math:`P_h = d_{head}/2`, :math:`P = d/2`,
:math:`P_f = d_{ff}/2`, :math:`S_\cdot` stage counts, :math:`c_\cdot\in\{0,1\}` coupling on/off):

.. math::
   \text{one stage of width } w:\quad & \underbrace{w/2}_{\text{angles}} + \underbrace{w}_{\text{scales}}
        + c\,\underbrace{4(w/2)^2 = w^2}_{\text{coupling } W\in\mathbb R^{4P\times P}}\\
   Q\ (\text{likewise } K, V, O):\quad & H\,S_{qkvo}\,(P_h + 2P_h + 4c\,P_h^2)
        \quad\text{vs dense } d^2\\
   \text{mixer}:\quad & S_{mix}(P + 2P + 4cP^2) \quad\text{vs dense } 0
        \ (\text{a dense } W_O \text{ already mixes heads})\\
   \text{FFN expand / contract}:\quad & S_{ffn}(P_f + 2P_f + 4cP_f^2) \quad\text{vs dense } d\,d_{ff}\\
   \text{norms}:\quad & 3d \ (\text{three PearlNorm gains}) \quad\text{vs dense } 2d\\
   \text{gates}:\quad & 3 \quad\text{vs dense } 0\\
   \text{embedding (once)}:\quad & V(P+1) \quad\text{vs dense } Vd, \qquad \text{ratio } (P+1)/d\\
   \text{final norm (once)}:\quad & d;\qquad \text{head (once)}: 0 \text{ tied, } Vd \text{ untied (both models)}.

A coupled stage of width :math:`w` stores :math:`w^2` coupling numbers, one dense matrix of its own width: Q/K/V/O
cost 2.81x a dense projection at the reference config, and the mixer is a whole :math:`d\times d` matrix a dense
transformer does not have; the savings are the embedding (about half) and the uncoupled FFN.

The dense counterpart is ``lm.dense.DenseTransformer`` (one layer up: never imported here) with
``qk_norm=False`` (no biases, pre-norm RMSNorm gains, same head tying);
:func:`dense_param_counts` is checked against that module's parameters (in the tests), and
:func:`grt_param_counts` against :func:`module_param_counts` of a built :class:`GRT`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import torch

from grt_model.config import GRTConfig

COMPONENTS = ("embedding", "q", "k", "v", "o", "mixer", "ffn_expand", "ffn_contract", "norms", "gates", "head")
KINDS = ("angles", "scales", "coupling", "other")


def per_stage_cost(width: int, coupling: bool) -> dict[str, int]:
    """One stage of one head at ``width``: angles, scales, coupling (e.g. 32 / 64 / 4096 at width 64)."""
    P = width // 2
    return {"angles": P, "scales": 2 * P, "coupling": 4 * P * P if coupling else 0, "other": 0}


def _times(d: dict[str, int], k: int) -> dict[str, int]:
    return {key: v * k for key, v in d.items()}


def grt_param_counts(cfg: GRTConfig) -> dict[str, dict[str, int]]:
    """Closed-form GRT counts: ``{component: {kind: count}}`` over the whole model (all blocks)."""
    nb, H = cfg.n_blocks, cfg.n_heads
    zero = dict.fromkeys(KINDS, 0)
    proj = _times(per_stage_cost(cfg.d_head, cfg.qkvo_coupling), H * cfg.qkvo_stages * nb)
    return {
        "embedding": {**zero, "angles": cfg.vocab_size * cfg.pairs, "other": cfg.vocab_size},  # phases + r
        "q": proj, "k": dict(proj), "v": dict(proj), "o": dict(proj),
        "mixer": _times(per_stage_cost(cfg.d_model, cfg.mixer_coupling), cfg.mixer_stages * nb),
        "ffn_expand": _times(per_stage_cost(cfg.d_ff, cfg.ffn_coupling), cfg.ffn_stages * nb),
        "ffn_contract": _times(per_stage_cost(cfg.d_ff, cfg.ffn_coupling), cfg.ffn_stages * nb),
        "norms": {**zero, "other": 3 * cfg.d_model * nb + cfg.d_model},
        "gates": {**zero, "other": 3 * nb},
        "head": {**zero, "other": 0 if cfg.tie_head else cfg.vocab_size * cfg.d_model},
    }


def dense_param_counts(cfg: GRTConfig) -> dict[str, int]:
    """Closed-form counts of the dense pre-norm transformer of the same widths (no QK-norm, no biases)."""
    d, nb = cfg.d_model, cfg.n_blocks
    return {"embedding": cfg.vocab_size * d, **dict.fromkeys(("q", "k", "v", "o"), d * d * nb), "mixer": 0,
            "ffn_expand": d * cfg.d_ff * nb, "ffn_contract": cfg.d_ff * d * nb, "norms": 2 * d * nb + d, "gates": 0,
            "head": 0 if cfg.tie_head else cfg.vocab_size * d}


def module_param_counts(model: torch.nn.Module) -> dict[str, dict[str, int]]:
    """Count a built :class:`GRT`'s parameters per component and kind, from ``named_parameters``.

    The head-stacked Q/K/V cascade (heads ``3H``, head ``jH + h`` = projection ``j``)
    is split by head slice so Q, K and V are reported separately.
    """
    H = model.config.n_heads
    out = {c: dict.fromkeys(KINDS, 0) for c in COMPONENTS}
    kind_of = {"angles": "angles", "phases": "angles", "raw_scales": "scales", "coupling": "coupling"}
    component_of = {".attn.o.": "o", ".mixer.": "mixer", ".ffn.expand.": "ffn_expand", ".ffn.contract.": "ffn_contract",
                    "embed.": "embedding", "head.": "head"}  # by a part of the name; else by its leaf
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        kind = kind_of.get(leaf, "other")
        if ".attn.qkv." in name:
            for j, comp in enumerate("qkv"):
                out[comp][kind] += p[j * H : (j + 1) * H].numel()
            continue
        comp = next((c for key, c in component_of.items() if key in name),
                    {"gain": "norms", "gate_logits": "gates"}.get(leaf))
        if comp is None:
            raise KeyError(f"GRT parameter {name!r} has no accounting component")
        out[comp][kind] += p.numel()
    return out


def stage_counts_from_model(model: torch.nn.Module) -> dict[str, int]:
    """Stage counts read off the built modules (cf. :meth:`GRTConfig.stage_counts`)."""
    per = [{**dict.fromkeys("qkv", b.attn.qkv.n_stages), "o": b.attn.o.n_stages, "mixer": b.mixer.cascade.n_stages,
            "ffn_expand": b.ffn.expand.n_stages, "ffn_contract": b.ffn.contract.n_stages} for b in model.blocks]
    return {**per[0], "per_block": sum(per[0].values()), "n_blocks": len(per),
            "total": sum(sum(p.values()) for p in per)}


def embedding_ratio(cfg: GRTConfig) -> Fraction:
    """Exact GRT/dense embedding ratio (P + 1)/d (129/256 at d = 256)."""
    return Fraction(cfg.pairs + 1, cfg.d_model)


@dataclass
class ParamRow:
    component: str
    grt: int
    dense: int
    angles: int
    scales: int
    coupling: int
    other: int

    @property
    def ratio(self) -> float | None:
        return None if self.dense == 0 else self.grt / self.dense

    def to_json(self) -> dict:
        return {"component": self.component, "grt": self.grt, "dense": self.dense, "ratio": self.ratio,
                "angles": self.angles, "scales": self.scales, "coupling": self.coupling, "other": self.other}


def param_table(cfg: GRTConfig, grt_counts: dict[str, dict[str, int]] | None = None) -> list[ParamRow]:
    """Rows per component plus ``total``; ``grt_counts`` defaults to the closed form."""
    g = grt_counts if grt_counts is not None else grt_param_counts(cfg)
    dn = dense_param_counts(cfg)
    rows = [ParamRow(c, sum(g[c].values()), dn[c], *(g[c][k] for k in KINDS)) for c in COMPONENTS]
    rows.append(ParamRow("total", sum(r.grt for r in rows), sum(r.dense for r in rows),
                         *(sum(getattr(r, k) for r in rows) for k in KINDS)))
    return rows


def format_table(rows: list[ParamRow]) -> str:
    head = (f"{'component':<13}{'GRT':>12}{'dense':>12}{'GRT/dense':>10}  "
            f"{'angles':>10}{'scales':>10}{'coupling':>11}{'other':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = "   n/a" if r.ratio is None else f"{r.ratio:.3f}"
        flag = "  <- GRT costs more" if r.ratio is not None and r.ratio > 1 else (
            "  <- GRT only" if r.dense == 0 and r.grt > 0 else "")
        lines.append(f"{r.component:<13}{r.grt:>12,}{r.dense:>12,}{ratio:>10}  "
                     f"{r.angles:>10,}{r.scales:>10,}{r.coupling:>11,}{r.other:>10,}{flag}")
    return "\n".join(lines)

