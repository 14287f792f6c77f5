"""The whole GRT: blocks, the residual determinant, the mixer crossing heads, training, checkpoints, trace, CLI.

Claims ``grt.jacobian`` (block gradcheck), ``grt.residual_det_sign``, ``grt.mixer_crosses_heads``,
``grt.model_trains``, and ``grt_model.claims.CLAIMS``.
"""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from table_check import assert_table_shows_numbers

from grt_model import GRT, GRTBlock, GRTConfig
from grt_model.attention import causal_attention_with_weights
from grt_model.claims import CLAIMS
from grt_model.claims.geometry import claim_jacobian
from grt_model.claims.model import WIRING_EXPECTED, claim_butterfly_wiring, claim_fast_equals_reference
from grt_model.claims.tools import (
    cross_head_blocks,
    flat_jacobian,
    gradcheck,
    mixer_witness_block,
    numerical_rank,
    residual_det,
    tiny_config,
)
from grt_model.model import GATE_NAMES
from grt_model.pearlnorm import mean_pair_radius, pearl_norm_jacobian_norm
from grt_model.trace import trace_model
from rmsgauge import assert_close, run_claims, tolerance
from rmsgauge.corpus import ByteCorpus

F64 = torch.float64
seeds = st.integers(0, 2**16)
finite = {"allow_nan": False, "allow_infinity": False}
CLEARLY_NONZERO = 1e3  # a structural nonzero must exceed the round-off tolerance by three orders of magnitude


@pytest.fixture(scope="module")
def corpus() -> ByteCorpus:
    return ByteCorpus.load()


# ---------------------------------------------------------------------------------- grt.jacobian (block)


def test_jacobian_block_gradcheck():
    """A full block (attention with RoPE, mixer, FFN, three PearlNorms, gates) against finite differences:
    w.r.t. its input, the gates and a norm gain in full, and w.r.t. the larger tensors (mixer coupling, Q/K/V
    angles, FFN scales) along one random direction each (the directional derivative <grad, V>)."""
    cfg = tiny_config(d_model=16, n_heads=2, d_ff=32, qkvo_stages=3, ffn_stages=5)
    blk = GRTBlock(cfg, dtype=F64)
    x = torch.randn(1, 3, 16, dtype=F64, requires_grad=True)
    assert gradcheck(blk, (x,), size=48, depth=20)
    params = {k: v.detach() for k, v in blk.named_parameters()}
    full = ["gate_logits", "norm_attn.gain"]
    directional = ["mixer.cascade.coupling", "attn.qkv.angles", "ffn.expand.raw_scales"]
    dirs = {n: torch.randn_like(params[n]) for n in directional}

    def fn(*ps):
        over = dict(zip(full, ps[: len(full)]))
        over |= {n: params[n] + t * dirs[n] for n, t in zip(directional, ps[len(full):])}
        return torch.func.functional_call(blk, {**params, **over}, (x.detach(),))

    inputs = tuple(params[n].clone().requires_grad_() for n in full) + tuple(
        torch.zeros(1, dtype=F64, requires_grad=True) for _ in directional)
    assert gradcheck(fn, inputs, size=48, depth=20)


# ----------------------------------------------------------------------------- grt.residual_det_sign


@given(st.sampled_from([8, 16, 32]), seeds, st.floats(0.05, 4.0, **finite), st.floats(0.05, 0.95, **finite))
def test_residual_det_sign(d, seed, mu_over_g, gate):
    """Witness family on a real mixer sublayer (angles pi, unit scales, coupling off, gain 1):
    det(I + J_f) = (1 - g/mu)^(d-1) exactly, negative whenever mu < g (d even)."""
    if abs(mu_over_g - 1) < 0.02:
        mu_over_g = 1.02  # det -> 0 at mu = g: the sign is decided by round-off there
    blk = mixer_witness_block(tiny_config(d_model=d, n_heads=2), coupling=False)
    with torch.no_grad():
        blk.gate_logits[1] = math.log(gate / (1 - gate))
    x = torch.randn(d, generator=torch.Generator().manual_seed(seed), dtype=F64)
    x = x / mean_pair_radius(x) * (mu_over_g * gate)
    sign, logabs, _ = residual_det(blk, "mixer", x)
    base = 1 - 1 / mu_over_g
    assert sign == (1.0 if base > 0 else -1.0)
    closed = (d - 1) * math.log(abs(base))
    assert abs(logabs - closed) <= tolerance(F64, size=d, depth=4, scale=max(1.0, abs(closed))).atol


