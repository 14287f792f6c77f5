"""gauge.census on the models researchers bring: every model it cannot analyse gets one line saying why (never a
traceback, never a silent "none"); dropout, torch.compile, modes, random ops, the eps stand-in and the search's
group checks; the command line (--mode, progress, Phi-3)."""

from __future__ import annotations

import os
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from gauge.census import CensusError, census, format_census
from gauge.census.engine import EXACT_VAR_MIN, TINY_EPS, Engine, Float64Everywhere
from gauge.census.search import Member, confirm, gradient_screen, plan
from rmsgauge import tolerance

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never a download, even by accident


class RMSHead(nn.Module):
    """Linear 4->6 (no bias) -> [dropout] -> RMSNorm(6) -> tanh -> linear 6->3 -> cross-entropy: the linear weight
    is a whole-tensor gauge (the norm reads all six entries), nothing else is."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6, bias=False)
        self.drop = nn.Dropout(dropout)
        self.norm = nn.RMSNorm(6, eps=1e-6)
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.drop(self.fc(x))))
        return F.cross_entropy(F.dropout(self.head(h), 0.3, self.training), y)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    return torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)


def _verdicts(res) -> dict[str, tuple[str, str]]:
    return {t.name: (t.status, t.partition) for t in res.tensors}


# ------------------------------------------------------------------------------------------------ one line each
class Buffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.scale).sum()


class Fails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("shape mismatch\nsecond line")


class NotFinite(nn.Module):
    """A constant set normalized at eps = 0: 0/0."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3, 3))
        self.norm = nn.LayerNorm(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm((x @ self.w.T).sum(-1, keepdim=True).expand(-1, 3)).sum()


class OwnRandom(nn.Module):
    """Noise from the model's own generator: not re-seeded by the census, so two evaluations differ."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 3))
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.w.T).pow(2).mean() + torch.rand((), generator=self.gen, dtype=x.dtype)


@pytest.mark.parametrize(("model", "pattern"), [
    (nn.ReLU(), r"ReLU has no parameters \(0 buffers\): nothing to scale"),
    (Buffers(), r"Buffers has no parameters \(1 buffer\)"),
    (Fails(), r"the loss failed on the float64 copy \(RuntimeError: shape mismatch second line\)"),
    (NotFinite(), r"the loss is nan .* needs a finite loss"),
    (OwnRandom(), r"the loss is random: two evaluations at the same weights differ"),
])
def test_models_it_cannot_analyse_get_one_line(model, pattern):
    with pytest.raises(CensusError, match=pattern) as err:
        census(model, lambda m: m(torch.randn(4, 3, dtype=torch.float64)))
    assert "\n" not in str(err.value)


def test_cli_one_line_for_every_failure(tmp_path, monkeypatch, capsys):
    from gauge.census.cli import main

    (tmp_path / "edge_factories.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn
        def empty():
            return nn.ReLU(), torch.randn(2, 3)
        def broken():
            raise KeyError("no weights here")
        def crashes():
            return nn.Linear(3, 2), (torch.randn(2, 4),)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec, want in (("edge_factories:empty", "ReLU has no parameters"),
                       ("edge_factories:broken", "the factory failed (KeyError"),
                       ("edge_factories:crashes", "the loss failed on the float64 copy (RuntimeError")):
        assert main(["--model", spec, "--quiet"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and want in err, err


def test_a_model_whose_loss_reads_no_parameter_says_so():
    """A loss that ignores every parameter: each tensor scales and moves without changing it, so each is "unused",
    and the table says so in words rather than listing nothing."""
    model = nn.Linear(3, 2)
    res = census(model, lambda m: torch.ones((), dtype=torch.float64) + 0.0 * m.weight.sum().detach())
    assert {t.status for t in res.tensors} == {"unused"}
    assert "the loss does not read any parameter" in format_census(res)


# ------------------------------------------------------------------------------------------------ modes, dropout
def test_mode_defaults_to_the_models_flag_and_dropout_does_not_randomize():
    """Dropout in training mode (a module and a functional call): off on the copy, so the census is deterministic
    and finds what it finds without dropout; the global RNG is untouched; ``mode`` overrides the model's flag."""
    torch.manual_seed(0)
    model = RMSHead(dropout=0.5).train()
    rng = torch.get_rng_state()
    a = census(model, batch=_batch())
    assert torch.equal(torch.get_rng_state(), rng) and model.training
    assert a.mode == "train" and any("dropout off" in n for n in a.notes)
    assert _verdicts(a)["fc.weight"] == ("gauge", "whole tensor")
    b = census(model, batch=_batch(), mode="eval")
    assert b.mode == "eval" and _verdicts(a) == _verdicts(b) and a.loss == b.loss
    with pytest.raises(ValueError, match="mode must be None"):
        census(model, batch=_batch(), mode="training")


def test_global_random_ops_draw_the_same_values_at_every_candidate():
    """A random op on torch's global generator (a stochastic-depth style mask): the census re-seeds before every
    evaluation, so the mask is fixed and the gauge of the layer under it is found exactly."""

    def loss(m):
        x, y = (t.to(torch.float64) if t.is_floating_point() else t for t in _batch())
        keep = (torch.rand(x.shape[0], 1, dtype=x.dtype) > 0.3).to(x.dtype)
        return F.cross_entropy(m.head(torch.tanh(m.norm(m.fc(x))) * keep), y)

    torch.manual_seed(0)
    res = census(RMSHead(), loss)
    assert _verdicts(res)["fc.weight"] == ("gauge", "whole tensor")


def test_torch_compiled_model_keeps_its_names():
    """torch.compile wraps the model (names gain '_orig_mod.'): the census runs the original module eagerly under the
    same names, with the same verdicts as the uncompiled model."""
    torch.manual_seed(0)
    model = RMSHead()
    plain = census(model, batch=_batch())
    with warnings.catch_warnings():  # importing torch._dynamo touches deprecated torch.jit helpers
        warnings.simplefilter("ignore", DeprecationWarning)
        wrapped = torch.compile(model)
    compiled = census(wrapped, batch=_batch())
    assert {f"_orig_mod.{k}": v for k, v in _verdicts(plain).items()} == _verdicts(compiled)
    assert compiled.model == "RMSHead (torch.compile'd)" and any("torch.compile" in n for n in compiled.notes)


# ------------------------------------------------------------------------------------------------ eps stand-in
@given(st.floats(min_value=EXACT_VAR_MIN, max_value=1e300, allow_nan=False, allow_infinity=False))
def test_the_eps_stand_in_is_absorbed_bit_for_bit(v):
    """BatchNorm's kernel adds eps once, to the batch variance: for every variance >= 2^-968 the stand-in 2^-1022 is
    below half an ulp, so var + eps rounds to var exactly (the arithmetic of eps = 0)."""
    t = torch.tensor(v, dtype=torch.float64)
    assert torch.equal(t + TINY_EPS, t)


def test_the_stand_in_threshold_is_tight():
    v = torch.tensor(2.0 ** -969 * (1 + 2.0 ** -52), dtype=torch.float64)  # odd last bit, half an ulp = 2^-1022
    assert not torch.equal(v + TINY_EPS, v)
    with Float64Everywhere():  # torch itself refuses eps = 0 in training; the mode passes the stand-in
        x = torch.randn(4, 3, dtype=torch.float64)
        y = F.batch_norm(x, None, None, training=True, eps=0.0)
    assert torch.allclose(y, (x - x.mean(0)) / x.var(0, unbiased=False).sqrt(), rtol=tolerance("float64").rtol,
                          atol=tolerance("float64", size=4).atol)


# ------------------------------------------------------------------------------------------------ the search
def test_a_group_holding_a_non_gauge_is_bisected():
    """The finite law is checked on many blocks at once; a set that fails is halved until each block stands alone.
    RMSHead: fc's whole tensor is a gauge, its single rows are not; checking the whole fc together with one row of
    the head (not a gauge) must keep fc and drop the head's row."""
    torch.manual_seed(0)
    x, y = _batch()
    eng = Engine(RMSHead(), lambda m: m(x.double(), y), seed=0, mode=None, inplace=False)
    eng.set_eps(zero=True)
    base, targets = gradient_screen(eng)
    bound = tolerance("float64", size=30, depth=6, scale=abs(base)).bound(abs(base))
    cs = torch.tensor([0.37, 0.81, 1.7, 6.3], dtype=torch.float64)
    members = [Member(targets["fc.weight"], None, 0, 1), Member(targets["head.weight"], 0, 0, 1)]
    kept = confirm(eng, members, cs, base, bound)
    assert [m.tgt.names for m, _ in kept] == [("fc.weight",)]
    assert plan(targets["fc.weight"], tolerance("float64").rtol, bound) == {}  # no single row passes the screen


def test_progress_lines_count_and_estimate(capsys):
    lines: list[str] = []
    torch.manual_seed(0)
    census(RMSHead(), batch=_batch(), progress=lines.append)
    assert any(ln.startswith("census: real scalings: block 1 of 1") and "| ETA " in ln for ln in lines), lines
    assert any(ln.startswith("census: eps report: tensor 1 of 1 (fc.weight)") for ln in lines), lines
    assert all("| elapsed " in ln for ln in lines) and lines[-1].startswith("census: done")


def test_screen_decides_without_real_scalings():
    """Tensors whose Euler derivative is far from zero are decided by the one backward: no loss evaluation is spent
    on them (their max|dL| reads "screen")."""
    torch.manual_seed(0)
    res = census(RMSHead(), batch=_batch())
    decided = {t.name for t in res.tensors if t.loss_change is None}
    assert decided == {"norm.weight", "head.weight", "head.bias"}
    assert "screen" in format_census(res, all_tensors=True)


# ------------------------------------------------------------------------------------------------ command line
def test_cli_conv_batchnorm_training_and_eval(capsys):
    from gauge.census.cli import main

    assert main(["--model", "gauge.census.examples:conv_bn"]) == 0
    cap = capsys.readouterr()
    assert "conv.weight" in cap.out and "rows: 6 blocks of 1" in cap.out and "unused" in cap.out
    assert "BatchNorm2d over 144 values: each channel over 4 samples × 36 positions" in cap.out
    assert "census: real scalings: block" in cap.err and "| ETA" in cap.err
    assert main(["--model", "gauge.census.examples:conv_bn", "--mode", "eval", "--quiet"]) == 0
    cap = capsys.readouterr()
    assert "(no gauge tensors or blocks" in cap.out and "running statistics" in cap.out and cap.err == ""


def test_cli_phi3_and_out_of_range_pad_ids(tmp_path, capsys):
    """Phi-3's default pad token id (32000) lies outside the tiny default vocabulary: dropped for a class name (the
    census batch never uses it), a one-line usage error naming the field for the user's own config folder."""
    tf = pytest.importorskip("transformers")
    from gauge.census.cli import main

    assert main(["--hf", "Phi3ForCausalLM", "--set", "num_hidden_layers=1", "--quiet"]) == 0
    out = capsys.readouterr()
    assert "gauge census of Phi3ForCausalLM" in out.out and "Traceback" not in out.err
    cfg = tf.Phi3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, pad_token_id=63, bos_token_id=1,
                        eos_token_id=2)
    cfg.save_pretrained(tmp_path)
    assert main(["--hf", str(tmp_path), "--set", "pad_token_id=32000", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pad_token_id = 32000 lies outside the vocabulary [0, 64)" in err
