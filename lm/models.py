"""The model kinds ``lm`` trains (``"dense"``: :class:`lm.dense.DenseTransformer`, ``"grt"``: ``grt_model``'s GRT)
and their configs as plain dicts (checkpoints, run configs, experiment records hash them: :func:`config_to_dict`
keeps the dataclass's fields and their order)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from grt_model.config import GRTConfig
from grt_model.model import GRT
from lm.dense import DenseConfig, DenseTransformer
from rmsgauge import reject_unknown_keys

MODEL_KINDS = ("dense", "grt")
DEPTH_KEY = {"dense": "n_layers", "grt": "n_blocks"}  # the config field that counts a kind's blocks
_CLASSES = {"dense": (DenseConfig, DenseTransformer), "grt": (GRTConfig, GRT)}


def model_classes(kind: str) -> tuple[type, type]:
    """``(ConfigClass, ModelClass)`` of a model kind."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"model kind must be one of {', '.join(MODEL_KINDS)}; got {kind!r}")
    return _CLASSES[kind]


def default_model_config(kind: str):
    """The CPU-sized preset of a model kind (what ``python -m lm.train --model KIND`` trains)."""
    if kind == "dense":  # about 0.8M parameters: a few thousand tokens/s on one CPU core
        return DenseConfig(d_model=128, n_heads=4, n_layers=4, d_ff=512, block_size=128)
    return model_classes(kind)[0].small()


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return asdict(cfg)


def config_from_dict(kind: str, d: dict[str, Any]):
    """Rebuild a model config with ``Config(**d)``; unknown keys fail naming the allowed ones."""
    cfg_cls, _ = model_classes(kind)
    reject_unknown_keys(f"model config ({cfg_cls.__name__})", d, list(cfg_cls.__dataclass_fields__))
    return cfg_cls(**d)


def build_model(kind: str, cfg) -> nn.Module:
    return model_classes(kind)[1](cfg)


def kind_of(model: nn.Module) -> str:
    for kind, (cfg_cls, _) in _CLASSES.items():
        if isinstance(getattr(model, "config", None), cfg_cls):
            return kind
    raise TypeError(f"not a project model (GRT or DenseTransformer): {type(model).__name__}")


def param_count(kind: str, cfg) -> int:
    """Parameters of the model a config builds (on the meta device: nothing allocated; tied tensors once)."""
    with torch.device("meta"):
        model = build_model(kind, cfg)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
