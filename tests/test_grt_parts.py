"""The GRT's parts: phase embedding, PearlNorm, RadialGELU, the config, stage counts and parameter accounting.

Claims ``grt.embedding_rebuild``, ``grt.pearlnorm_invariance``, ``grt.radial_gelu_angle``, ``grt.stage_counts``,
``grt.param_accounting`` and the parts of ``grt.jacobian`` (gradcheck of PearlNorm, RadialGELU, embedding).
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from grt_model import GRT, GRTConfig, PearlNorm, PhaseEmbedding, RadialGELU, from_polar, to_polar
from grt_model.accounting import (
    COMPONENTS,
    dense_param_counts,
    embedding_ratio,
    format_table,
    grt_param_counts,
    module_param_counts,
    param_table,
    per_stage_cost,
    stage_counts_from_model,
)
from grt_model.claims.tools import flat_jacobian, gradcheck
from grt_model.pearlnorm import mean_pair_radius, pearl_norm, pearl_norm_jacobian_norm
from grt_model.radial_gelu import radial_gelu
from lm.dense import DenseConfig, DenseTransformer
from rmsgauge import assert_close, tolerance

F64 = torch.float64
seeds = st.integers(0, 2**16)
finite = {"allow_nan": False, "allow_infinity": False}
CLEARLY_NONZERO = 1e3  # a structural nonzero must exceed the round-off tolerance by three orders of magnitude


def dense_config_for(cfg):
    """The DenseConfig of the GRT's widths: what grt_model.accounting.dense_param_counts describes (the dense
    model lives one layer up, in lm: the comparison is a test, not a grt_model import)."""
    return DenseConfig(vocab_size=cfg.vocab_size, block_size=cfg.block_size, d_model=cfg.d_model,
                       n_heads=cfg.n_heads, n_layers=cfg.n_blocks, d_ff=cfg.d_ff, qk_norm=False, rope=cfg.rope,
                       tie_embeddings=cfg.tie_head)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _wrapped_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.atan2(torch.sin(a - b), torch.cos(a - b))


# -------------------------------------------------------------------------------- grt.embedding_rebuild


@given(st.integers(1, 40), st.integers(1, 16), seeds)
def test_embedding_rebuild(V, P, seed):
    g = _gen(seed)
    emb = PhaseEmbedding(V, P, dtype=F64)
    with torch.no_grad():
        emb.phases.copy_((torch.rand(V, P, generator=g, dtype=F64) * 2 - 1) * math.pi * 0.999)
        emb.magnitudes.copy_(10 ** (torch.rand(V, generator=g, dtype=F64) * 4 - 2))  # 0.01 .. 100
    idx = torch.randint(0, V, (3, 5), generator=g)
    x = emb(idx)  # (3, 5, 2P)
    assert x.shape == (3, 5, 2 * P)
    r, phi = to_polar(x)
    assert_close(r, emb.magnitudes[idx].unsqueeze(-1).expand_as(r), dtype=F64, size=2, depth=2,
                 what="radius = stored magnitude")
    assert_close(_wrapped_diff(phi, emb.phases[idx]), torch.zeros_like(phi), dtype=F64, size=2, depth=2,
                 scale=math.pi, what="angle = stored phase")
    assert torch.equal(emb.cartesian_table()[idx], x)
    # never stored: the module's state holds exactly the phases and the magnitudes
    assert set(emb.state_dict()) == {"phases", "magnitudes"}
    n = sum(p.numel() for p in emb.parameters())
    assert n == V * (P + 1)
    if P & (P - 1) == 0:  # a valid GRT width: the accounting's closed form says the same
        cfg = GRTConfig(vocab_size=V, d_model=2 * P, n_heads=1, d_ff=2 * P)
        assert sum(grt_param_counts(cfg)["embedding"].values()) == n


def test_embedding_init_is_the_ring():
    emb = PhaseEmbedding(50, 128)
    with torch.no_grad():
        r, phi = to_polar(emb.cartesian_table())  # (V, P)
    assert_close(r, torch.full_like(r, 0.79), dtype=torch.float32, size=2, depth=2, what="ring radius 0.79")
    assert float(phi.min()) < -3 and float(phi.max()) > 3  # phases spread over the circle


def test_embedding_gradcheck():
    r = torch.rand(5, 1, dtype=F64, requires_grad=True)
    th = (torch.rand(5, 4, dtype=F64) * 6 - 3).requires_grad_()
    assert gradcheck(from_polar, (r, th), size=8, depth=1)
    emb = PhaseEmbedding(7, 4, dtype=F64)
    idx = torch.tensor([[0, 3, 3, 6]])

    def fn(ph, mg):
        return torch.func.functional_call(emb, {"phases": ph, "magnitudes": mg}, (idx,))

    assert gradcheck(fn, (emb.phases.detach().clone().requires_grad_(), emb.magnitudes.detach().clone()
                          .requires_grad_()), size=8, depth=1)


# ----------------------------------------------------------------------------- grt.pearlnorm_invariance


@given(st.sampled_from([2, 4, 8, 64, 256]), seeds, st.floats(-6, 6, **finite), st.floats(-3, 3, **finite))
def test_pearlnorm_invariance(d, seed, log10_c, log10_x):
    g = _gen(seed)
    x = torch.randn(3, d, generator=g, dtype=F64) * 10**log10_x
    norm = PearlNorm(d, dtype=F64)
    with torch.no_grad():
        norm.gain.copy_(torch.rand(d, generator=g, dtype=F64) * 2)
    y = norm(x)
    assert_close(norm(10**log10_c * x), y, dtype=F64, size=d, depth=3, what="PearlNorm(c x) = PearlNorm(x)")
    # the factor is the mean pair radius
    r = torch.linalg.vector_norm(x.view(3, d // 2, 2), dim=-1)
    assert_close(y, x / r.mean(dim=-1, keepdim=True) * norm.gain, dtype=F64, size=d, depth=3)


@given(st.sampled_from([4, 16, 64]), seeds)
def test_pearlnorm_invariance_is_a_gauge(d, seed):
    """Euler: J(x) x = 0; a weight W feeding PearlNorm has <grad_W L, W> = 0 and L(cW) = L(W) (the scale gauge of
    the gauge package, with PearlNorm in RMSNorm's place); ||J||_2 = rho/mu^2 in closed form."""
    g = _gen(seed)
    x = torch.randn(d, generator=g, dtype=F64)
    gain = torch.rand(d, generator=g, dtype=F64) + 0.5
    J = flat_jacobian(lambda t: pearl_norm(t, 0.0, gain), x)
    tol = tolerance(F64, size=d, depth=3, scale=float(torch.linalg.matrix_norm(J, 2) * x.norm()))
    assert float((J @ x).abs().max()) <= tol.atol
    J1 = flat_jacobian(pearl_norm, x)
    assert_close(torch.linalg.matrix_norm(J1, 2), pearl_norm_jacobian_norm(x), dtype=F64, size=d, depth=3,
                 what="||J||_2 = rho / mu^2")
    W = torch.randn(d, 8, generator=g, dtype=F64, requires_grad=True)
    u, tgt = torch.randn(5, 8, generator=g, dtype=F64), torch.randn(5, d, generator=g, dtype=F64)

    def loss(w):
        return ((pearl_norm(u @ w.T, 0.0, gain) - tgt) ** 2).mean()

    (gW,) = torch.autograd.grad(loss(W), W)
    Wd = W.detach()
    radial = float((gW * Wd).sum())
    assert abs(radial) <= tolerance(F64, size=d * 8, depth=4, scale=float(gW.norm() * Wd.norm())).atol
    with torch.no_grad():
        assert_close(loss(3.7 * W), loss(W), dtype=F64, size=d, depth=4, what="L(cW) = L(W)")
    # and a weight whose output does NOT feed a norm is no gauge: the same check fails without PearlNorm
    (gV,) = torch.autograd.grad(((u @ W.T - tgt) ** 2).mean(), W)
    assert abs(float((gV * Wd).sum())) > CLEARLY_NONZERO * tolerance(F64, size=d * 8, depth=4,
                                                                      scale=float(gV.norm() * Wd.norm())).atol


@given(st.sampled_from([4, 16, 64]), seeds, st.floats(1e-4, 1.0, **finite))
def test_pearlnorm_eps_breaks_the_gauge_by_the_law(d, seed, eps):
    """d/dc PearlNorm_eps(c x)|_{c=1} = J(x) x = eps * x * gain / (mu + eps)^2 exactly."""
    g = _gen(seed)
    x = torch.randn(d, generator=g, dtype=F64)
    gain = torch.rand(d, generator=g, dtype=F64) + 0.5
    dy = flat_jacobian(lambda t: pearl_norm(t, eps, gain), x) @ x  # the derivative along the ray
    mu = mean_pair_radius(x)
    # the derivative is a cancellation x/(mu+eps) - x mu/(mu+eps)^2: round-off scales with those terms
    scale = float((x * gain).abs().max() / (mu + eps))
    assert_close(dy, eps * x * gain / (mu + eps) ** 2, dtype=F64, size=d, depth=4, scale=scale,
                 what="eps breaking law")


def test_pearlnorm_zero_input_and_zero_pair():
    z = torch.zeros(2, 8, dtype=F64, requires_grad=True)
    y = pearl_norm(z)
    assert torch.equal(y, torch.zeros_like(y))
    x = torch.randn(8, dtype=F64)
    x[2:4] = 0.0  # one zero pair: mu's subgradient there is 0, not NaN
    x.requires_grad_()
    (gx,) = torch.autograd.grad(pearl_norm(x).square().sum(), x)
    assert bool(torch.isfinite(gx).all())
    with pytest.raises(ValueError, match="PearlNorm eps"):
        PearlNorm(8, eps=-1.0)
    with pytest.raises(ValueError, match="even"):
        PearlNorm(7)


def test_pearlnorm_gradcheck():
    gain = torch.rand(8, dtype=F64) + 0.5
    x = torch.randn(3, 8, dtype=F64, requires_grad=True)
    assert gradcheck(lambda t: pearl_norm(t, 0.0, gain), (x,), size=8, depth=3)
    assert gradcheck(lambda t: pearl_norm(t, 1e-2, gain), (x,), size=8, depth=3)


# ------------------------------------------------------------------------------- grt.radial_gelu_angle


@given(st.sampled_from([2, 8, 64]), seeds, st.floats(-3, 2, **finite))
def test_radial_gelu_angle(d, seed, log10_scale):
    x = torch.randn(4, d, generator=_gen(seed), dtype=F64) * 10**log10_scale
    y = RadialGELU()(x)
    r, phi = to_polar(x)
    ry, phiy = to_polar(y)
    assert_close(_wrapped_diff(phiy, phi), torch.zeros_like(phi), dtype=F64, size=2, depth=4, scale=math.pi,
                 what="angle preserved")
    assert_close(ry, F.gelu(r), dtype=F64, size=2, depth=4, what="radius = GELU(r) (exact, erf)")


def test_radial_gelu_at_zero():
    """Padded pairs start at r = 0: value 0, Jacobian I/2 (Phi(0)), no NaN in the gradient."""
    x = torch.zeros(1, 6, dtype=F64)
    x[0, 2:4] = torch.tensor([0.3, -0.4], dtype=F64)
    x.requires_grad_()
    y = radial_gelu(x)
    assert torch.equal(y[0, :2], torch.zeros(2, dtype=F64))
    (gx,) = torch.autograd.grad(y.sum(), x)
    assert bool(torch.isfinite(gx).all())
    J = flat_jacobian(radial_gelu, x.detach())
    assert_close(J[:2, :2], 0.5 * torch.eye(2, dtype=F64), dtype=F64, size=2, what="J = I/2 at a zero pair")
    # continuity of the Jacobian: at a tiny radius it is within O(r) of I/2
    r_tiny = 1e-9  # J = Phi(r) I + phi(r) x x^T / r = I/2 + O(r): within 2 phi(0) r < r of I/2
    Jt = flat_jacobian(radial_gelu, torch.tensor([[r_tiny, 0.0]], dtype=F64))
    assert float((Jt - 0.5 * torch.eye(2, dtype=F64)).abs().max()) <= r_tiny


def test_radial_gelu_gradcheck():
    x = torch.randn(3, 8, dtype=F64, requires_grad=True)
    assert gradcheck(radial_gelu, (x,), size=8, depth=2)


# --------------------------------------------------------------------------------------------- config


def test_config_reference_defaults_and_roundtrip():
    cfg = GRTConfig()
    assert (cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.n_blocks, cfg.d_ff) == (50000, 256, 4, 64, 12,
                                                                                              1024)
    assert (cfg.qkvo_stages, cfg.mixer_stages, cfg.ffn_stages) == (11, 1, 21)
    assert cfg.qkvo_coupling and cfg.mixer_coupling and not cfg.ffn_coupling
    assert GRTConfig(**cfg.to_dict()) == cfg
    small = GRTConfig.small()
    assert small.vocab_size == 256 and GRTConfig(**small.to_dict()) == small
    assert GRTConfig.preset("small", n_blocks=2).n_blocks == 2
    assert cfg.resolved_final_gain_init == pytest.approx(1 / math.sqrt(128))
    assert GRTConfig(tie_head=False).resolved_final_gain_init == 1.0


@pytest.mark.parametrize(("key", "value", "match"), [
    ("d_model", 100, "d_model must be a power of two"),
    ("d_model", 0, "d_model must be a power of two"),
    ("n_heads", 3, "n_heads must divide"),
    ("d_ff", 128, r"d_ff must be in \[d_model=256"),
    ("qkvo_stages", 0, r"qkvo_stages must be an integer in \[1, inf\)"),
    ("gate_init", 1.0, r"gate_init must be a finite number in \(0, 1\)"),
    ("gate_init", float("nan"), "gate_init"),
    ("norm_eps", -1e-6, r"norm_eps must be a finite number in \[0, inf\)"),
    ("embed_radius_init", 0.0, "embed_radius_init"),
    ("rope", 1, "rope must be a bool"),
    ("mixer_first_stage", -1, "mixer_first_stage"),
    ("final_gain_init", -1.0, "final_gain_init"),
])
def test_config_validation_names_the_key(key, value, match):
    with pytest.raises(ValueError, match=match):
        GRTConfig(**{key: value})
    with pytest.raises(ValueError, match="preset must be one of"):
        GRTConfig.preset("huge")


# ---------------------------------------------------------------------------------- grt.stage_counts


def test_stage_counts():
    cfg = GRTConfig()
    expected = {"q": 11, "k": 11, "v": 11, "o": 11, "mixer": 1, "ffn_expand": 21, "ffn_contract": 21,
                "per_block": 87, "n_blocks": 12, "total": 1044}
    assert cfg.stage_counts() == expected
    assert stage_counts_from_model(GRT(cfg, device="meta")) == expected


@given(st.integers(1, 12), st.integers(1, 3), st.integers(1, 25), st.integers(1, 4))
def test_stage_counts_any_config(qkvo, mixer, ffn, blocks):
    cfg = GRTConfig(vocab_size=16, d_model=16, n_heads=2, d_ff=32, n_blocks=blocks, qkvo_stages=qkvo,
                    mixer_stages=mixer, ffn_stages=ffn)
    counts = cfg.stage_counts()
    assert counts["per_block"] == 4 * qkvo + mixer + 2 * ffn and counts["total"] == blocks * counts["per_block"]
    assert stage_counts_from_model(GRT(cfg, device="meta")) == counts


# ------------------------------------------------------------------------------- grt.param_accounting


def dense_module_counts(model: torch.nn.Module) -> dict[str, int]:
    """Count a built ``DenseTransformer``'s parameters per component, by parameter name."""
    names = {"tok_emb": "embedding", "q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o",
             "mlp.up": "ffn_expand", "mlp.down": "ffn_contract", "norm": "norms", "head": "head"}
    out = dict.fromkeys(COMPONENTS, 0)
    for name, p in model.named_parameters():
        comp = next((c for key, c in names.items() if key in name), None)
        if comp is None:
            raise KeyError(f"dense parameter {name!r} has no accounting component")
        out[comp] += p.numel()
    return out


@given(st.sampled_from([8, 16, 32]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.integers(1, 300),
       st.integers(1, 3), st.integers(1, 4), st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_param_accounting(d, heads, ff_mult, vocab, blocks, stages, qkvo_c, mix_c, ffn_c, tie):
    cfg = GRTConfig(vocab_size=vocab, d_model=d, n_heads=heads, d_ff=d * ff_mult, n_blocks=blocks,
                    qkvo_stages=stages, mixer_stages=stages, ffn_stages=stages + 1, qkvo_coupling=qkvo_c,
                    mixer_coupling=mix_c, ffn_coupling=ffn_c, tie_head=tie)
    model = GRT(cfg, device="meta")
    counts = module_param_counts(model)
    assert counts == grt_param_counts(cfg)
    assert sum(sum(v.values()) for v in counts.values()) == sum(p.numel() for p in model.parameters())
    with torch.device("meta"):
        dense = DenseTransformer(dense_config_for(cfg))
    assert dense_module_counts(dense) == dense_param_counts(cfg)
    assert sum(dense_param_counts(cfg).values()) == sum(p.numel() for p in dense.parameters())
    rows = param_table(cfg, counts)
    assert rows[-1].component == "total" and rows[-1].grt == model.num_parameters()
    assert embedding_ratio(cfg) == Fraction(d // 2 + 1, d) == Fraction(rows[0].grt, rows[0].dense)


def test_param_accounting_reference_numbers():
    """The reference table, written out: the exact embedding ratio and where the GRT costs more."""
    cfg = GRTConfig()
    assert embedding_ratio(cfg) == Fraction(129, 256) and float(embedding_ratio(cfg)) == 0.50390625
    assert per_stage_cost(64, True) == {"angles": 32, "scales": 64, "coupling": 4096, "other": 0}
    rows = {r.component: r for r in param_table(cfg)}
    assert rows["embedding"].grt == 50000 * 129 and rows["embedding"].dense == 50000 * 256
    assert rows["q"].grt == 12 * 4 * 11 * (32 + 64 + 4096) == 2_213_376 and rows["q"].dense == 12 * 256**2
    assert rows["mixer"].grt == 12 * (128 + 256 + 256**2) and rows["mixer"].dense == 0
    assert rows["ffn_expand"].grt == 12 * 21 * (512 + 1024) and rows["ffn_expand"].dense == 12 * 256 * 1024
    assert rows["total"].grt == 16_878_196 and rows["total"].dense == 22_243_584
    assert rows["q"].ratio > 2.8  # honest: each coupled stage stores one d_head x d_head matrix of coupling
    assert "GRT costs more" in format_table(list(rows.values()))
    untied = {r.component: r for r in param_table(GRTConfig(tie_head=False))}
    assert untied["head"].grt == untied["head"].dense == 50000 * 256
