"""gauge.census finds the eps wherever the model keeps it: a norm class of any name, a functional norm inside a plain
module, a hand-written one whose eps is an attribute of any name; and an eps it cannot place is reported as kept,
never judged silently at eps = 0.

Each docstring derives the gauges from the model's code.  Notation as in test_census_families: z = W x, a norm
divides each set of z by a statistic of that set, so scaling all of W by c > 0 changes nothing at eps = 0."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gauge.census import census, format_census
from rmsgauge import tolerance

N, D_IN, WIDTH, CLASSES, EPS = 5, 4, 6, 3, 1e-5


class Net(nn.Module):
    """``fc`` (4 -> 6, no bias) -> ``norm`` -> tanh -> linear head -> cross-entropy."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.fc = nn.Linear(D_IN, WIDTH, bias=False)
        self.norm = norm
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(torch.tanh(self.norm(self.fc(x)))), y)


class RMS(nn.Module):
    """A user's RMSNorm under its own name: gain * z / sqrt(mean(z^2) + eps)."""

    def __init__(self, width: int, eps: float = EPS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.weight * z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + self.eps)


class Scale(nn.Module):
    """The same arithmetic in a class whose name says nothing, its eps in an attribute named ``e``."""

    def __init__(self) -> None:
        super().__init__()
        self.e = EPS

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + self.e)


class LiteralNorm(nn.Module):
    """A norm class by name whose eps is a literal in its forward, in no attribute."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6)


class Squash(nn.Module):
    """z / sqrt(mean(z^2) + 1): the 1 is part of the function (it saturates small inputs), not an eps."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1.0)


