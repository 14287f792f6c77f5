"""Checkpoints: everything a run needs to continue bit-for-bit, written all-or-nothing.

A checkpoint is one ``torch.save`` payload (a plain dict, loadable with ``weights_only=True``):

- ``model_kind`` (``"dense"`` / ``"grt"``) and ``model_config`` (the config dataclass as a dict,
  rebuilt with ``Config(**d)``), ``model`` (state dict), ``dtype``;
- ``optimizer`` (AdamW state dict: moments and step counts);
- ``rng``: the states of Python's ``random``, numpy's global generator, torch's CPU generator
  and every CUDA generator (the training data does not use them -- batches are a function of
  ``(seed, step)`` -- but anything the user adds that draws from them resumes exactly too);
- ``step`` / ``tokens_seen`` (the data position: batch ``step`` is drawn from ``(seed, step)``),
  ``train_config`` (dict) and ``extra`` (the loop's own running sums, so logged averages resume too).

Writes go through :func:`rmsgauge.atomic_write_bytes` (temp file in the same folder, fsync,
``os.replace``): a crash mid-write leaves the previous checkpoint intact.

**Checksum.**  ``ckpt.pt.sha256`` beside the checkpoint holds its sha256 (``sha256sum`` format) and
:func:`load_checkpoint` verifies it, so a flipped bit is an error that names the file, not a silently
different model.  The sidecar is written before the checkpoint is replaced and lists the new hash and,
until the replace is done, the previous one: a crash between the two renames leaves a pair that still
verifies.  A checkpoint without a sidecar (written before checksums existed) loads unverified.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import zipfile
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lm.dense import DenseConfig, DenseTransformer
from lm.errors import CheckpointError
from rmsgauge import atomic_write_bytes, reject_unknown_keys
from rmsgauge.atomic import sha256_bytes, sha256_file

CKPT_FORMAT = 1  # bump when the payload layout changes
CHECKSUM_SUFFIX = ".sha256"  # ckpt.pt -> ckpt.pt.sha256
MODEL_KINDS = ("dense", "grt")


def model_classes(kind: str) -> tuple[type, type]:
    """``(ConfigClass, ModelClass)`` for a model kind; the GRT is imported lazily (it is the heavier module)."""
    if kind == "dense":
        return DenseConfig, DenseTransformer
    if kind == "grt":
        try:
            from grt_model.config import GRTConfig
            from grt_model.model import GRT
        except ImportError as e:  # pragma: no cover - only before the GRT module exists
            raise RuntimeError(f"--model grt needs grt_model.config.GRTConfig and grt_model.model.GRT: {e}") from e
        return GRTConfig, GRT
    raise ValueError(f"model kind must be one of {', '.join(MODEL_KINDS)}; got {kind!r}")


def default_model_config(kind: str):
    """The CPU-sized preset for a model kind (what ``python -m lm.train --model KIND`` trains)."""
    if kind == "dense":
        # about 0.8M parameters: trains at a few thousand tokens/s on one CPU core
        return DenseConfig(d_model=128, n_heads=4, n_layers=4, d_ff=512, block_size=128)
    cfg_cls, _ = model_classes(kind)
    return cfg_cls.small() if hasattr(cfg_cls, "small") else cfg_cls()


def config_to_dict(cfg: Any) -> dict[str, Any]:
    if hasattr(cfg, "to_dict"):
        return dict(cfg.to_dict())
    if is_dataclass(cfg):
        return asdict(cfg)
    raise TypeError(f"model config must be a dataclass, got {type(cfg).__name__}")


def config_from_dict(kind: str, d: dict[str, Any]):
    """Rebuild a model config with ``Config(**d)``; unknown keys fail naming the allowed ones."""
    cfg_cls, _ = model_classes(kind)
    allowed = [f for f in getattr(cfg_cls, "__dataclass_fields__", {})]
    reject_unknown_keys(f"model config ({cfg_cls.__name__})", d, allowed)
    return cfg_cls(**d)


def build_model(kind: str, cfg) -> nn.Module:
    _, model_cls = model_classes(kind)
    return model_cls(cfg)


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model under DistributedDataParallel / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


# --------------------------------------------------------------------------------------------
# RNG states as plain data (weights_only=True can load them: tuples, ints, floats, tensors)
# --------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") and torch.cuda.is_available():
        cuda = state["cuda"][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


def _as_tuple(x: Any) -> Any:
    # random.setstate needs tuples all the way down; a round trip may hand back lists
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


# --------------------------------------------------------------------------------------------
# Save / load
# --------------------------------------------------------------------------------------------


def save_checkpoint(path: str | os.PathLike, *, model_kind: str, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None, train_config: dict[str, Any], step: int,
                    tokens_seen: int, extra: dict[str, Any] | None = None) -> Path:
    """Write the checkpoint atomically; returns the path."""
    bare = unwrap(model)
    first = next(bare.parameters(), None)
    payload = {
        "format": CKPT_FORMAT,
        "model_kind": model_kind,
        "model_config": config_to_dict(bare.config),
        "dtype": str(first.dtype).replace("torch.", "") if first is not None else "float32",
        "model": {k: v.detach().cpu() for k, v in bare.state_dict().items()},
        "optimizer": _to_cpu(optimizer.state_dict()) if optimizer is not None else None,
        "rng": rng_state(),
        "step": int(step),
        "tokens_seen": int(tokens_seen),
        "train_config": dict(train_config),
        "extra": dict(extra or {}),
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    return write_checksummed(path, buf.getvalue())


def checksum_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def _sidecar(digests: list[str], name: str) -> str:
    return "".join(f"{d}  {name}\n" for d in digests)


def read_checksums(path: str | os.PathLike) -> list[str] | None:
    """The sha256 digests the sidecar of ``path`` accepts, or None when there is no sidecar."""
    side = checksum_path(path)
    if not side.exists():
        return None
    try:
        digests = [ln.split()[0].lower() for ln in side.read_text().splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError, IndexError) as e:
        raise CheckpointError(f"{side}: unreadable checksum file ({e})") from None
    return digests


def write_checksummed(path: str | os.PathLike, data: bytes) -> Path:
    """Atomically write ``data`` to ``path`` with its sha256 in ``path.sha256`` (see the module docstring)."""
    path = Path(path)
    new = sha256_bytes(data)
    old: list[str] = []
    if path.is_file():  # the file being replaced must verify until the replace is done
        try:
            have = read_checksums(path)
        except CheckpointError:
            have = None
        old = [d for d in (have if have is not None else [sha256_file(path)]) if d != new][:1]
    atomic_write_bytes(checksum_path(path), _sidecar([new, *old], path.name).encode())
    atomic_write_bytes(path, data)
    if old:
        atomic_write_bytes(checksum_path(path), _sidecar([new], path.name).encode())
    return path


def read_verified(path: str | os.PathLike, what: str = "checkpoint") -> bytes:
    """The bytes of ``path``, checked against its sha256 sidecar when there is one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {path}" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    digests = read_checksums(path)
    if digests is not None and sha256_bytes(data) not in digests:
        raise CheckpointError(f"{path}: sha256 {sha256_bytes(data)[:16]}... does not match {checksum_path(path).name} "
                              f"({digests[0][:16]}...): the file is corrupt or was changed after it was written")
    return data


