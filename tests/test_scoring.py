"""lm.scoring.full_split_bpb: every validation byte after the first scored exactly once, equal to an explicit
per-window loop; the shipped model cards lead with the number it measures."""

from __future__ import annotations

import math

import numpy as np
import torch

from lm.dense import DenseConfig, DenseTransformer
from lm.reference import load_reference
from lm.scoring import full_split_bpb
from rmsgauge import seed_everything, tolerance
from rmsgauge.corpus import ByteCorpus


def test_every_byte_is_scored_once_and_equals_an_explicit_loop():
    seed_everything(0)
    model = DenseTransformer(DenseConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, block_size=8)).double()
    rng = np.random.default_rng(0)
    corpus = ByteCorpus(rng.integers(0, 256, 1000, dtype=np.uint8), val_fraction=0.1)
    val = torch.as_tensor(corpus.split("val").astype(np.int64))  # 100 bytes: 12 windows of 8 + a tail of 4
    got = full_split_bpb(model, corpus, batch_windows=5)
    assert got["bytes_scored"] == len(val) - 1
    nll, n = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(val) - 1, 8):  # consecutive windows, each predicting its own bytes
            w = val[start:start + 9]
            logp = torch.log_softmax(model(w[None, :-1])[0][0], dim=-1)
            nll -= float(logp.gather(1, w[1:, None]).sum())
            n += len(w) - 1
    assert n == len(val) - 1
    ref = nll / n / math.log(2)
    assert tolerance("float64", size=n).holds(got["bpb"] - ref, ref), (got, ref)


def test_shipped_dense_card_states_its_whole_split_bpb():
    model = load_reference("dense")
    card = model.reference_card
    got = full_split_bpb(model, ByteCorpus.load())["bpb"]
    assert tolerance("float32", size=115_135).holds(got - card["final_val_bpb_full"], got), (got, card)
    assert card["final_val_bpb_full"] > card["final_val_bpb"]  # the 16-batch sample reads optimistic here
