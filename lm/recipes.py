"""Named training recipes: the exact configuration that made each shipped reference model, and a tiny GRT.

``python -m lm.train --recipe reference-grt`` (or ``reference-dense``) trains a shipped model again: the final
phase of ``python -m studies.compare --preset reference`` for one model -- the preset's GRT (d_model 128, 4 heads,
2 blocks, d_ff 512, context 64 bytes, the text's stage counts), or the dense QK-norm model matched to it in
parameters (d_model 136) -- for 3,000,000 training bytes at its best sweep learning rate
(:data:`REFERENCE_BEST_LRS`), with the final phase's intervals (:func:`lm.sizing.phase_train_config`).  Everything
but the learning rates is computed from the preset, so recipe and preset cannot drift apart;
``tests/test_reference_models.py`` checks each recipe against the shipped model card.

``python -m lm.train --recipe tiny-grt`` is a first GRT to watch learn: d_model 64, 4 heads, 2 blocks, context 64,
300 steps of 16 windows at the shipped GRT's learning rate: a few minutes on 2 idle cores.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Best final validation bits per byte of the reference preset's lr sweep (250k tokens per point, bundled corpus,
# runs/compare-reference/sweep): GRT 3e-3 (3.197 bpb; 1e-3: 3.667, 1e-2: 3.320), dense params-matched 3e-3
# (3.081 bpb; 1e-3: 3.149, 1e-2: 3.216). Both interior.
REFERENCE_BEST_LRS = {"grt": 3e-3, "dense_params": 3e-3}
REFERENCE_RECIPE_NAMES = ("reference-grt", "reference-dense")  # reproduce the shipped models (lm.reference)
RECIPE_NAMES = (*REFERENCE_RECIPE_NAMES, "tiny-grt")


@dataclass(frozen=True)
class Recipe:
    name: str
    model: str  # "grt" | "dense"
    model_config: dict[str, Any]
    train_config: dict[str, Any]  # lm.train.TrainConfig as a dict; out_dir is default_out_dir
    description: str

    @property
    def default_out_dir(self) -> str:
        return f"runs/{self.name}"

    def config_json(self) -> dict[str, Any]:
        """The ``--config`` file form: ``{"model", "model_config", "train"}``."""
        return {"model": self.model, "model_config": dict(self.model_config), "train": dict(self.train_config)}


def _reference_recipes() -> dict[str, Recipe]:
    from lm.models import config_to_dict, param_count
    from lm.sizing import DEFAULT_BATCH_SIZE, PRESETS, dense_family, grt_config, param_matched_width, phase_train_config

    preset = PRESETS["reference"]
    gcfg = grt_config(preset.quick, **preset.grt)
    dcfg = dense_family(gcfg, param_matched_width(gcfg, param_count("grt", gcfg)))
    ns = argparse.Namespace(batch_size=DEFAULT_BATCH_SIZE, seed=0, device="cpu", data=None)
    out = {}
    for name, kind, tag, mcfg in (("reference-grt", "grt", "grt", gcfg),
                                  ("reference-dense", "dense", "dense_params", dcfg)):
        tc = phase_train_config(ns, int(mcfg.block_size), Path(f"runs/{name}"), REFERENCE_BEST_LRS[tag],
                                preset.final_tokens, preset.final_evals, preset.final_eval_batches, preset.ckpt_steps)
        out[name] = Recipe(name, kind, config_to_dict(mcfg), tc,
                           f"the {'GRT' if kind == 'grt' else 'parameter-matched dense model'} of python -m "
                           f"studies.compare --preset reference, {preset.final_tokens:,} tokens at lr "
                           f"{REFERENCE_BEST_LRS[tag]:g}")
    return out


def _tiny_grt() -> Recipe:
    from grt_model.config import GRTConfig
    from lm.models import config_to_dict
    from lm.trainconfig import TrainConfig

    d_model = 64
    mcfg = GRTConfig.small(d_model=d_model, n_heads=4, n_blocks=2, d_ff=4 * d_model, block_size=64)
    tc = TrainConfig(lr=REFERENCE_BEST_LRS["grt"], warmup_steps=30, batch_size=16, max_steps=300, eval_interval=100,
                     eval_batches=4, log_interval=10, ckpt_interval=100, device="cpu", out_dir="runs/tiny-grt")
    return Recipe("tiny-grt", "grt", config_to_dict(mcfg), tc.to_dict(),
                  "a tiny GRT (d_model 64, 2 blocks, context 64): 300 steps of 16 windows, a few minutes on 2 cores")


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; an unknown name is a one-line error listing the known ones."""
    if name not in RECIPE_NAMES:
        raise ValueError(f"--recipe must be one of {', '.join(RECIPE_NAMES)}; got {name!r}")
    return _tiny_grt() if name == "tiny-grt" else _reference_recipes()[name]
