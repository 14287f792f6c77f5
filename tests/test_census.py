"""gauge.census on the project's models and on Hugging Face causal LMs from small random configs (no network).

Each test states, per model, which tensors and row blocks are gauges and why, derived from the architecture's
code (lm/dense.py, grt_model/model.py, transformers' modeling_<arch>.py), never from the tool's output.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from gauge.census import census, format_census
from rmsgauge import tolerance

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never a download, even by accident
SEQ = (2, 12)  # (sequences, tokens) of the example batch


def _expect(res, expected: dict[str, list[tuple[int | None, int, int]]]) -> None:
    """Exactly these tensors carry gauge blocks, with exactly these blocks; every other tensor has none."""
    got = {t.name: sorted((b.axis if b.axis is not None else -1, b.start, b.stop) for b in t.blocks)
           for t in res.tensors if t.blocks}
    want = {n: sorted((a if a is not None else -1, s, e) for a, s, e in v) for n, v in expected.items()}
    assert got == want, format_census(res, all_tensors=True)
    for t in res.tensors:  # every verdict used the one tolerance, and the gauges sit far below it
        assert all(b.loss_change <= res.tolerance < b.direction_change for b in t.blocks)


def _heads(n: int, hd: int) -> list[tuple[int, int, int]]:
    return [(0, h * hd, (h + 1) * hd) for h in range(n)]


# ----------------------------------------------------------------------------------------------- project models
def _dense(qk: bool):
    from lm.dense import DenseConfig, DenseTransformer

    cfg = DenseConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64, block_size=16, qk_norm=qk, qk_norm_eps=1e-6)
    return DenseTransformer(cfg), cfg


def test_census_dense_qk_norm():
    # lm/dense.py: q = q_norm(q_proj(x).view(B, T, H, hd)): a per-head RMSNorm over hd reads each head's hd rows of
    # W_q (same for k).  Scaling one head's row block scales that head's q only, which its norm removes (eps=0).
    # One row alone is not: it changes the head's direction.  V, O, MLP write into the residual stream; the
    # pre-norm gains feed v as well as q, k; the tied embedding scales the logits: none of them is a gauge.
    model, cfg = _dense(True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    res = census(model, batch=tuple(torch.randint(0, 256, SEQ) for _ in range(2)))
    hd = cfg.d_model // cfg.n_heads
    _expect(res, {f"blocks.{i}.attn.{w}_proj.weight": _heads(cfg.n_heads, hd) for i in range(2) for w in "qk"})
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # the user's model is untouched
    t = next(t for t in res.tensors if t.name == "blocks.0.attn.q_proj.weight")
    assert "blocks.0.attn.q_norm" in t.reason
    # at the model's own eps = 1e-6 the gauge is approximate: measured output deviation = the exact eps law
    e = t.eps
    assert e.eps == 1e-6 and e.output_change > 0
    bound = tolerance("float64", size=hd, scale=math.sqrt(hd)).bound(0.0)  # |y_i| <= sqrt(hd) at unit gain
    assert abs(e.output_change - e.output_law) <= bound


def test_census_dense_without_qk_norm():
    # lm/dense.py with qk_norm=False: nothing normalizes a projection's output, so no tensor is a gauge.
    model, _ = _dense(False)
    res = census(model, batch=tuple(torch.randint(0, 256, SEQ) for _ in range(2)))
    _expect(res, {})


def test_census_grt():
    # grt_model/model.py: every cascade (Q/K/V/O, mixer, FFN) ends in attention (softmax, not homogeneous), the
    # residual stream or RadialGELU; PearlNorm gains feed cascades whose outputs are not normalized again; angles
    # and raw scales are parameters of rotations and of a positive map, not linear factors; the embedding's
    # magnitudes also set the tied output head.  No tensor is a gauge.
    from grt_model import GRT
    from grt_model.config import GRTConfig

    cfg = GRTConfig(vocab_size=256, block_size=16, d_model=32, n_heads=2, n_blocks=1, d_ff=64, qkvo_stages=3,
                    mixer_stages=1, ffn_stages=3)
    x = torch.randint(0, 256, SEQ)
    _expect(census(GRT(cfg), batch=(x, x)), {})


def test_census_closure_matches_batch_and_refuses_powers_of_two():
    model, _ = _dense(True)
    x, y = (torch.randint(0, 256, SEQ) for _ in range(2))
    a = census(model, batch=(x, y), own_eps=False)
    b = census(model, lambda m: m(x, y)[1], own_eps=False)
    assert a.blocks_of("blocks.1.attn.k_proj.weight") == b.blocks_of("blocks.1.attn.k_proj.weight")
    with pytest.raises(ValueError, match="scales"):
        census(model, batch=(x, y), scales=(0.5, 3.0))
    with pytest.raises(ValueError, match="exactly one"):
        census(model)


# ----------------------------------------------------------------------------------------------- Hugging Face
COMMON = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def _hf(cfg):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(1, cfg.vocab_size, SEQ)  # no padding token (id 0 in Gemma: a zero embedding row)
    return census(model, batch={"input_ids": ids, "labels": ids})


def test_census_hf_llama_gqa():
    # modeling_llama.py: pre-norm only (input_layernorm -> q/k/v; post_attention_layernorm -> MLP); q and k enter
    # rotary embedding and softmax unnormalized; o_proj and down_proj write the residual stream.  No gauge, even
    # with grouped-query attention (2 key/value heads for 4 query heads).
    tf = pytest.importorskip("transformers")
    _expect(_hf(tf.LlamaConfig(**COMMON)), {})


def test_census_hf_qwen3_per_head_qk_norm_gqa():
    # modeling_qwen3.py: q_norm(q_proj(x).view(..., -1, head_dim)), RMSNorm over head_dim ("only on the head
    # dim"): each of the 4 query heads' 8-row blocks of q_proj is a gauge, and each of the 2 key/value heads'
    # 8-row blocks of k_proj (GQA: k_proj has 16 rows).  v_proj, o_proj, MLP: pre-norm residual writes, none.
    tf = pytest.importorskip("transformers")
    res = _hf(tf.Qwen3Config(head_dim=8, **COMMON))
    _expect(res, {f"model.layers.{i}.self_attn.{w}_proj.weight": _heads(n, 8)
                  for i in range(2) for w, n in (("q", 4), ("k", 2))})
    e = next(t for t in res.tensors if t.name == "model.layers.0.self_attn.q_proj.weight").eps
    assert e.eps == tf.Qwen3Config().rms_norm_eps  # the model's own eps, beside the law
    assert abs(e.output_change - e.output_law) <= tolerance("float64", size=8, scale=math.sqrt(8)).bound(0.0)


def test_census_hf_olmo2_full_width_qk_norm_and_post_norms():
    # modeling_olmo2.py: q_norm = RMSNorm(num_heads * head_dim) over the whole q_proj output (k likewise over
    # num_kv_heads * head_dim): q_proj and k_proj are gauges as whole tensors only (one head's block alone changes
    # the ratio between heads, which the full-width norm sees).  OLMo 2 is post-norm: x + post_attention_layernorm(
    # attn(x)), x + post_feedforward_layernorm(mlp(x)); the attention output is linear in v_proj and in o_proj,
    # the MLP output down(silu(gate) * up) linear in up_proj and down_proj: those four are whole-tensor gauges.
    # gate_proj passes SiLU (not homogeneous): not a gauge.
    tf = pytest.importorskip("transformers")
    res = _hf(tf.Olmo2Config(**COMMON))
    whole = [(None, 0, 0)]
    exp = {}
    for i in range(2):
        for w in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.up_proj",
                  "mlp.down_proj"):
            exp[f"model.layers.{i}.{w}.weight"] = whole
    got = {t.name: [(None, 0, 0)] for t in res.tensors if t.blocks and t.blocks[0].axis is None}
    assert got == exp, format_census(res, all_tensors=True)
    assert all(len(t.blocks) == 1 for t in res.tensors if t.blocks)  # no finer blocks anywhere
    # the whole-tensor gauge of q_proj is exact at eps = 0 and approximate at the model's eps = 1e-5
    q = next(t for t in res.tensors if t.name == "model.layers.0.self_attn.q_proj.weight")
    assert q.loss_change <= res.tolerance < q.eps.loss_change


def test_census_hf_gemma3_sandwich_norms():
    # modeling_gemma3.py: per-head q_norm/k_norm over head_dim (Gemma3RMSNorm, gain 1 + w) -> per-head row blocks
    # of q_proj (4 x 8) and k_proj (2 x 8); plus post_attention_layernorm and post_feedforward_layernorm on the
    # sublayer outputs -> v_proj, o_proj, up_proj, down_proj whole-tensor gauges (gate_proj: GELU, not a gauge).
    tf = pytest.importorskip("transformers")
    cfg = tf.Gemma3TextConfig(head_dim=8, **COMMON)
    res = _hf(cfg)
    exp = {}
    for i in range(2):
        exp[f"model.layers.{i}.self_attn.q_proj.weight"] = _heads(4, 8)
        exp[f"model.layers.{i}.self_attn.k_proj.weight"] = _heads(2, 8)
        for w in ("self_attn.v_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"):
            exp[f"model.layers.{i}.{w}.weight"] = [(None, 0, 0)]
    got = {}
    for t in res.tensors:
        if t.blocks and t.blocks[0].axis is None:
            got[t.name] = [(None, 0, 0)]
        elif t.blocks:
            got[t.name] = [(b.axis, b.start, b.stop) for b in t.blocks]
    assert got == exp, format_census(res, all_tensors=True)


def test_census_hf_gpt2_layernorm():
    # modeling_gpt2.py: pre-LayerNorm blocks; c_attn's q/k columns enter softmax unnormalized, c_proj and mlp.c_proj
    # write the residual stream; wte is tied to the head.  No gauge.  (Zero-initialized biases are moved to a
    # random point first: scaling zero would prove nothing.)
    tf = pytest.importorskip("transformers")
    res = _hf(tf.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    _expect(res, {})
    assert "transformer.h.0.attn.c_attn.bias" in res.randomized


def test_census_cli_model_and_hf(tmp_path, capsys):
    from gauge.census.cli import main

    out = tmp_path / "c.json"
    assert main(["--model", "gauge.census.examples:dense_qknorm", "--json", str(out)]) == 0
    assert "rows: 4 blocks of 16" in capsys.readouterr().out and out.is_file()
    assert main(["--model", "no_such_module:f"]) == 2
    assert "--model" in capsys.readouterr().err
    pytest.importorskip("transformers")
    assert main(["--hf", "Qwen3ForCausalLM", "--set", "num_hidden_layers=1"]) == 0
    assert "Qwen3RMSNorm over 16" in capsys.readouterr().out
    assert main(["--hf", "NoSuchForCausalLM"]) == 2
