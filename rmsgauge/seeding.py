"""One seed function for ``random``, numpy and torch."""

from __future__ import annotations

import random

import numpy as np


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, numpy's global state and torch (CPU and CUDA)."""
    if not (0 <= int(seed) < 2**32):
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    seed = int(seed)
    random.seed(seed)
    np.random.seed(seed)
    try:
        import torch
    except ImportError:  # torch is a runtime dependency, but keep the core importable without it
        pass
    else:
        torch.manual_seed(seed)  # also seeds every CUDA device
