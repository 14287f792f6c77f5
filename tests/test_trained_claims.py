"""studies.trained.claims: each trained-model claim on a tiny model trained a few steps, and a case that flips it.

Every verdict is shown to be able to fail: the test builds the model the claim would reject (gates out of the
text's ordering or saturated, a uniform PearlNorm gain, a projection amplified past its scale bound, heads made
identical, a coupling strong enough to flip a Jacobian's sign) and checks the record says FAILS.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from grt_model.config import GRTConfig
from grt_model.model import GRT
from lm.dense import DenseConfig, DenseTransformer
from rmsgauge import run_claims, seed_everything, tolerance
from rmsgauge.corpus import ByteCorpus
from studies.trained.claims import (
    CLAIMS,
    claim_coupled_det_sign_trained,
    claim_head_diversity,
    claim_signal_propagation,
    claim_trained_gates,
    claim_trained_ring_radius,
)
from studies.trained.measure import (
    cascade_bounds,
    cascade_gain,
    cascade_head_jacobians,
    dense_record,
    ffn_composed,
    ffn_jacobian,
    linear_cka,
    pairwise_js_bits,
    per_token_jacobian,
    radial_gelu_jacobian_max,
)

STEPS = 6  # a few AdamW steps: enough to move gates, gains and scales off their init values
JAC = 16  # Jacobian tokens in the tests


def _tiny_grt() -> GRT:
    return GRT(GRTConfig(vocab_size=256, block_size=16, d_model=32, n_heads=4, n_blocks=2, d_ff=64))


def _tiny_dense() -> DenseTransformer:
    return DenseTransformer(DenseConfig(vocab_size=256, block_size=16, d_model=32, n_heads=4, n_layers=2, d_ff=128))


def _train(model: torch.nn.Module, corpus: ByteCorpus, steps: int) -> torch.nn.Module:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = corpus.batch("train", 8, 16, generator=g)
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def models():
    corpus = ByteCorpus.load()
    seed_everything(0)
    grt_init = _tiny_grt()
    grt = _train(copy.deepcopy(grt_init), corpus, STEPS)
    seed_everything(0)
    dense_init = _tiny_dense()
    dense = _train(copy.deepcopy(dense_init), corpus, STEPS)
    ids = corpus.batch("val", 6, 16, generator=torch.Generator().manual_seed(0))[0]  # (6, 16) held out
    return {"grt": grt, "dense": dense, "grt_init": grt_init, "dense_init": dense_init, "ids": ids}


def _with(model: GRT, fn) -> GRT:
    m = copy.deepcopy(model)
    with torch.no_grad():
        fn(m)
    return m


# --------------------------------------------------------------------------------------------- the group


def test_the_group_records_every_trained_claim_in_order(models):
    claims = run_claims(CLAIMS, grt=models["grt"], dense=models["dense"], held_out_ids=models["ids"],
                        grt_init=models["grt_init"], dense_init=models["dense_init"], jac_tokens=JAC)
    assert [c.id for c in claims] == list(CLAIMS.checks)
    assert all(c.dtype == "float64" for c in claims)
    for c in claims:
        c.to_json()  # strict JSON


def test_measurements_leave_the_float32_model_untouched(models):
    before = {k: v.clone() for k, v in models["grt"].state_dict().items()}
    claim_trained_ring_radius(models["grt"], None, models["ids"])
    after = models["grt"].state_dict()
    assert all(after[k].dtype == torch.float32 and torch.equal(after[k], v) for k, v in before.items())


# --------------------------------------------------------------------------------------------- gates


def test_trained_gates(models):
    def set_logits(attn, mixer, ffn):
        return _with(models["grt"], lambda m: m.blocks[0].gate_logits.copy_(torch.tensor([attn, mixer, ffn])))

    good = claim_trained_gates(set_logits(4.6, 3.5, 1.3), None, models["ids"])  # sigmoid: 0.99, 0.97, 0.79
    assert good.holds and good.measured["block0_ordered"]
    logit = float(torch.tensor(4.6, dtype=torch.float32))  # the parameter stores float32; measured in float64
    assert abs(good.measured["block0"]["attn"] - 1 / (1 + math.exp(-logit))) < tolerance("float64").bound(1.0)
    flipped = claim_trained_gates(set_logits(0.0, 1.0, 2.0), None, models["ids"])  # FFN written most
    assert not flipped.holds and not flipped.measured["block0_ordered"]
    saturated = claim_trained_gates(set_logits(50.0, 3.5, 1.3), None, models["ids"])  # g == 1.0 in float64
    assert not saturated.holds and not saturated.measured["all_in_open_unit_interval"]
    trained = claim_trained_gates(models["grt"], None, models["ids"], grt_init=models["grt_init"])
    assert trained.details["init_gates_block0"]["attn"] == pytest.approx(models["grt"].config.gate_init)
    assert trained.measured["block0"] != trained.details["init_gates_block0"]  # training moved them


# --------------------------------------------------------------------------------------------- ring radius


def test_trained_ring_radius(models):
    c = claim_trained_ring_radius(models["grt"], None, models["ids"], grt_init=models["grt_init"])
    assert c.holds, c.measured
    assert c.measured["ring_spread"] <= c.tolerance  # one magnitude per token: a ring
    assert c.measured["spread_after_pearlnorm_min"] > c.tolerance  # the learned gain leaves radii unequal
    uniform = _with(models["grt"], lambda m: m.blocks[0].norm_attn.gain.fill_(0.7))
    u = claim_trained_ring_radius(uniform, None, models["ids"])
    assert not u.holds and u.measured["spread_after_pearlnorm_min"] <= u.tolerance  # PearlNorm kept the ring


# --------------------------------------------------------------------------------------------- signal propagation


def test_radial_gelu_jacobian_max_is_the_maximum():
    r = torch.linspace(0, 6, 60001, dtype=torch.float64)
    phi = torch.exp(-r * r / 2) / math.sqrt(2 * math.pi)
    radial = 0.5 * (1 + torch.erf(r / math.sqrt(2))) + r * phi
    assert float(radial.max()) <= radial_gelu_jacobian_max()
    assert radial_gelu_jacobian_max() - float(radial.max()) < 1e-9 and radial_gelu_jacobian_max() > 1.0


def test_cascade_gain_lies_in_the_scale_bound_with_coupling_on():
    seed_everything(3)
    m = _tiny_grt().double()
    c = m.blocks[0].attn.qkv
    with torch.no_grad():
        c.raw_scales.normal_(0.0, 1.0)  # anisotropic scales
        c.coupling.mul_(50.0)  # strong coupling: the angle depends on the input, the norm bound does not
    x = torch.randn(200, 32, dtype=torch.float64)
    g = cascade_gain(c, x)
    lo, hi = cascade_bounds(c)
    tol = tolerance(torch.float64, size=c.width, depth=c.n_stages)
    assert bool((g >= lo * (1 - tol.rtol)).all() and (g <= hi * (1 + tol.rtol)).all())


def test_fast_jacobians_equal_the_generic_ones(models):
    """The per-head and closed-form Jacobians are the same functions as ``vmap(jacrev)`` of the modules."""
    m = copy.deepcopy(models["grt"]).double()
    blk = m.blocks[0]
    z = torch.randn(5, 32, dtype=torch.float64)
    J = per_token_jacobian(blk.attn.qkv, z).view(5, 12, 8, 4, 8)  # (n, 3H, w, Hin, w)
    heads = torch.arange(12)
    tol = tolerance(torch.float64, size=8, depth=11)
    blocks = J.permute(0, 1, 3, 2, 4)[:, heads, heads % 4]
    assert torch.allclose(cascade_head_jacobians(blk.attn.qkv, z), blocks, rtol=tol.rtol, atol=tol.atol)
    assert J.permute(0, 1, 3, 2, 4)[:, heads, (heads + 1) % 4].abs().max() == 0  # heads never mix
    lin = cascade_head_jacobians(blk.ffn.expand, z.new_zeros(3, 64))  # linear: the same matrix at every token
    assert torch.allclose(lin[0], per_token_jacobian(blk.ffn.expand, torch.randn(1, 64, dtype=torch.float64))[0])
    tol = tolerance(torch.float64, size=64, depth=43)
    assert torch.allclose(ffn_jacobian(blk, z), per_token_jacobian(lambda t: ffn_composed(blk, t), z),
                          rtol=tol.rtol, atol=tol.atol)


def test_signal_propagation(models):
    c = claim_signal_propagation(models["grt"], models["dense"], models["ids"], grt_init=models["grt_init"],
                                 dense_init=models["dense_init"], jac_tokens=JAC)
    assert c.holds, c.measured
    blk = c.details["grt trained"]["blocks"][0]["projections"]
    assert blk["ffn_expand"]["jacobian_in_bound"] and blk["ffn_expand"]["jacobian_bounded_by_construction"]
    assert not blk["q"]["jacobian_bounded_by_construction"]
    assert c.details["dense trained"]["attention_replica_max_diff"] <= tolerance("float64", size=32).bound(1.0)
    assert blk["ffn"]["fused_vs_composed_max_diff"] <= tolerance("float64", size=64, depth=43).bound(1.0)
    # amplify the mixer past its bound: the measurement must see it
    amp = copy.deepcopy(models["grt"])
    lo, hi = cascade_bounds(amp.blocks[1].mixer.cascade)
    amp.blocks[1].mixer.cascade.register_forward_hook(lambda mod, inp, out: out * (2.0 * float(hi.max())))
    bad = claim_signal_propagation(amp, None, models["ids"], jac_tokens=JAC)
    assert not bad.holds
    assert not bad.details["grt trained"]["blocks"][1]["projections"]["mixer"]["gain_in_bound"]


def test_dense_attention_replica_matches_the_forward(models):
    rec = dense_record(models["dense"], models["ids"])
    assert rec["replica_err"] <= tolerance("float64", size=32, depth=4).bound(1.0)
    w = rec["blocks"][0]["weights"]
    assert torch.allclose(w.sum(-1), torch.ones((), dtype=w.dtype)) and bool((w.triu(1) == 0).all())


# --------------------------------------------------------------------------------------------- head diversity


def test_js_and_cka_primitives():
    w = torch.softmax(torch.randn(2, 3, 5, 5, dtype=torch.float64), -1).tril()
    w = w / w.sum(-1, keepdim=True)
    js = pairwise_js_bits(w)  # (2, 3, 3, 5)
    assert bool((js.diagonal(dim1=1, dim2=2).abs() < 1e-15).all()) and bool((js >= -1e-15).all())
    assert bool((js <= 1 + 1e-12).all()) and torch.allclose(js, js.transpose(1, 2))
    # a near one-hot head's subnormal weight: halving 5e-324 rounds to 0, so a/m must not be computed as a/((p+q)/2)
    tiny = torch.tensor([[1.0, 5e-324], [1.0, 0.0]], dtype=torch.float64).view(1, 2, 1, 2)  # (B, H, T, T)
    js_tiny = pairwise_js_bits(tiny)
    assert bool(torch.isfinite(js_tiny).all()) and float(js_tiny.abs().max()) < 1e-300, js_tiny
    disjoint = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64).view(1, 2, 1, 2)
    assert float(pairwise_js_bits(disjoint)[0, 0, 1, 0]) == 1.0  # disjoint supports: exactly 1 bit
    x = torch.randn(50, 3, 4, dtype=torch.float64)
    x[:, 1] = x[:, 0] @ torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))[0] * 3.0  # rotated, scaled copy
    k = linear_cka(x)
    assert abs(float(k[0, 1]) - 1.0) < 1e-12 and float(k[0, 2]) < 1.0


def test_head_diversity(models):
    c = claim_head_diversity(models["grt"], models["dense"], models["ids"], grt_init=models["grt_init"])
    assert c.holds, c.measured
    assert "dense trained" in c.details and "grt init" in c.details

    def clone_head0(m: GRT) -> None:
        H = m.config.n_heads
        for blk in m.blocks:
            for casc, n_proj in ((blk.attn.qkv, 3), (blk.attn.o, 1)):
                for p in (casc.angles, casc.raw_scales, casc.coupling):
                    v = p.view(n_proj, H, *p.shape[1:])
                    v.copy_(v[:, :1].expand_as(v).clone())

    # identical parameters are not enough to make heads attend alike: each head reads its own slice of the token
    cloned = claim_head_diversity(_with(models["grt"], clone_head0), None, models["ids"])
    par = cloned.details["grt trained"][0]["param_cosine_max_abs_offdiag"]
    assert all(abs(v - 1.0) < tolerance("float64", size=10_000).bound(1.0) for v in par.values())

    def zero_queries(m: GRT) -> None:  # softplus(-1e4) = 0: q = 0, every score 0, every head uniform over the past
        H = m.config.n_heads
        for blk in m.blocks:
            blk.attn.qkv.raw_scales[:H].fill_(-1e4)

    same = claim_head_diversity(_with(models["grt"], zero_queries), None, models["ids"])
    assert not same.holds
    assert max(same.measured["grt: min pairwise JS (bits) per block"]) == 0.0


# --------------------------------------------------------------------------------------------- det sign


def test_coupled_det_sign_trained(models):
    zero = _with(models["grt"], lambda m: [p.zero_() for n, p in m.named_parameters() if n.endswith("coupling")])
    c0 = claim_coupled_det_sign_trained(zero, None, models["ids"], jac_tokens=JAC)
    assert c0.holds and c0.measured["negative"] == 0  # linear cascades: det = prod s0 s1 > 0
    strong = _with(models["grt"], lambda m: [p.mul_(200.0) for n, p in m.named_parameters() if n.endswith("coupling")])
    c1 = claim_coupled_det_sign_trained(strong, None, models["ids"], jac_tokens=JAC)
    assert not c1.holds and 0 < c1.measured["negative"] <= c1.measured["of"]
    c = claim_coupled_det_sign_trained(models["grt"], None, models["ids"], grt_init=models["grt_init"],
                                       jac_tokens=JAC)
    assert c.measured["of"] == 2 * JAC * (3 * 4 + 4 + 1)  # blocks x tokens x (q, k, v, o heads + mixer)
