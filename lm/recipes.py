"""Named training recipes: the exact configuration that made each shipped reference model, and a tiny GRT.

``--recipe reference-grt`` / ``reference-dense`` is the final run of the experiment grid's reference comparison
for one model: the preset's GRT (d_model 128, 4 heads, 2 blocks, d_ff 512, context 64) or the dense QK-norm model
matched to it in parameters (``d_ff = 4 d``, d_model 136), each at its best sweep lr for 3,000,000 bytes.  The
shipped model cards record what actually ran; ``tests/test_reference_models.py`` checks each recipe against its
card and the grid.  ``--recipe tiny-grt`` is a first GRT to watch learn: d_model 64, 300 steps, a few minutes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Best final validation bits per byte of the reference comparison's lr sweep (250k tokens per point, bundled corpus,
# results/compare-reference/runs.json): GRT 3e-3 (3.197 bpb; 1e-3: 3.667, 1e-2: 3.320), dense params-matched 3e-3
# (3.081 bpb; 1e-3: 3.149, 1e-2: 3.216). Both interior.
REFERENCE_BEST_LRS = {"grt": 3e-3, "dense_params": 3e-3}
REFERENCE_RECIPE_NAMES = ("reference-grt", "reference-dense")  # reproduce the shipped models (lm.reference)
RECIPE_NAMES = (*REFERENCE_RECIPE_NAMES, "tiny-grt")
REFERENCE_GRT = {"d_model": 128, "n_heads": 4, "n_blocks": 2, "d_ff": 512, "block_size": 64}
REFERENCE_TOKENS = 3_000_000


@dataclass(frozen=True)
class Recipe:
    name: str
    model: str  # "grt" | "dense"
    model_config: dict[str, Any]
    train_config: dict[str, Any]  # lm.train.TrainConfig as a dict; out_dir is default_out_dir

    @property
    def default_out_dir(self) -> str:
        return f"runs/{self.name}"

    def config_json(self) -> dict[str, Any]:
        """The ``--config`` file form: ``{"model", "model_config", "train"}``."""
        return {"model": self.model, "model_config": dict(self.model_config), "train": dict(self.train_config)}


def _reference_recipes() -> dict[str, Recipe]:
    from grt_model.config import GRTConfig
    from lm.models import config_to_dict, param_count
    from lm.sizing import dense_family, param_matched_width
    from lm.trainconfig import TrainConfig

    gcfg = GRTConfig.small(**REFERENCE_GRT)
    dcfg = dense_family(gcfg, param_matched_width(gcfg, param_count("grt", gcfg)))
    steps = math.ceil(REFERENCE_TOKENS / (16 * gcfg.block_size))
    out = {}
    for name, kind, tag, mcfg in (("reference-grt", "grt", "grt", gcfg),
                                  ("reference-dense", "dense", "dense_params", dcfg)):
        tc = TrainConfig(lr=REFERENCE_BEST_LRS[tag], batch_size=16, max_tokens=REFERENCE_TOKENS,
                         warmup_steps=min(50, steps // 10), eval_interval=steps // 30, eval_batches=16,
                         log_interval=steps // 100, gauge_interval=steps // 50, ckpt_interval=100, seed=0,
                         device="cpu", threads=1, data="", out_dir=f"runs/{name}").to_dict()
        out[name] = Recipe(name, kind, config_to_dict(mcfg), tc)
    return out


def _tiny_grt() -> Recipe:
    from grt_model.config import GRTConfig
    from lm.models import config_to_dict
    from lm.trainconfig import TrainConfig

    mcfg = GRTConfig.small(d_model=64, n_heads=4, n_blocks=2, d_ff=4 * 64, block_size=64)
    tc = TrainConfig(lr=REFERENCE_BEST_LRS["grt"], warmup_steps=30, batch_size=16, max_steps=300, eval_interval=100,
                     eval_batches=4, log_interval=10, ckpt_interval=100, device="cpu", out_dir="runs/tiny-grt")
    return Recipe("tiny-grt", "grt", config_to_dict(mcfg), tc.to_dict())


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; an unknown name is a one-line error listing the known ones."""
    if name not in RECIPE_NAMES:
        raise ValueError(f"--recipe must be one of {', '.join(RECIPE_NAMES)}; got {name!r}")
    return _tiny_grt() if name == "tiny-grt" else _reference_recipes()[name]
