r"""Bits per byte on the **whole validation split**, every byte scored once (the loop's ``val_bpb`` is a sample of
``eval_batches`` random batches).  Consecutive windows of ``block_size + 1`` bytes overlap by one, plus the last
partial window; the sum is in float64:

.. math:: \text{bpb} = \frac{1}{N \ln 2}\sum_{t=1}^{N} -\ln p(x_t \mid x_{\text{window}, <t}).

With a BPE corpus (:class:`lm.bpe.TokenCorpus`) the windows are of tokens and :math:`N` is the bytes the scored
tokens stand for, so BPE and byte-level models compare in one unit.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rmsgauge.corpus import ByteCorpus


def full_split_bpb(model: nn.Module, corpus: ByteCorpus, batch_windows: int = 64) -> dict[str, Any]:
    """``{"bpb", "bytes_scored", "windows"}``; ``batch_windows`` windows per forward pass."""
    val = torch.as_tensor(corpus.split("val").astype("int64"))
    per_token = getattr(corpus, "token_bytes", None)  # bytes each token id stands for (BPE); bytes: 1
    width = torch.ones(int(val.max()) + 1, dtype=torch.int64) if per_token is None else torch.as_tensor(per_token)
    T = int(model.config.block_size)
    n_win = (len(val) - 1) // T
    if n_win < 1:
        raise ValueError(f"the validation split ({len(val)} bytes) is shorter than one window of {T + 1} bytes")
    windows = [val[i * T:(i + 1) * T + 1] for i in range(n_win)]
    tail = val[n_win * T:]  # the last partial window: its bytes are scored too
    batches = [torch.stack(windows[i:i + batch_windows]) for i in range(0, n_win, batch_windows)]
    batches += [tail[None]] if len(tail) > 1 else []
    nll, count = torch.zeros((), dtype=torch.float64), 0
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            for w in batches:  # (b, t + 1)
                logits, _ = model(w[:, :-1])  # (b, t, V)
                nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), w[:, 1:].reshape(-1),
                                       reduction="sum")
                count += int(width[w[:, 1:]].sum())
    finally:
        model.train(was)
    return {"bpb": float(nll) / count / math.log(2), "bytes_scored": count, "windows": n_win + (len(tail) > 1)}
