"""The GRT's structural claims (:data:`CLAIMS`, run by ``python -m grt_model --claims`` and the report) against
``../shared/seeds/001_cfb910613b442095.txt``: one representative instance of each at the reference widths where
affordable (``tests/test_grt_*.py`` draw many), in float64 (``grt.model_trains`` in float32, where the model
trains), each check seeded from the run's seed.
"""

from grt_model.claims.geometry import (
    claim_det_positive,
    claim_embedding_rebuild,
    claim_jacobian,
    claim_length_preservation,
    claim_mixer_crosses_heads,
    claim_mixing,
    claim_pearlnorm_invariance,
    claim_radial_gelu_angle,
    claim_residual_det_sign,
)
from grt_model.claims.model import (
    claim_butterfly_wiring,
    claim_fast_equals_reference,
    claim_model_trains,
    claim_param_accounting,
    claim_stage_counts,
)
from rmsgauge import ClaimGroup

CLAIMS = ClaimGroup(reseed=True, checks={
    "grt.det_positive": claim_det_positive,
    "grt.length_preservation": claim_length_preservation,
    "grt.jacobian": claim_jacobian,
    "grt.residual_det_sign": claim_residual_det_sign,
    "grt.mixing": claim_mixing,
    "grt.embedding_rebuild": claim_embedding_rebuild,
    "grt.pearlnorm_invariance": claim_pearlnorm_invariance,
    "grt.radial_gelu_angle": claim_radial_gelu_angle,
    "grt.mixer_crosses_heads": claim_mixer_crosses_heads,
    "grt.model_trains": claim_model_trains,
    "grt.stage_counts": claim_stage_counts,
    "grt.param_accounting": claim_param_accounting,
    "grt.butterfly_wiring": claim_butterfly_wiring,
    "grt.fast_equals_reference": claim_fast_equals_reference,
})

__all__ = ["CLAIMS"]