class Einsum(nn.Module):
    """An RMSNorm whose mean square comes from einsum, a form the census does not recognise: its ``eps`` is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.eps = EPS

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        ms = torch.einsum("...i,...i->...", z, z).unsqueeze(-1) / z.shape[-1]
        return z * torch.rsqrt(ms + self.eps)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, D_IN, generator=g), torch.randint(0, CLASSES, (N,), generator=g)


def _row(res, name: str):
    return next(t for t in res.tensors if t.name == name)


def test_an_rmsnorm_class_named_rms_is_a_norm_with_its_eps():
    """RMS reads all six entries of z = W x: W -> cW scales z and its root mean square by c, so at eps = 0 W is a
    whole-tensor gauge (one row alone changes the set's shape); the gain and the head are not.  The census sets the
    class's own ``eps`` to 0 for the verdict and reports the deviation at eps = 1e-5 beside the exact law."""
    torch.manual_seed(0)
    res = census(Net(RMS(WIDTH)), batch=_batch())
    w = _row(res, "fc.weight")
    assert (w.status, w.partition) == ("gauge", "whole tensor"), format_census(res, all_tensors=True)
    assert "norm (RMS over 6 values: the last dim, eps=1e-05)" in w.reason
    assert w.loss_change <= res.tolerance and res.eps_zeroed == {"norm": EPS} and not res.eps_kept
    assert abs(w.eps.output_change - w.eps.output_law) <= tolerance("float64", size=WIDTH,
                                                                    scale=math.sqrt(WIDTH)).bound(0.0)
    assert {t.name for t in res.tensors if t.status != "not a gauge"} == {"fc.weight"}


class PerHead(nn.Module):
    """q = W_q x viewed as 2 heads of 3, each head normalized by a functional norm (``kind``) inside this plain
    module (class name without Norm); the heads, flattened, go through tanh to the head."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.q = nn.Linear(D_IN, WIDTH, bias=False)
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x).view(x.shape[0], 2, WIDTH // 2)
        norm = F.rms_norm if self.kind == "rms" else F.layer_norm
        return norm(q, (WIDTH // 2,), eps=EPS).reshape(x.shape[0], WIDTH)


class Wrapper(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.attn = PerHead(kind)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(torch.tanh(self.attn(x))), y)


@pytest.mark.parametrize(("kind", "fn", "what"), [("rms", "F.rms_norm", "the last dim"),
                                                  ("layer", "F.layer_norm", "the last dim, centred, no bias")])
def test_a_functional_norm_inside_a_plain_module(kind, fn, what):
    """Each head's 3 entries of q = W_q x form one normalized set (RMS: divided by their root mean square; layer:
    centred, then divided by their standard deviation): scaling one head's 3 rows of W_q by c scales that set, which
    the norm removes at eps = 0, so each 3-row block is a gauge ("rows: 2 blocks of 3"); one row alone changes its
    set's shape.  The eps (1e-5) is an argument of the functional call: the census sets it to 0 for the verdict,
    names the call as the reason, and lists it among the eps it set to 0."""
    torch.manual_seed(0)
    res = census(Wrapper(kind), batch=_batch())
    q = _row(res, "attn.q.weight")
    assert (q.status, q.partition) == ("gauge", "rows: 2 blocks of 3"), format_census(res, all_tensors=True)
    assert f"attn (PerHead's {fn} over 3 values: {what}, eps=1e-05)" in q.reason
    assert res.eps_zeroed == {f"attn: {fn}": EPS} and not res.eps_kept
    assert all(b.loss_change <= res.tolerance for b in q.blocks)
    assert q.eps.eps == EPS and q.eps.loss_change > res.tolerance  # at the model's own eps the gauge is approximate
    assert any(f"attn: {fn} (eps 1e-05)" in n for n in res.notes)


@pytest.mark.parametrize(("norm", "eps", "why"), [
    (Scale(), EPS, "norm (Scale's rsqrt(mean(x²) + eps) over 6 values: the last dim, eps=1e-05)"),
    (LiteralNorm(), 1e-6, "norm (LiteralNorm over 6 values: the last dim, eps=1e-06)"),
])
def test_a_hand_written_norm_wherever_its_eps_is(norm, eps, why):
    """Scale computes z / sqrt(mean(z^2) + e), e an attribute not named eps; LiteralNorm the same with a literal
    1e-6: W is a whole-tensor gauge at eps = 0 (as for RMS above).  The census finds the constant added to the mean
    square before the root and drops it; LiteralNorm, a norm by its name, is the reader, with the eps found."""
    torch.manual_seed(0)
    res = census(Net(norm), batch=_batch())
    w = _row(res, "fc.weight")
    assert (w.status, w.partition) == ("gauge", "whole tensor"), format_census(res, all_tensors=True)
    assert why in w.reason and w.loss_change <= res.tolerance
    assert res.eps_zeroed == {"norm: rsqrt(mean(x²) + eps)": eps} and w.eps.eps == eps


def test_a_constant_that_is_part_of_the_function_stays():
    """Squash adds 1 to the mean square: W -> cW changes z / sqrt(mean z^2 + 1) for every c (the constant does not
    scale), so W is no gauge, and the census must not drop the 1 (it would turn Squash into an RMSNorm)."""
    torch.manual_seed(0)
    res = census(Net(Squash()), batch=_batch())
    assert {t.status for t in res.tensors} == {"not a gauge"} and not res.eps_zeroed


def test_an_eps_the_census_cannot_place_is_kept_and_said():
    """Einsum is an RMSNorm whose eps the census cannot find in the arithmetic: it keeps eps = 1e-5, and at that eps
    W's scalings change the loss, so W is not a gauge; the table says which eps was kept (header, note, and the
    reason of the weight that feeds it) instead of presenting the verdict as one at eps = 0."""
    torch.manual_seed(0)
    res = census(Net(Einsum()), batch=_batch())
    table = format_census(res)
    assert res.eps_kept == {"norm.eps": EPS}
    assert "exact gauges at eps = 0 except through the eps kept below" in table.splitlines()[0]
    assert any("eps kept" in n and "norm.eps = 1e-05" in n for n in res.notes)
    w = _row(res, "fc.weight")
    assert w.status == "not a gauge" and "norm (Einsum keeps eps = 1e-05" in w.reason and "why: " in table


def test_the_census_leaves_no_hook_on_a_model_it_converts():
    """inplace=True converts the caller's model itself: the forward hooks the census needs are gone afterwards."""
    torch.manual_seed(0)
    model = Wrapper("rms")
    census(model, batch=_batch(), inplace=True, own_eps=False)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
