"""Synthetic claim records and proof results for the report tests (``test_figures``, ``test_report_browser``):
every source status, a failing verdict, and HTML-special characters in the text; and a tiny untrained GRT
checkpoint for the trained-model figures."""

from __future__ import annotations

from pathlib import Path

from proofs.core import ProofResult
from rmsgauge import Claim, ClaimGroup


def synthetic_claims() -> list[Claim]:
    """Claims covering every source status, a failing verdict and HTML-special characters."""
    return [
        Claim(id="gauge.forward_invariance", statement="RMSNorm(x (cW)) = RMSNorm(x W), c > 0",
              stated=3e-15, measured=2.1e-16, tolerance=1e-13, holds=True),
        Claim(id="dynamics.angular_rate_scaling", statement="the rate grows like 1 / ||W|| <wording>",
              stated=[0.0025, 0.01, 0.04],
              measured={"exponent": -2.0}, tolerance=0.05, holds=True, source_status="wrong",
              exact_law="angle ∝ ||W||^-2 & not ^-1"),
        Claim(id="dynamics.trajectory_tracking", statement="tracks to a relative 4e-4",
              stated=4e-4, measured=3.9e-4, tolerance=1e-3, holds=True,
              source_status="approximate", exact_law="(1-wd)^2 ||W||^2 + lr^2 ||g||^2"),
        Claim(id="grt.mixing", statement="a local pair reaches across the whole vector within a few stages",
              stated=None, measured=6, tolerance=None, holds=False,
              dtype="n/a", source_status="unstated"),
    ]


def synthetic_proofs() -> list[ProofResult]:
    return [ProofResult("gauge.forward_invariance", "RMSNorm(c z) = RMSNorm(z), c > 0", True, "0", "symbolic n"),
            ProofResult("grt.det_positive", "det = s0 s1 > 0", True, "0", "2x2")]


CLAIMS = ClaimGroup(checks={"samples.synthetic": synthetic_claims})  # a claim source for figures.gather


def write_untrained_checkpoint(path, seed: int = 0) -> Path:
    """A checkpoint of a freshly initialized tiny GRT (no training): the trained-model figures drawn fast."""
    from grt_model.config import GRTConfig
    from grt_model.model import GRT
    from lm.checkpoint import save_checkpoint
    from rmsgauge import seed_everything

    cfg = GRTConfig.small(d_model=32, n_heads=2, n_blocks=1, d_ff=64, block_size=64)
    seed_everything(seed)
    return save_checkpoint(path, model_kind="grt", model=GRT(cfg), optimizer=None,
                           train_config={"batch_size": 0, "lr": 0.0, "wd": 0.0, "seed": seed, "dtype": "float32"},
                           step=0, tokens_seen=0)
