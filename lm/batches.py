"""Batches as a function of ``(seed, stream, index)`` alone: the same bytes on every rank and after a resume."""

from __future__ import annotations

import numpy as np
import torch

from rmsgauge.corpus import ByteCorpus

TRAIN_STREAM, VAL_STREAM, PROBE_STREAM = 0, 1, 2  # independent seed streams for the three kinds of batch


def _generator(seed: int, stream: int, index: int) -> torch.Generator:
    # SeedSequence mixes (seed, stream, index) into a well-spread 32-bit seed: neighbouring steps
    # get unrelated streams, and the mapping is fixed across numpy versions (NEP 19).
    state = int(np.random.SeedSequence([seed, stream, index]).generate_state(1)[0])
    return torch.Generator().manual_seed(state)


class BatchSampler:
    """Random windows of ``block_size + 1`` bytes inside one split.  ``train_batch(step)`` draws the global batch's
    starts from ``(seed, step)`` and returns this rank's contiguous shard: the same batch whatever the world size."""

    def __init__(self, corpus: ByteCorpus, block_size: int, global_batch: int, seed: int, rank: int = 0,
                 world: int = 1, device: torch.device | str = "cpu") -> None:
        self.T, self.B, self.seed, self.rank, self.world = block_size, global_batch, seed, rank, world
        self.b = global_batch // world  # this rank's share
        self.device = torch.device(device)
        self.splits = {name: torch.from_numpy(corpus.split(name).copy()) for name in ("train", "val")}  # uint8
        for name, data in self.splits.items():
            if len(data) < block_size + 2:
                raise ValueError(
                    f"the {name} split has {len(data)} bytes, fewer than model.block_size + 2 = {block_size + 2}; "
                    f"use a larger corpus, a smaller model.block_size, or a different train.val_fraction")
        self._arange = torch.arange(block_size + 1)

    def _windows(self, split: str, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = starts.unsqueeze(1) + self._arange.unsqueeze(0)  # (b, T+1)
        chunk = self.splits[split][idx].long()
        return chunk[:, :-1].to(self.device), chunk[:, 1:].to(self.device)  # (b, T) each

    def _starts(self, split: str, stream: int, index: int, n: int) -> torch.Tensor:
        high = len(self.splits[split]) - self.T  # start <= N - T - 1: the target window ends inside the split
        return torch.randint(0, high, (n,), generator=_generator(self.seed, stream, index))

    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self._starts("train", TRAIN_STREAM, step, self.B)  # (B,) the global batch
        return self._windows("train", starts[self.rank * self.b:(self.rank + 1) * self.b])

    def val_batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self._starts("val", VAL_STREAM, i, self.B)
        return self._windows("val", starts[self.rank * self.b:(self.rank + 1) * self.b])

    def probe_batch(self, n: int = 2, t: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self._starts("val", PROBE_STREAM, 0, n)
        idx = starts.unsqueeze(1) + torch.arange(min(t, self.T) + 1).unsqueeze(0)
        chunk = self.splits["val"][idx].long()
        return chunk[:, :-1], chunk[:, 1:]
