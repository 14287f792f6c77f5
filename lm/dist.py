"""One process or many (torchrun): the distributed context and the device."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False  # we called init_process_group, so we tear it down

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: str) -> DistContext:
        """Read torchrun's env (RANK, WORLD_SIZE, LOCAL_RANK); join the process group when WORLD_SIZE > 1."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
        dev = resolve_device(device, local if world > 1 else None)
        owns = world > 1 and not dist.is_initialized()
        if owns:
            if dev.type == "cuda":
                torch.cuda.set_device(dev)
            dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world)
        return cls(rank, world, local, dev, owns)

    def all_mean(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            x = x.clone()
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            x /= self.world
        return x

    def any_flags(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag OR-ed over the ranks, in one collective (every rank takes the same branch)."""
        if self.world == 1:
            return tuple(bool(f) for f in flags)
        t = torch.tensor([1.0 if f else 0.0 for f in flags], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return tuple(bool(v > 0) for v in t.tolist())

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def check_device(name: str, device: Any, kinds: tuple[str, ...] = ("auto", "cpu", "cuda")) -> str:
    """``device`` spelled as one of ``kinds`` or ``cuda:N``; else a one-line error naming ``name``."""
    if not isinstance(device, str) or not (device in kinds or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ValueError(f"{name} must be one of {', '.join(kinds)}, cuda:N; got {device!r}")
    return device


def resolve_device(device: str, local_rank: int | None = None, name: str = "train.device") -> torch.device:
    """The torch device ``device`` names on this machine (``auto``: CUDA when present; ``cuda`` under torchrun: the
    rank's own GPU); CUDA named where there is none is a one-line error naming ``name``."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"{name} {device} but CUDA is not available on this machine; use --device cpu")
        if device == "cuda" and local_rank is not None:
            device = f"cuda:{local_rank}"
    return torch.device(device)