def test_residual_det_sign_witness_reference_widths():
    """The same witness at d = 256 with the coupling on (init): still negative."""
    blk = mixer_witness_block(GRTConfig(), coupling=True)
    x = torch.randn(256, dtype=F64)
    x = x / mean_pair_radius(x) * 0.25  # mu = g/2
    sign, _, norm = residual_det(blk, "mixer", x)
    assert sign < 0 and norm > 1


@given(seeds, st.floats(-1.5, 1.0, **finite), st.floats(0.0, 0.6, **finite), st.floats(-3, 3, **finite))
def test_residual_det_sign_sufficient_condition(seed, log10_scale, coupling_std, gate_logit):
    """||J_f||_2 < 1  =>  det(I + J_f) > 0, on random mixer sublayers; and the computable bound
    ||J_f||_2 <= g ||J_M||_2 ||gain||_inf rho/mu^2 holds."""
    torch.manual_seed(seed)
    blk = GRTBlock(tiny_config(d_model=16, n_heads=4), dtype=F64)
    with torch.no_grad():
        blk.mixer.cascade.coupling.normal_(0.0, coupling_std)
        blk.mixer.cascade.raw_scales.normal_(0.5, 0.5)
        blk.norm_mixer.gain.uniform_(0.5, 1.5)
        blk.gate_logits[1] = gate_logit
    x = torch.randn(16, dtype=F64) * 10**log10_scale
    sign, _, norm = residual_det(blk, "mixer", x)
    if norm < 1:
        assert sign > 0, f"||J_f|| = {norm:.3g} < 1 but det(I + J_f) <= 0"
    with torch.no_grad():
        g, gain_max, z = float(blk.gates()[1]), float(blk.norm_mixer.gain.abs().max()), blk.norm_mixer(x.view(1, 1, -1))
    J_M = flat_jacobian(lambda t: blk.mixer(t), z)
    bound = g * float(torch.linalg.matrix_norm(J_M, 2)) * gain_max * float(pearl_norm_jacobian_norm(x))
    assert norm <= bound * (1 + tolerance(F64, size=16, depth=4).rtol)


def test_residual_det_sign_sufficient_condition_is_not_vacuous():
    """Large inputs (mu >> g) satisfy ||J_f|| < 1 (so det > 0 is guaranteed); tiny ones violate it."""
    blk = GRTBlock(tiny_config(d_model=16, n_heads=4), dtype=F64)
    x = torch.randn(16, dtype=F64)
    _, _, big = residual_det(blk, "mixer", x * 100)
    _, _, small = residual_det(blk, "mixer", x / 100)
    assert big < 1 < small


# --------------------------------------------------------------------------- grt.mixer_crosses_heads


def _cross_ranks(J: torch.Tensor, H: int, tol) -> list[int]:
    B = cross_head_blocks(J, H)
    return [numerical_rank(B[b, a], tol) for b in range(H) for a in range(H) if a != b]


