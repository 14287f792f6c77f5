"""The project's sampler (lm/sample.py): its KV cache gives the uncached sampler's bytes, inside the context window
and past it; progress on stderr; every default in --help.

Tiny random models (d 32, 2 layers, context 16) keep this fast; the dense one is initialized wide (std 0.3) so that
its bytes depend on every logit, rotary position included, as a trained model's do (at the default 0.02 its logits
are nearly uniform and position barely moves a byte).  Speed is measured by ``python -m lm.bench --case sample``.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from grt_model import GRT, GRTConfig
from lm.checkpoint import save_checkpoint
from lm.dense import DenseConfig, DenseTransformer
from lm.sample import KVCache, cached_forward, generate
from rmsgauge import assert_close, seed_everything

BLOCK = 16
TINY = {
    "dense": lambda: DenseTransformer(DenseConfig(d_model=32, n_heads=2, n_layers=2, d_ff=64, block_size=BLOCK,
                                                  init_std=0.3)),
    "grt": lambda: GRT(GRTConfig.small(d_model=32, n_heads=2, n_blocks=2, d_ff=64, block_size=BLOCK, qkvo_stages=3,
                                       ffn_stages=3)),
}
SETTINGS = [{"temperature": 0.0, "top_k": 0}, {"temperature": 1.0, "top_k": 0}, {"temperature": 0.8, "top_k": 5}]


@pytest.fixture(scope="module", params=["dense", "grt"])
def model(request):
    seed_everything(3)
    return TINY[request.param]().eval()


@pytest.mark.parametrize("prompt_len", [1, 5, BLOCK, BLOCK + 3])  # short, mid, a full window, past the window
@pytest.mark.parametrize("setting", SETTINGS, ids=["greedy", "temperature", "top-k"])
def test_cached_sampler_gives_the_uncached_bytes(model, setting, prompt_len):
    """Same seed, same bytes, with the sequence growing from inside the window to twice past it (the window slides
    and every rotary position shifts: the cache must not be reused there)."""
    prompt = torch.randint(0, 256, (2, prompt_len), generator=torch.Generator().manual_seed(prompt_len))
    n = 2 * BLOCK
    runs = [generate(model, prompt, n, generator=torch.Generator().manual_seed(11), kv_cache=cached, **setting)
            for cached in (True, False)]
    assert runs[0].shape == (2, prompt_len + n)
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0][:, :prompt_len], prompt)


def test_cached_logits_are_the_models_own(model):
    """Fed whole, the cached forward is the model's forward bit for bit; fed one token at a time (each at its own
    rotary position), it is the same function to float32 tolerance, at every position of the window."""
    x = torch.randint(0, 256, (3, BLOCK), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, _ = model(x)
        whole = KVCache(len(model.blocks))
        assert torch.equal(cached_forward(model, x, whole), ref)
        assert whole.get_seq_length() == BLOCK
        cache, steps = KVCache(len(model.blocks)), []
        for t in range(BLOCK):
            steps.append(cached_forward(model, x[:, t:t + 1], cache))
        # and in uneven pieces: a piece after a cached prefix sees its own earlier tokens causally
        pieces, cache = [], KVCache(len(model.blocks))
        for a, b in ((0, 3), (3, 4), (4, 11), (11, BLOCK)):
            pieces.append(cached_forward(model, x[:, a:b], cache))
    depth = len(model.blocks)
    assert_close(torch.cat(steps, dim=1), ref, dtype=torch.float32, size=32, depth=depth, what="one token a step")
    assert_close(torch.cat(pieces, dim=1), ref, dtype=torch.float32, size=32, depth=depth, what="uneven pieces")


@pytest.mark.parametrize("setting", SETTINGS[:2], ids=["greedy", "temperature"])
def test_a_cache_at_the_wrong_positions_changes_the_bytes(model, setting, monkeypatch):
    """The equality above can fail: a cache whose new tokens all sit at rotary position 0 (the positions forgotten)
    gives other bytes."""
    import lm.sample as sample

    real = sample.cached_forward
    prompt = torch.randint(0, 256, (4, 3), generator=torch.Generator().manual_seed(1))
    right = generate(model, prompt, 2 * BLOCK, generator=torch.Generator().manual_seed(11), **setting)
    monkeypatch.setattr(sample, "cached_forward", lambda m, idx, cache, **kw: real(m, idx, cache, positions=0))
    wrong = generate(model, prompt, 2 * BLOCK, generator=torch.Generator().manual_seed(11), **setting)
    assert not torch.equal(wrong, right)


def _ckpt(tmp_path, model) -> str:
    kind = "grt" if isinstance(model, GRT) else "dense"
    return str(save_checkpoint(tmp_path / "ckpt.pt", model_kind=kind, model=model, optimizer=None, train_config={},
                               step=0, tokens_seen=0))


def test_progress_on_stderr_and_quiet(model, tmp_path, capsysbinary):
    from lm.sample import main

    ckpt = _ckpt(tmp_path, model)
    assert main(["--checkpoint", ckpt, "--tokens", "7", "--seed", "2"]) == 0
    out, err = capsysbinary.readouterr()  # stdout: the raw bytes, not always UTF-8
    assert b"[sample] 7 bytes from" in err and b"[sample] 7 bytes in" in err and b"bytes/s" in err
    assert main(["--checkpoint", ckpt, "--tokens", "7", "--seed", "2", "--quiet"]) == 0
    quiet_out, quiet_err = capsysbinary.readouterr()
    assert quiet_err == b"" and quiet_out == out and len(out) == 1 + 7 + 1  # prompt, bytes, newline


def _sample_parsers() -> dict[str, argparse.ArgumentParser]:
    from lm.sample import build_parser as sample_parser
    from lm.train import build_parser as train_parser

    train = train_parser()
    sub = next(a for a in train._actions if isinstance(a, argparse._SubParsersAction))
    return {"python -m lm.sample": sample_parser(), "python -m lm.train sample": sub.choices["sample"]}


@pytest.mark.parametrize("prog", ["python -m lm.sample", "python -m lm.train sample"])
def test_help_shows_every_default(prog):
    parser = _sample_parsers()[prog]
    text = " ".join(parser.format_help().split())  # the help as read, its line wrapping undone
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or action.dest in ("help", "debug"):
            continue
        if action.dest in ("checkpoint", "reference"):  # one of the two is required: neither has a default
            continue
        assert "default" in (action.help or ""), (prog, action.option_strings)
        if action.default not in (None, False):
            assert f"(default: {action.default!r})" in text or f"(default: {action.default})" in text, action.dest


def test_bench_sample_case_reports_cached_and_uncached(tmp_path, capsys):
    """``python -m lm.bench --case sample`` (no timing is judged here): the cached and uncached rows of both models,
    their bytes equal, and the claim record of the cache's speedup."""
    import json

    from lm.bench import TARGETS
    from lm.bench.__main__ import main

    out = tmp_path / "bench.json"
    assert main(["--case", "sample", "--sample-bytes", "4", "--repeats", "1", "--threads", "1",
                 "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    rows = {(r["case"], r["impl"]): r for r in rec["rows"]}
    assert set(rows) == {(f"sample-{k}", i) for k in ("grt", "dense") for i in ("cached", "uncached")}
    assert all(r["n"] == 4 for r in rows.values())
    assert all(rows[f"sample-{k}", "uncached"]["note"].endswith("bytes = cached") for k in ("grt", "dense"))
    (claim,) = rec["claims"]
    target, sense, _ = TARGETS["bench.sample_cache_speedup"]
    assert claim["id"] == "bench.sample_cache_speedup" and claim["stated"] == target and sense == "ge"
    assert claim["holds"] == (claim["measured"] >= target)
    assert "sample_cache_speedup" in capsys.readouterr().out
