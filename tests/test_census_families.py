"""gauge.census on one small model per normalization family: verdict, partition and reason, derived by hand.

Each test's docstring derives the gauges from the model's code (never from the tool's output).  Notation: a weight
block W_I is a gauge when L(c W_I) = L(W) for every c > 0; a normalization divides a set S of values by a statistic
of S itself, so scaling all of S by c changes nothing (eps = 0), scaling part of S changes its shape.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gauge.census import census, format_census
from gauge.census.examples import conv_bn, conv_bn_eval
from rmsgauge import tolerance

N, D_IN, WIDTH, CLASSES = 5, 4, 6, 3  # samples, input features, normalized width, classes


class Head(nn.Module):
    """``body`` -> tanh -> mean over positions (images) -> linear -> cross-entropy.  The tanh comes before the
    pooling: the mean of a normalized channel is its bias alone, which would leave the weight unused."""

    def __init__(self, body: nn.Module, width: int) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        if h.dim() > 2:
            h = h.mean(dim=tuple(range(2, h.dim())))
        return F.cross_entropy(self.head(h), y)


def _vec_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, D_IN, generator=g), torch.randint(0, CLASSES, (N,), generator=g)


def _img_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return torch.randn(4, 3, 6, 6, generator=g), torch.randint(0, CLASSES, (4,), generator=g)


def _row(res, name: str):
    return next(t for t in res.tensors if t.name == name)


def _check(res, expected: dict[str, tuple[str, str, str]]) -> None:
    """``name -> (verdict, partition, reason fragment)`` for the listed tensors; every other tensor: not a gauge.
    Every block sits at or below the one tolerance and is read by the batch above it."""
    table = format_census(res, all_tensors=True)
    for t in res.tensors:
        verdict, part, why = expected.get(t.name, ("not a gauge", "", ""))
        assert t.status == verdict, (t.name, table)
        assert (t.partition or t.joint.split(": ", 1)[-1]) == part, (t.name, table)
        assert why in t.reason, (t.name, table)
        assert all(b.loss_change <= res.tolerance < b.direction_change for b in t.blocks), table


# ------------------------------------------------------------------------------------------------ RMSNorm
def test_rmsnorm_reads_the_whole_projection():
    """z = W x (W: 6x4, no bias), y = RMSNorm_6(z) = z / sqrt(mean(z^2)) per sample.  W -> cW scales z by c: y is
    unchanged, so W is a gauge.  One row alone (W_r -> c W_r) changes z_r against the other five entries of the same
    normalized set: not a gauge, so the partition is the whole tensor.  The norm's gain and the head see their own
    scale in the logits: not gauges.  At the model's eps = 1e-6 the output deviation is the exact eps law."""
    torch.manual_seed(0)
    model = Head(nn.Sequential(nn.Linear(D_IN, WIDTH, bias=False), nn.RMSNorm(WIDTH, eps=1e-6)), WIDTH)
    res = census(model, batch=_vec_batch())
    _check(res, {"body.0.weight": ("gauge", "whole tensor", "body.1 (RMSNorm over 6 values: the last dim, eps=1e-06)")})
    e = _row(res, "body.0.weight").eps
    assert e.eps == 1e-6 and e.output_change > 0
    assert abs(e.output_change - e.output_law) <= tolerance("float64", size=WIDTH, scale=math.sqrt(WIDTH)).bound(0.0)


# ------------------------------------------------------------------------------------------------ LayerNorm
@pytest.mark.parametrize("ln_bias", [True, False])
def test_layernorm_with_and_without_its_bias(ln_bias):
    """z = W x (no bias before the norm), y = gamma * (z - mean z) / std z (+ beta).  Scaling W by c scales z, its
    mean and its std by c: y unchanged, whatever the norm's own beta (present or not): W is a whole-tensor gauge
    (one row alone changes the set's shape).  The reason names LayerNorm over 6 values, centred."""
    torch.manual_seed(0)
    model = Head(nn.Sequential(nn.Linear(D_IN, WIDTH, bias=False), nn.LayerNorm(WIDTH, bias=ln_bias)), WIDTH)
    res = census(model, batch=_vec_batch())
    why = "body.1 (LayerNorm over 6 values: the last dim, centred" + ("" if ln_bias else ", no bias")
    _check(res, {"body.0.weight": ("gauge", "whole tensor", why)})