@given(seeds, st.sampled_from([(32, 4), (64, 4), (32, 2)]))
def test_mixer_crosses_heads(seed, dims):
    """One token.  Before the mixer: Q/K/V/O + attention have exactly zero cross-head Jacobian blocks; with
    PearlNorm in front (the attention sublayer) the cross-head blocks have rank exactly 1 (its one per-token
    factor).  After the mixer: rank P_head (one nudged angle per output pair) -- through the coupling only,
    since the mixer's stride-1 stage pairs coordinates inside a head (coupling off: exactly zero)."""
    torch.manual_seed(seed)
    d, H = dims
    cfg = tiny_config(d_model=d, n_heads=H)
    blk = GRTBlock(cfg, dtype=F64)
    x = torch.randn(1, 1, d, dtype=F64)
    tol = tolerance(F64, size=cfg.d_head, depth=cfg.qkvo_stages)
    off = ~torch.eye(H, dtype=torch.bool)
    J_path = cross_head_blocks(flat_jacobian(lambda t: blk.attn(t), blk.norm_attn(x)), H)
    assert float(J_path[off].abs().max()) == 0.0
    assert float(J_path[~off].abs().max()) > 0.0
    assert max(_cross_ranks(flat_jacobian(lambda t: blk.sublayer("attn", t), x), H, tol)) == 1
    J_mix = flat_jacobian(lambda t: blk.mixer(t), blk.norm_mixer(x))
    assert _cross_ranks(J_mix, H, tol) == [cfg.head_pairs] * (H * (H - 1))
    assert min(_cross_ranks(flat_jacobian(lambda t: blk.sublayer("mixer", t), x), H, tol)) > 1
    assert blk.mixer.cascade.strides() == [1]
    blk_off = GRTBlock(GRTConfig(**{**cfg.to_dict(), "mixer_coupling": False}), dtype=F64)
    assert float(cross_head_blocks(flat_jacobian(lambda t: blk_off.mixer(t), x), H)[off].abs().max()) == 0.0


def test_mixer_crosses_heads_over_a_sequence():
    """Across tokens too: the attention path (Q/K/V -> softmax -> O, RoPE on) never moves information from one
    head's slice of any token to another head's slice of any token."""
    cfg = tiny_config(d_model=16, n_heads=4, qkvo_stages=4)
    blk = GRTBlock(cfg, dtype=F64)
    z = torch.randn(1, 5, 16, dtype=F64)
    J = flat_jacobian(lambda t: blk.attn(t), z).view(5, 4, 4, 5, 4, 4)  # (t, h, i, t', h', j)
    cross = J.permute(1, 4, 0, 2, 3, 5)[~torch.eye(4, dtype=torch.bool)]
    assert float(cross.abs().max()) == 0.0
    later = J[0, :, :, 1:]  # causal: token 0 sees no later token
    assert float(later.abs().max()) == 0.0


def test_mixer_first_stage_crosses_heads_by_wiring():
    """With ``mixer_first_stage`` giving stride d_head, the wiring itself pairs across heads (coupling off)."""
    cfg = tiny_config(d_model=32, n_heads=4, mixer_coupling=False, mixer_first_stage=3)  # stride 8 = d_head
    blk = GRTBlock(cfg, dtype=F64)
    assert blk.mixer.cascade.strides() == [8]
    B = cross_head_blocks(flat_jacobian(lambda t: blk.mixer(t), torch.randn(1, 1, 32, dtype=F64)), 4)
    assert float(B[1, 0].abs().max()) > 0 and float(B[2, 0].abs().max()) == 0.0  # heads 0<->1 and 2<->3 only


# --------------------------------------------------------------------------------------- grt.model_trains


def test_model_trains(corpus):
    torch.manual_seed(0)
    cfg = tiny_config()
    model = GRT(cfg)
    x, y = corpus.batch("train", 8, cfg.block_size, generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for step in range(6):
        logits, loss = model(x, y)
        assert logits.shape == (8, cfg.block_size, cfg.vocab_size) and logits.dtype == torch.float32
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step == 0:
            for name, p in model.named_parameters():
                assert p.grad is not None, f"{name} got no gradient"
                assert bool(torch.isfinite(p.grad).all()), f"{name} has a non-finite gradient"
                if "gate" in name or "coupling" in name or "angles" in name:
                    assert float(p.grad.abs().max()) > 0, f"{name}: zero gradient"
        losses.append(float(loss.detach()))
        opt.step()
    assert all(math.isfinite(v) for v in losses)
    assert losses[0] == pytest.approx(math.log(256), abs=1.0)  # near-uniform logits at init
    assert losses[-1] < losses[0] - 0.5, f"AdamW did not lower the loss: {losses}"


def test_model_trains_state_dict_and_checkpoint_roundtrip(tmp_path, corpus):
    cfg = tiny_config(rope=False, tie_head=False, gate_init=0.8, n_blocks=1)
    model = GRT(cfg)
    x, _ = corpus.batch("val", 2, 16, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "grt.pt"
    torch.save({"config": cfg.to_dict(), "model": model.state_dict()}, path)
    ck = torch.load(path, weights_only=True)
    clone = GRT(GRTConfig(**ck["config"]))
    clone.load_state_dict(ck["model"])
    assert clone.config == cfg
    assert torch.equal(clone(x)[0], model(x)[0])
    other = GRT(cfg)  # a fresh init differs, so the equality above is not vacuous
    assert not torch.equal(other(x)[0], model(x)[0])
    assert set(model.state_dict()) == set(clone.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), clone.state_dict().values()))


