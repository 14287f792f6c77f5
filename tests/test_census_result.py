"""What a census call hands back and what it says when it cannot start: the result reads as the command line's table
(``print``), as rows (``to_records``, ``to_dataframe``), and every cell of the table is whole; a model that returns
logits gets one line saying how to pass its loss."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gauge.census import CensusError, census, format_census

CLASSES = 3


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    return torch.randn(5, 4, generator=g), torch.randint(0, CLASSES, (5,), generator=g)


class Logits(nn.Module):
    """An ordinary classifier: forward(x) -> logits, the loss left to the training loop."""

    def __init__(self, targets_too: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6, bias=False)
        self.norm = nn.RMSNorm(6, eps=1e-6)
        self.head = nn.Linear(6, CLASSES)
        self.targets_too = targets_too

    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        if rest and not self.targets_too:
            raise AssertionError("the census must not call a forward that does not take the batch")
        return self.head(torch.tanh(self.norm(self.fc(x))))


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6, bias=False)
        self.head = nn.Linear(6, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(x))


def test_a_logits_model_with_a_batch_says_to_pass_loss_fn():
    """model(*batch) cannot take (x, y): one line, before any copy or forward, naming loss_fn and how to write it;
    a model that takes the batch but returns logits gets the same advice, with what it returned; the advice works."""
    with pytest.raises(CensusError, match=r"model\(\*batch\).*does not take this batch.*pass loss_fn instead, e\.g\. "
                                          r"census\(model, lambda m: F\.cross_entropy") as err:
        census(Plain(), batch=_batch())
    assert "\n" not in str(err.value)
    with pytest.raises(CensusError, match=r"\(a tensor of shape \(5, 3\)\) holds no scalar loss.*pass loss_fn") as err:
        census(Logits(targets_too=True), batch=_batch())
    assert "\n" not in str(err.value)
    x, y = _batch()
    torch.manual_seed(0)
    res = census(Logits(), lambda m: F.cross_entropy(m(x.double()), y))
    assert res.gauges == ["fc.weight"]


def test_the_result_prints_as_the_table_and_reads_as_rows():
    """str(result) is the command line's table; to_records has one flat dict per tensor with the table's columns;
    to_dataframe holds the same rows."""
    x, y = _batch()
    torch.manual_seed(0)
    res = census(Logits(), lambda m: F.cross_entropy(m(x.double()), y))
    assert str(res) == format_census(res) and str(res).startswith("gauge census of Logits")
    recs = res.to_records()
    assert [r["name"] for r in recs] == [t.name for t in res.tensors]
    fc = recs[0]
    assert (fc["status"], fc["partition"], fc["shape"], fc["n_blocks"]) == ("gauge", "whole tensor", (6, 4), 1)
    assert fc["own_eps"] == 1e-6 and fc["own_eps_output_change"] == res.tensors[0].eps.output_change
    assert recs[-1]["own_eps"] is None and recs[-1]["status"] == "not a gauge"
    pd = pytest.importorskip("pandas")
    df = res.to_dataframe()
    assert isinstance(df, pd.DataFrame) and list(df.columns) == list(recs[0]) and len(df) == len(recs)
    assert df["name"].tolist() == [r["name"] for r in recs] and df["status"].tolist() == [r["status"] for r in recs]


def test_to_dataframe_without_pandas_is_one_line(monkeypatch):
    x, y = _batch()
    torch.manual_seed(0)
    res = census(Logits(), lambda m: F.cross_entropy(m(x.double()), y), own_eps=False)
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(ImportError, match=r"to_dataframe needs pandas \(pip install pandas\); to_records\(\)") as err:
        res.to_dataframe()
    assert "\n" not in str(err.value)
    assert res.to_records()  # the rows themselves need nothing


class FusedQKV(nn.Module):
    """One projection qkv (24 rows: q 0-7, k 8-15, v 16-23), q and k normalized per head of 4: the 4 q and k heads'
    blocks are gauges, covering 16 of the 24 rows (test_census_families.test_fused_qkv derives it)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24, bias=False)
        self.q_norm, self.k_norm = nn.RMSNorm(4, eps=1e-6), nn.RMSNorm(4, eps=1e-6)
        self.o = nn.Linear(8, 8, bias=False)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = self.q_norm(q.view(B, T, 2, 4)).transpose(1, 2)
        k = self.k_norm(k.view(B, T, 2, 4)).transpose(1, 2)
        v = v.view(B, T, 2, 4).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
        return F.cross_entropy(self.head(x + self.o(a)).reshape(-1, CLASSES), y.reshape(-1))


def test_every_table_cell_is_whole_and_the_columns_stay_aligned():
    """A partition longer than its column ("rows: 4 blocks of 4 (covering 16 of 24)") is shown whole: the column
    widens, so every row of the table is as long as its header and no number is cut."""
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(0)
    res = census(FusedQKV(), batch=(torch.randn(2, 5, 8, generator=g), torch.randint(0, CLASSES, (2, 5), generator=g)))
    part = next(t for t in res.tensors if t.name == "qkv.weight").partition
    assert part == "rows: 4 blocks of 4 (covering 16 of 24)"
    for all_tensors in (False, True):
        lines = format_census(res, all_tensors=all_tensors).splitlines()
        hdr = next(ln for ln in lines if ln.lstrip().startswith("tensor "))
        rows = [ln for ln in lines if any(ln.startswith(f"  {t.name} ") for t in res.tensors)]
        assert rows and all(len(ln) == len(hdr) for ln in rows), "\n".join(lines)
        assert any(part in ln for ln in rows)