def test_layernorm_after_a_biased_layer_is_a_joint_gauge():
    """z = W x + b, then LayerNorm over the 6 entries.  W -> cW gives c W x + b, whose centred part c (Wx - mean)
    + (b - mean b) is not proportional to the old one (b is not constant across the 6 entries): W alone is no
    gauge, nor is b alone.  Scaling both, (cW, cb), scales z by c: a gauge of the pair, reported as "joint gauge"
    on both tensors, naming the other, with the reason saying the weight alone is not one."""
    torch.manual_seed(0)
    model = Head(nn.Sequential(nn.Linear(D_IN, WIDTH), nn.LayerNorm(WIDTH)), WIDTH)
    res = census(model, batch=_vec_batch())
    _check(res, {"body.0.weight": ("joint gauge", "whole tensor", "alone not a gauge"),
                 "body.0.bias": ("joint gauge", "whole tensor", "LayerNorm over 6 values")})
    assert _row(res, "body.0.weight").joint == "with body.0.bias: whole tensor"
    assert _row(res, "body.0.bias").joint == "with body.0.weight: whole tensor"


# ------------------------------------------------------------------------------------------------ BatchNorm
def test_batchnorm1d_training_mode_rows_and_unused_bias():
    """Training mode: BatchNorm1d normalizes each channel r over the batch, (z_r - mean_batch z_r) / std_batch z_r,
    with z_r = W_r x + b_r.  W_r -> c W_r scales z_r - mean z_r = W_r (x - mean x) and std z_r by c: each row is
    its own gauge ("rows: 6 blocks of 1"), hence the whole W too; b_r cancels in z_r - mean z_r: the bias is
    unused.  The reason: each channel over the 5 samples (van Laarhoven 2017; Hoffer et al. 2018)."""
    torch.manual_seed(0)
    model = Head(nn.Sequential(nn.Linear(D_IN, WIDTH), nn.BatchNorm1d(WIDTH)), WIDTH).train()
    res = census(model, batch=_vec_batch())
    why = "body.1 (BatchNorm1d over 5 values: each channel over 5 samples, training mode: batch statistics"
    _check(res, {"body.0.weight": ("gauge", "rows: 6 blocks of 1", why), "body.0.bias": ("unused", "", why)})
    assert res.mode == "train"


def test_batchnorm1d_eval_mode_makes_no_gauge():
    """Eval mode: BatchNorm1d computes (z - running_mean) / sqrt(running_var + eps), an affine map of z with
    coefficients that do not move with W: W -> cW changes the output.  No gauge; the reason says why."""
    torch.manual_seed(0)
    model = Head(nn.Sequential(nn.Linear(D_IN, WIDTH), nn.BatchNorm1d(WIDTH)), WIDTH).eval()
    res = census(model, batch=_vec_batch())
    why = "BatchNorm1d in eval mode: normalizes by its running statistics"
    _check(res, {"body.0.weight": ("not a gauge", "", why), "body.0.bias": ("not a gauge", "", why)})
    assert res.mode == "eval"
    assert _row(res, "body.0.weight").loss_change is None  # the screen decided it: no real scaling was spent


def test_batchnorm2d_training_mode_filters_and_the_eps_law():
    """gauge.census.examples.conv_bn (its docstring derives it): conv 3->6 with bias -> BatchNorm2d in training mode.
    Each output filter W_c is its own gauge ("rows: 6 blocks of 1"), the conv bias is unused, BatchNorm's gain and
    bias and the head are not gauges; the norm reads each channel over 4 samples x 36 positions = 144 values.  torch
    refuses eps = 0 in training mode: the census runs it at 2^-1022 (bit-identical, noted), and the loss change of
    every filter stays within round-off.  At the model's eps = 1e-5 the measured output deviation of the first
    filter's channel equals the exact law |r(c) - 1| |y - beta| (|y - beta| <= sqrt(144) at unit gain)."""
    model, batch = conv_bn()
    res = census(model, batch=batch)
    why = "bn (BatchNorm2d over 144 values: each channel over 4 samples × 36 positions, training mode"
    _check(res, {"conv.weight": ("gauge", "rows: 6 blocks of 1", why), "conv.bias": ("unused", "", why)})
    assert any("refuses eps = 0" in n for n in res.notes)
    e = _row(res, "conv.weight").eps
    assert e.eps == 1e-5 and abs(e.output_change - e.output_law) <= tolerance("float64", size=144,
                                                                                 scale=12.0).bound(0.0)
    eval_res = census(*conv_bn_eval()[:1], batch=batch)
    _check(eval_res, {"conv.weight": ("not a gauge", "", "running statistics"),
                      "conv.bias": ("not a gauge", "", "running statistics")})


def test_a_loss_that_switches_to_training_mode_runs():
    """A loss closure that calls .train() itself (the BatchNorm then refuses eps = 0 in torch): the census still runs
    and finds the per-filter gauges of training mode."""
    model, (x, y) = conv_bn_eval()
    res = census(model, lambda m: m.train()(x.double(), y))
    assert _row(res, "conv.weight").partition == "rows: 6 blocks of 1"
    assert not model.training  # the user's model keeps its mode


