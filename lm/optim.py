"""AdamW with decay on the matrices only, and the parameter count by component."""

from __future__ import annotations

import torch
from torch import nn

from lm.trainconfig import NO_DECAY_KEYWORDS, TrainConfig

# ---------------------------------------------------------------------------------------------
# Optimizer, parameter accounting
# ---------------------------------------------------------------------------------------------


def decay_split(model: nn.Module) -> tuple[list[str], list[str]]:
    """Names that get weight decay: tensors with >= 2 dims (matrices, couplings, embedding tables),
    except those whose name marks a norm gain, angle/phase, scale, gate or bias (decay would pull an
    angle toward 0 or a softplus scale toward 0.69, a bias with no meaning)."""
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        low = n.lower()
        (decay if p.ndim >= 2 and not any(k in low for k in NO_DECAY_KEYWORDS) else no_decay).append(n)
    return decay, no_decay


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    decay, no_decay = decay_split(model)
    params = dict(model.named_parameters())
    groups = [{"params": [params[n] for n in decay], "weight_decay": cfg.wd, "names": decay},
              {"params": [params[n] for n in no_decay], "weight_decay": 0.0, "names": no_decay}]
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


COMPONENTS = (("norm", ("norm",)), ("gate", ("gate",)), ("embedding", ("emb", "embed")),
              ("attention", ("attn", "q_proj", "k_proj", "v_proj", "o_proj")), ("mixer", ("mixer",)),
              ("ffn", ("mlp", "ffn", "expand", "contract")), ("head", ("head", "unembed")))


def param_breakdown(model: nn.Module) -> dict[str, int]:
    """Parameter counts by component: the first keyword (in :data:`COMPONENTS` order, norms and gates
    first so ``norm_attn`` is a norm) found in the dotted name wins; else ``other``.  Tied tensors count once."""
    out = {name: 0 for name, _ in COMPONENTS}
    out["other"] = 0
    seen = set()
    for n, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        low = n.lower()
        comp = next((name for name, keys in COMPONENTS if any(k in low for k in keys)), "other")
        out[comp] += p.numel()
    out = {k: v for k, v in out.items() if v}
    out["total"] = sum(out.values())
    return out