def test_model_trains_reference_config_forward_backward(corpus):
    """The text's reference config (vocab 50,000, 12 blocks, 1,044 stages) at batch 1 x 8 tokens on CPU."""
    cfg = GRTConfig()
    t0 = time.perf_counter()
    model = GRT(cfg)
    x, y = corpus.batch("val", 1, 8, generator=torch.Generator().manual_seed(0))
    logits, loss = model(x, y)
    loss.backward()
    secs = time.perf_counter() - t0
    assert logits.shape == (1, 8, 50000) and math.isfinite(float(loss.detach()))
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    assert model.num_parameters() == 16_878_196
    print(f"reference GRT forward+backward, batch 1 x 8, float32: {secs:.2f} s, loss {float(loss.detach()):.3f}")


# ------------------------------------------------------------------------------------ dtype, device, rope


def test_dtype_and_device_agnostic():
    cfg = tiny_config(n_blocks=1)
    idx = torch.randint(0, 256, (2, 6))
    m = GRT(cfg)
    m64 = GRT(cfg).to(F64)
    m64.load_state_dict(m.state_dict())
    l32, l64 = m(idx)[0], m64(idx)[0]
    assert l64.dtype == F64
    assert_close(l32, l64.float(), dtype=torch.float32, size=cfg.d_model, depth=cfg.stage_counts()["per_block"],
                 what="float32 vs float64 logits")
    built = GRT(cfg, dtype=F64)
    assert all(p.dtype == F64 for p in built.parameters())
    assert float((built.blocks[0].mixer.cascade.scales().detach() - 1).abs().max()) == 0.0  # exact unit scales
    if torch.cuda.is_available():
        mc = GRT(cfg).to("cuda")
        mc.load_state_dict(m.state_dict())
        assert_close(mc(idx.cuda())[0].cpu(), l32, dtype=torch.float32, size=cfg.d_model, depth=87)


def test_rope_switch():
    """RoPE rotates Q/K pairs by t * omega: identity at position 0, so only later positions change."""
    cfg = tiny_config(n_blocks=1)
    on = GRT(cfg, dtype=F64)
    off = GRT(GRTConfig(**{**cfg.to_dict(), "rope": False}), dtype=F64)
    off.load_state_dict(on.state_dict())
    idx = torch.randint(0, 256, (1, 6))
    with torch.no_grad():
        a, b = on(idx)[0], off(idx)[0]
    assert_close(a[:, 0], b[:, 0], dtype=F64, size=cfg.d_model, depth=87, what="position 0")
    tol = tolerance(F64, size=cfg.d_model, depth=87, scale=float(a.abs().max()))
    assert float((a[:, 1:] - b[:, 1:]).abs().max()) > CLEARLY_NONZERO * tol.atol