# ------------------------------------------------------------------------------------------------ GroupNorm
def test_groupnorm_per_group():
    """conv 3->6 (no bias) -> GroupNorm(3 groups, 6 channels): each sample's group of 2 channels x 36 positions is
    one normalized set.  Scaling the 2 filters of a group scales that set: a gauge ("rows: 3 blocks of 2"); one
    filter alone changes the set's shape.  The reason names 72 values: 2 channels x 36 positions per group."""
    torch.manual_seed(0)
    model = Head(nn.Sequential(nn.Conv2d(3, WIDTH, 3, padding=1, bias=False), nn.GroupNorm(3, WIDTH)), WIDTH)
    res = census(model, batch=_img_batch())
    why = "body.1 (GroupNorm over 72 values: 2 channels × 36 positions per group (3 groups per sample)"
    _check(res, {"body.0.weight": ("gauge", "rows: 3 blocks of 2", why)})


def test_groupnorm_one_channel_per_group_gives_blocks_of_one():
    """GroupNorm(6 groups, 6 channels): every channel is its own group, so every filter is its own gauge: "rows: 6
    blocks of 1" (a search that skipped blocks of size 1 would read "3 blocks of 2"); the conv bias is constant over
    each set (one channel), removed by the centring: unused."""
    torch.manual_seed(0)
    model = Head(nn.Sequential(nn.Conv2d(3, WIDTH, 3, padding=1), nn.GroupNorm(WIDTH, WIDTH)), WIDTH)
    res = census(model, batch=_img_batch())
    why = "GroupNorm over 36 values: 1 channel × 36 positions per group"
    _check(res, {"body.0.weight": ("gauge", "rows: 6 blocks of 1", why), "body.0.bias": ("unused", "", why)})


def test_groupnorm_after_a_biased_conv_is_a_joint_gauge_per_group():
    """conv 3->6 with bias -> GroupNorm(3, 6): within a group the centring removes the group's mean bias, but the
    two channels' biases differ, so scaling a group's filters alone changes the set's shape; scaling the group's
    filters and its two bias entries together scales the set: joint gauges, rows in 3 blocks of 2."""
    torch.manual_seed(0)
    model = Head(nn.Sequential(nn.Conv2d(3, WIDTH, 3, padding=1), nn.GroupNorm(3, WIDTH)), WIDTH)
    res = census(model, batch=_img_batch())
    _check(res, {"body.0.weight": ("joint gauge", "rows: 3 blocks of 2", "alone not a gauge"),
                 "body.0.bias": ("joint gauge", "rows: 3 blocks of 2", "GroupNorm over 72 values")})
    assert [(b.start, b.stop) for b in _row(res, "body.0.weight").joint_blocks] == [(0, 2), (2, 4), (4, 6)]


# ------------------------------------------------------------------------------------------------ InstanceNorm
def test_instancenorm_per_filter():
    """conv 3->4 with bias -> InstanceNorm2d(4) (no affine, batch statistics in either mode): each sample's channel
    over its 36 positions is a set, so each filter is its own gauge ("rows: 4 blocks of 1") and the bias, constant
    over every set, is unused."""
    torch.manual_seed(0)
    model = Head(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.InstanceNorm2d(4)), 4)
    res = census(model, batch=_img_batch())
    why = "InstanceNorm2d over 36 values: each sample's channel over its 36 positions"
    _check(res, {"body.0.weight": ("gauge", "rows: 4 blocks of 1", why), "body.0.bias": ("unused", "", why)})


@pytest.mark.parametrize("track", [False, True])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_instancenorm_in_both_modes_with_and_without_running_statistics(track, mode):
    """conv 3->4 with bias -> InstanceNorm2d(4, track_running_stats=track).  torch normalizes by each sample's own
    channel statistics when ``training or not track_running_stats``: in training mode always, in eval mode only
    without running statistics.  Then each filter is its own gauge and the bias (constant over every set) is unused,
    and the reason names the 36 positions of each sample's channel.  In eval mode with running statistics it applies
    (z - running_mean) / sqrt(running_var + eps), an affine map whose coefficients do not move with W: weight and
    bias are read and neither is a gauge, and the reason says running statistics."""
    torch.manual_seed(0)
    model = Head(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.InstanceNorm2d(4, track_running_stats=track)), 4)
    res = census(model, batch=_img_batch(), mode=mode)
    if track and mode == "eval":
        why = "body.1 (InstanceNorm2d in eval mode: normalizes by its running statistics"
        _check(res, {"body.0.weight": ("not a gauge", "", why), "body.0.bias": ("not a gauge", "", why)})
        return
    why = "body.1 (InstanceNorm2d over 36 values: each sample's channel over its 36 positions"
    _check(res, {"body.0.weight": ("gauge", "rows: 4 blocks of 1", why), "body.0.bias": ("unused", "", why)})
    assert "running statistics" not in _row(res, "body.0.weight").reason