def torch_load_bytes(data: bytes, path: str | os.PathLike, map_location: str | torch.device = "cpu",
                     what: str = "checkpoint") -> Any:
    """``torch.load(weights_only=True)`` of in-memory bytes; any unreadable payload is one error naming ``path``."""
    try:
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError, KeyError, TypeError,
            AttributeError, IndexError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable {what} ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:160]})") from None


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read, checksum-verify and ``torch.load(weights_only=True)`` a checkpoint written by :func:`save_checkpoint`."""
    path = Path(path)
    ckpt = torch_load_bytes(read_verified(path), path, map_location)
    if not isinstance(ckpt, dict) or ckpt.get("format") != CKPT_FORMAT:
        raise CheckpointError(f"{path}: not an lm checkpoint of format {CKPT_FORMAT} "
                              f"(got format {ckpt.get('format') if isinstance(ckpt, dict) else type(ckpt).__name__})")
    missing = [k for k in ("model_kind", "model_config", "model", "step", "train_config") if k not in ckpt]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {missing}")
    return ckpt


def model_from_checkpoint(ckpt: dict[str, Any], device: str | torch.device = "cpu") -> nn.Module:
    """Rebuild the model (config via ``Config(**d)``) and load its weights, in the saved dtype."""
    kind = ckpt["model_kind"]
    cfg = config_from_dict(kind, ckpt["model_config"])
    model = build_model(kind, cfg).to(device=device, dtype=getattr(torch, ckpt.get("dtype", "float32")))
    try:
        model.load_state_dict(ckpt["model"])
    except (RuntimeError, KeyError) as e:
        raise CheckpointError(f"the weights do not fit a {kind} model of the stored config "
                              f"({' '.join(str(e).split())[:200]})") from None
    return model


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