def test_forward_rejects_bad_input():
    m = GRT(tiny_config(n_blocks=1))
    with pytest.raises(ValueError, match="exceeds block_size"):
        m(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        m(torch.zeros(33, dtype=torch.long))
    with pytest.raises(TypeError, match="GRTConfig"):
        GRT({"d_model": 8})


# ---------------------------------------------------------------------------------------------- trace


def test_trace_matches_forward_and_reports_every_stage():
    cfg = tiny_config()
    m = GRT(cfg, dtype=F64)
    idx = torch.randint(0, 256, (2, 7))
    tr = trace_model(m, idx)
    assert_close(tr.logits, m(idx)[0], dtype=F64, size=cfg.d_model, depth=cfg.stage_counts()["total"])
    H, dh, P = cfg.n_heads, cfg.d_head, cfg.pairs
    b0 = tr.blocks[0]
    assert sum(c.n_stages for c in b0.cascades()) == cfg.stage_counts()["per_block"] == 87
    assert [c.name for c in b0.cascades()] == ["q", "k", "v", "o", "mixer", "ffn_expand", "ffn_contract"]
    assert b0.q.acts.shape == (cfg.qkvo_stages + 1, 2, 7, H, dh)
    assert b0.q.pairs(3).shape == (2, 7, H, dh // 2, 2)
    assert b0.ffn_expand.acts.shape[-1] == cfg.d_ff and b0.ffn_contract.pairs(cfg.ffn_stages).shape == (
        2, 7, 1, cfg.ffn_pairs, 2)
    # the padded FFN input: only the first d_model coordinates carry signal
    assert float(b0.ffn_expand.acts[0][..., cfg.d_model:].abs().max()) == 0.0
    # attention weights: causal rows summing to one, equal to SDPA's output when applied to V
    w = b0.attn_weights
    assert_close(w.sum(-1), torch.ones(2, H, 7, dtype=F64), dtype=F64, size=7)
    assert float(w.triu(1).abs().max()) == 0.0
    v = b0.v.acts[-1].transpose(1, 2)  # (B, H, T, dh)
    sdpa = torch.nn.functional.scaled_dot_product_attention(b0.q_rot, b0.k_rot, v, is_causal=True)
    assert_close(causal_attention_with_weights(b0.q_rot, b0.k_rot, v)[0], sdpa, dtype=F64, size=7 * dh)
    # scores = sum_p r_q r_k cos(angle gap) / sqrt(dh): the text's "cosine of its Q-K angle gap"
    gap = b0.qk_angle_gap(query_pos=5, key_pos=2)  # (B, H, P_head)
    rq = torch.linalg.vector_norm(b0.q_rot[:, :, 5].unflatten(-1, (dh // 2, 2)), dim=-1)
    rk = torch.linalg.vector_norm(b0.k_rot[:, :, 2].unflatten(-1, (dh // 2, 2)), dim=-1)
    score = (b0.q_rot[:, :, 5] * b0.k_rot[:, :, 2]).sum(-1)
    assert_close((rq * rk * torch.cos(gap)).sum(-1), score, dtype=F64, size=dh, scale=float(score.abs().max()))
    assert tr.qk_angle_gaps().shape == (cfg.n_blocks, 2, 7, H, dh // 2)
    # gates, streams and the radius spread (0 on the embedding's ring, > 0 after the first block)
    assert tr.gates().shape == (cfg.n_blocks, 3) and tuple(b0.gates) == GATE_NAMES
    spread = tr.pair_radius_spread()
    assert spread.shape == (cfg.n_blocks + 1, 2, 7)
    assert float(spread[0].max()) <= tolerance(F64, size=P, depth=2).atol and float(spread[1].min()) > 0
    assert tr.pair_radii().shape == (cfg.n_blocks + 1, 2, 7, P)
    assert torch.equal(b0.stream_in, tr.embedding) and torch.equal(tr.blocks[1].stream_in, b0.stream_out)


# ---------------------------------------------------------------------------------------- claims, CLI


def test_every_structural_claim_holds():
    """Every structural claim measured by grt_model.claims holds (the numbers the report prints)."""
    claims = run_claims(CLAIMS)
    assert [c.id for c in claims] == list(CLAIMS.checks)
    failed = [c.id for c in claims if not c.holds]
    assert not failed, f"claims that fail: {failed}"
    assert_table_shows_numbers(claims)
    with pytest.raises(ValueError, match="unknown claim"):
        run_claims(CLAIMS, only=("grt.nope",))


def test_cli_forward_and_json(tmp_path, capsys):
    from grt_model.__main__ import main

    out = tmp_path / "grt.json"
    rc = main(["--preset", "small", "--n-layers", "1", "--d-model", "32", "--d-ff", "64", "--batch-size", "1",
               "--seq-len", "8", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "87 per block" in text and "embedding ratio" in text and "forward (float32)" in text
    rec = json.loads(out.read_text())
    assert rec["stage_counts"]["per_block"] == 87 and rec["config"]["d_model"] == 32
    assert rec["embedding_ratio"]["exact"] == "17/32" and rec["forward"]["grads_finite"] is True
    assert {r["component"] for r in rec["param_table"]} >= {"embedding", "q", "mixer", "total"}


@pytest.mark.parametrize(("argv", "match"), [
    (["--d-model", "100"], "d_model must be a power of two"),
    (["--seq-len", "0"], "--seq-len must be in"),
    (["--preset", "small", "--seq-len", "129"], r"--seq-len must be in \[1, 128\]"),
    (["--set", "nope=1"], "unknown GRTConfig key"),
    (["--set", "gate_init=2"], "gate_init"),
    (["--batch-size", "0"], "--batch-size"),
    (["--device", "tpu"], "--device"),
    (["--n-blocks", "2"], "unknown flag --n-blocks"),
    (["--json", "/"], "is a directory"),
])
def test_cli_validates_flags_before_work(argv, match, capsys):
    from grt_model.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    import re

    assert re.search(match, capsys.readouterr().err)


# ---------------------------------------------------------------------------------------- claims a bug must flip


def test_butterfly_wiring():
    claim = claim_butterfly_wiring()
    assert claim.holds, claim.measured
    assert claim.details["eager_matrix"]["1"] == WIRING_EXPECTED[1] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert claim.measured["strides_64_11"] == [1, 2, 4, 8, 16, 32, 1, 2, 4, 8, 16]


def test_butterfly_wiring_fails_on_a_wrong_stride(monkeypatch):
    import grt_model.claims.model as gc

    monkeypatch.setattr(gc, "stage_stride", lambda width, stage: 1 << ((stage + 1) % (width.bit_length() - 1)))
    claim = claim_butterfly_wiring()
    assert not claim.holds and claim.measured["stages_wrong"]["to_pairs"]


def test_fast_equals_reference():
    claim = claim_fast_equals_reference()
    assert claim.holds, claim.details["errors"]
    assert {"eager_coupling_on", "eager_coupling_off"} <= set(claim.details["errors"])


def test_fast_equals_reference_fails_on_a_wrong_area_sign(monkeypatch):
    import grt_model.cascade_ops as ops

    real = ops.clifford_features
    monkeypatch.setattr(ops, "clifford_features", lambda x0, x1, *rest: real(x1, x0, *rest))  # flips the area
    claim = claim_fast_equals_reference()
    assert not claim.holds
    assert claim.details["errors"]["eager_coupling_on"]["value"] > claim.tolerance
    assert claim.details["errors"]["eager_coupling_off"]["value"] <= claim.tolerance  # no features off


def test_a_wrong_backward_is_a_verdict_not_a_traceback(monkeypatch):
    import grt_model.claims.geometry as gc

    def broken(fn, inputs, **kw):  # gradcheck on a function whose backward is wrong: must say False, not raise
        return bool(torch.autograd.gradcheck(lambda t: _WrongGrad.apply(t), (inputs[0],), raise_exception=False))

    monkeypatch.setattr(gc, "gradcheck", broken)
    claim = claim_jacobian()
    assert not claim.holds and claim.measured["gradcheck_passed"] == 0


def test_a_check_that_raises_is_a_fails_record(monkeypatch):
    def boom():
        raise RuntimeError("planted")

    monkeypatch.setitem(CLAIMS.checks, "grt.stage_counts", boom)
    (claim,) = run_claims(CLAIMS, only=("grt.stage_counts",))
    assert not claim.holds and claim.details["error"] == "RuntimeError: planted"


class _WrongGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.02  # 1% off