# ------------------------------------------------------------------------------------------------ weight norm
def test_weight_norm_parametrization():
    """parametrizations.weight_norm(Linear 4->6): weight = g * v / ||v|| with ||v|| per output row (dim 0).  v_r ->
    c v_r leaves v_r / ||v_r|| unchanged: each row of v (original1) is a gauge ("rows: 6 blocks of 1"); g
    (original0) sets each row's length: not a gauge; the bias neither (Salimans & Kingma 2016)."""
    torch.manual_seed(0)
    model = Head(nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(D_IN, WIDTH))), WIDTH)
    res = census(model, batch=_vec_batch())
    why = "weight normalization (parametrizations.weight_norm): weight = g · v/‖v‖, ‖v‖ over each of the 6 slices"
    _check(res, {"body.0.parametrizations.weight.original1": ("gauge", "rows: 6 blocks of 1", why)})


def test_weight_norm_legacy_hook():
    """The legacy torch.nn.utils.weight_norm hook (weight_g, weight_v; its computed ``weight`` attribute blocks a
    plain deepcopy): the same law, so weight_v's rows are gauges and weight_g is not; the user's module is intact."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch deprecates the hook; researchers still use it
        layer = nn.utils.weight_norm(nn.Linear(D_IN, WIDTH))
    model = Head(nn.Sequential(layer), WIDTH)
    before = layer.weight_v.detach().clone()
    res = census(model, batch=_vec_batch())
    _check(res, {"body.0.weight_v": ("gauge", "rows: 6 blocks of 1", "legacy utils.weight_norm hook")})
    assert torch.equal(layer.weight_v.detach(), before)


# ------------------------------------------------------------------------------------------------ attention
class QKNormAttention(nn.Module):
    """One causal self-attention layer with per-head RMSNorm on q and k (``fused``: one qkv projection), residual,
    then a linear head over 3 classes per token."""

    def __init__(self, d: int = 8, heads: int = 2, fused: bool = False) -> None:
        super().__init__()
        self.heads, self.hd, self.fused = heads, d // heads, fused
        if fused:
            self.qkv = nn.Linear(d, 3 * d, bias=False)
        else:
            self.q, self.k, self.v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.q_norm, self.k_norm = nn.RMSNorm(self.hd, eps=1e-6), nn.RMSNorm(self.hd, eps=1e-6)
        self.o = nn.Linear(d, d, bias=False)
        self.head = nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1) if self.fused else (self.q(x), self.k(x), self.v(x))
        q = self.q_norm(q.view(B, T, self.heads, self.hd)).transpose(1, 2)
        k = self.k_norm(k.view(B, T, self.heads, self.hd)).transpose(1, 2)
        v = v.view(B, T, self.heads, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
        return F.cross_entropy(self.head(x + self.o(a)).reshape(-1, CLASSES), y.reshape(-1))


def _seq_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(2, 5, 8, generator=g), torch.randint(0, CLASSES, (2, 5), generator=g)


def test_per_head_qk_norm():
    """q_norm normalizes each head's 4 entries of q = W_q x: the head's 4 rows of W_q are a gauge, one row alone is
    not (it changes the head's direction), and W_q as a whole (every head scaled) is a union of gauges; the same for
    W_k.  v, o and the head write the residual stream or the logits: not gauges."""
    torch.manual_seed(0)
    res = census(QKNormAttention(), batch=_seq_batch())
    _check(res, {"q.weight": ("gauge", "rows: 2 blocks of 4", "q_norm (RMSNorm over 4 values: the last dim"),
                 "k.weight": ("gauge", "rows: 2 blocks of 4", "k_norm (RMSNorm over 4 values: the last dim")})


def test_fused_qkv():
    """One projection qkv = W x (24 rows: q rows 0-7, k rows 8-15, v rows 16-23), q and k normalized per head: the
    4-row blocks of the q and k heads are gauges (4 blocks of 4 covering 16 of 24 rows), the v rows are not, so
    W as a whole is a partial gauge read by both q_norm and k_norm."""
    torch.manual_seed(0)
    res = census(QKNormAttention(fused=True), batch=_seq_batch())
    _check(res, {"qkv.weight": ("partial gauge", "rows: 4 blocks of 4 (covering 16 of 24)", "q_norm (RMSNorm")})
    assert "k_norm (RMSNorm over 4 values" in _row(res, "qkv.weight").reason
    assert [(b.start, b.stop) for b in _row(res, "qkv.weight").blocks] == [(0, 4), (4, 8), (8, 12), (12, 16)]
