"""AdamW with decay on the matrices only, and the parameter count by component."""

from __future__ import annotations

import torch
from torch import nn

from lm.trainconfig import NO_DECAY_KEYWORDS, TrainConfig


def decays(name: str, p: torch.Tensor) -> bool:
    """Whether a tensor gets weight decay: >= 2 dims (matrices, couplings, embedding tables), unless its name marks
    a norm gain, angle/phase, scale, gate or bias (decay would pull an angle toward 0 or a softplus scale toward
    0.69, a bias with no meaning)."""
    return p.ndim >= 2 and not any(k in name.lower() for k in NO_DECAY_KEYWORDS)


def lr_group(name: str, p: torch.Tensor) -> str:
    """The lr group (:data:`lm.trainconfig.LR_GROUPS`) of parameter ``name``, read off its dotted name (the GRT's
    and the dense model's own names)."""
    path = name.lower().split(".")
    leaf = path[-1]
    by_leaf = {"angles": "angles", "raw_scales": "scales", "coupling": "coupling", "phases": "embedding_phases",
               "magnitudes": "embedding_magnitudes", "gain": "norm_gains"}
    if leaf in by_leaf:
        return by_leaf[leaf]
    if "gate" in leaf:
        return "gates"
    if any("norm" in part for part in path[:-1]):  # RMSNorm / QK-norm weights
        return "norm_gains"
    if any("emb" in part for part in path[:-1]):
        return "embedding"
    return "matrices" if p.ndim >= 2 else "norm_gains" if leaf == "weight" else "matrices"


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with one param group per (lr group, decay); the loop sets ``group["lr"] = lr_t * group["lr_mult"]``.
    With every multiplier 1 the steps are the two-group optimizer's to the bit (AdamW is elementwise)."""
    groups: dict[tuple[str, bool], dict] = {}
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        key = (lr_group(n, p), decays(n, p))
        g = groups.setdefault(key, {"params": [], "names": [], "weight_decay": cfg.wd if key[1] else 0.0,
                                    "lr_group": key[0], "lr_mult": float(cfg.lr_mult.get(key[0], 1.0))})
        g["params"].append(p)
        g["names"].append(n)
    return torch.optim.AdamW(list(groups.values()), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


COMPONENTS = (("norm", ("norm",)), ("gate", ("gate",)), ("embedding", ("emb", "embed")),
              ("attention", ("attn", "q_proj", "k_proj", "v_proj", "o_proj")), ("mixer", ("mixer",)),
              ("ffn", ("mlp", "ffn", "expand", "contract")), ("head", ("head", "unembed")))


def param_breakdown(model: nn.Module) -> dict[str, int]:
    """Parameter counts by component: the first keyword (in :data:`COMPONENTS` order, norms and gates
    first so ``norm_attn`` is a norm) found in the dotted name wins; else ``other``.  Tied tensors count once."""
    out = dict.fromkeys([*(name for name, _ in COMPONENTS), "other"], 0)
    for n, p in model.named_parameters():  # each tensor once, under its first name
        comp = next((name for name, keys in COMPONENTS if any(k in n.lower() for k in keys)), "other")
        out[comp] += p.numel()
    out = {k: v for k, v in out.items() if v}
    out["total"] = sum(out.values())
    return out
